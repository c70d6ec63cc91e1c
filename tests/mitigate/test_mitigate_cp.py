"""Context-parallel sharding: every token once, no padding, balanced attention per rank."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.errors import LaggardError
from laggard.mitigate import AttentionCostModel, cp_shard

pytestmark = pytest.mark.timeout(60)


def _coverage(shard, total):
    cov = np.zeros(total, dtype=np.int64)
    for rr in shard.ranges:
        for a, b in rr:
            assert a < b
            cov[a:b] += 1
    return cov


def _pairs_per_rank(doc_lengths, shard):
    """Causal pairs per rank counted token by token (no tile model)."""
    starts = np.concatenate([[0], np.cumsum(doc_lengths)[:-1]])
    owner = np.repeat(np.arange(len(doc_lengths)), doc_lengths)
    keys = np.arange(int(np.sum(doc_lengths))) - starts[owner] + 1
    out = []
    for rr in shard.ranges:
        out.append(sum(int(keys[a:b].sum()) for a, b in rr))
    return np.array(out)


@pytest.mark.parametrize("method", ["per-document", "per-sequence", "auto"])
@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_every_token_exactly_once(method, cp):
    rng = np.random.default_rng(cp)
    for _ in range(10):
        docs = rng.integers(0, 3000, rng.integers(1, 20))
        if docs.sum() == 0:
            docs[0] = 5
        s = cp_shard(docs, cp, method)
        assert (_coverage(s, int(docs.sum())) == 1).all()
        assert s.tokens.sum() == docs.sum()
        assert len(s.ranges) == cp and len(s.costs) == cp
        assert s.method in ("per-document", "per-sequence")


def test_per_document_balances_a_pack_and_per_sequence_does_not():
    docs = [8192, 512, 512, 4096, 16384, 1024, 256]
    seq = cp_shard(docs, 4, "per-sequence")
    doc = cp_shard(docs, 4, "per-document")
    pairs_seq = _pairs_per_rank(docs, seq)
    pairs_doc = _pairs_per_rank(docs, doc)
    assert pairs_seq.max() / pairs_seq.mean() > 1.3
    assert pairs_doc.max() / pairs_doc.mean() < 1.01
    assert doc.imbalance < 1.01 < 1.3 < seq.imbalance
    # remainders are dealt without padding: token counts differ by at most the number of documents
    assert doc.tokens.max() - doc.tokens.min() <= len(docs)


def test_per_sequence_balances_one_causal_sequence():
    s = cp_shard([4096], 4, "per-sequence")
    assert s.imbalance < 1.01
    assert s.ranges[0] == [(0, 512), (3584, 4096)]


def test_cost_model_counts_pairs_and_tiles():
    m = AttentionCostModel(tile_tokens=1, piece_overhead_pairs=0.0)
    s = cp_shard([10, 7, 100], 2, "per-document", model=m)
    np.testing.assert_allclose(s.costs, _pairs_per_rank([10, 7, 100], s))
    # with tiles, a piece of 3 rows pays for 128
    m128 = AttentionCostModel(tile_tokens=128, piece_overhead_pairs=0.0)
    c = m128.piece_costs(np.array([0]), np.array([3]))
    assert c[0] == pytest.approx(6 * 128 / 3)


def test_auto_chooses_per_sequence_for_tiny_documents_and_per_document_for_long_ones():
    tiny = [40] * 200
    assert cp_shard(tiny, 8, "auto").method == "per-sequence"
    long = [60000, 2000, 2000, 1000, 30000]
    a = cp_shard(long, 4, "auto")
    assert a.method == "per-document"
    assert set(a.alternatives) == {"per-sequence", "per-document"}
    assert a.costs.max() <= min(v.max() for v in a.alternatives.values())


def test_empty_documents_and_errors():
    s = cp_shard([0, 5, 0, 3, 0], 2, "per-document")
    assert (_coverage(s, 8) == 1).all()
    z = cp_shard([0, 0], 2)
    assert z.ranges == [[], []]
    with pytest.raises(LaggardError):
        cp_shard([1, 2], 0)
    with pytest.raises(LaggardError):
        cp_shard([1, -2], 2)
    with pytest.raises(LaggardError):
        cp_shard([1, 2], 2, "per-token")
