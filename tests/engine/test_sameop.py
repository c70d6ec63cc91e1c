"""The pools of "the same op" (``engine/sameop.py``) and what they do to the what-ifs on real traces."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from laggard.engine.sameop import same_op_codes
from laggard.errors import LaggardWarning
from laggard.io import load_job
from laggard.whatif.core import analyze

CORPUS = Path(__file__).parents[1] / "data" / "corpus"


def _codes(rows: list[tuple[int, int, int, int]]) -> list[int]:
    """rows: (name, rank, step, microbatch), in start order."""
    a = np.array(rows, dtype=np.int64)
    codes, n = same_op_codes(a[:, 0], a[:, 1], a[:, 2], a[:, 3], np.zeros(len(a), dtype=np.int64),
                             np.arange(len(a), dtype=np.int64))
    assert n == len(set(codes.tolist()))
    return codes.tolist()


def test_a_type_split_alike_everywhere_is_one_pool_per_span() -> None:
    # type 0 twice in every (rank, step): its first spans and its second spans are two pools
    rows = [(0, r, s, 0) for r in range(2) for s in range(2) for _ in range(2)]
    c = _codes(rows)
    firsts, seconds = {c[i] for i in range(0, 8, 2)}, {c[i] for i in range(1, 8, 2)}
    assert len(firsts) == 1 and len(seconds) == 1 and firsts != seconds


def test_a_type_once_per_microbatch_or_split_unevenly_stays_one_pool() -> None:
    once = [(0, r, s, m) for r in range(2) for s in range(2) for m in range(4)]  # one op per microbatch
    assert len(set(_codes(once))) == 1
    uneven = [(1, 0, 0, 0), (1, 0, 0, 0), (1, 1, 0, 0), (1, 1, 0, 0), (1, 1, 0, 0)]  # 2 spans here, 3 there
    assert len(set(_codes(uneven))) == 1
    mixed = _codes([(0, 0, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0)])
    assert mixed[0] != mixed[2] and mixed[1] != mixed[3] and len(set(mixed)) == 5


def _analysis(job: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = analyze(load_job(CORPUS / job / "trace"))
    return res, json.loads((CORPUS / job / "truth.json").read_text())


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch):
    """The type as one pool, as before the spans had their own (the wrong answer the checks must catch)."""
    import importlib

    baseline = importlib.import_module("laggard.engine.baseline")

    def by_name(name_code, *_a):  # noqa: ANN001, ANN002, ANN202
        return name_code, int(name_code.max()) + 1

    monkeypatch.setattr(baseline, "same_op_codes", by_name)


def _clean_dp_ranks_read_the_job(res) -> bool:  # noqa: ANN001
    return all(abs(v - res.slowdown) < 0.03 for v in res.by_dp_rank.values())


def _slowed_rank_stands_out(res, target: int) -> bool:  # noqa: ANN001
    sw = {w["rank"]: w["slowdown"] for w in res.by_worker}
    return max(sw, key=sw.get) == target and sw[target] - max(v for r, v in sw.items() if r != target) > 0.05


def test_a_ddp_backward_cut_at_its_all_reduce_is_two_ops() -> None:
    """Real `laggard run` traces of a DDP MLP (4 gloo ranks): in the clean twin no DP rank alone is
    slower than the job (each S_dp within 0.03 of S); with rank 1's device 1.35x, S_w ranks rank 1
    worst by more than 0.05. Both held only with each backward span its own pool."""
    res, truth = _analysis("gz60_ddp_mlp_01_clean")
    assert truth["kind"] == "none" and _clean_dp_ranks_read_the_job(res), (res.slowdown, res.by_dp_rank)
    res, truth = _analysis("gz60_ddp_mlp_01_device")
    assert truth["kind"] == "device" and truth["targets"] == [1]
    assert _slowed_rank_stands_out(res, 1), res.by_worker


def test_the_checks_fail_with_the_type_as_one_pool(pooled) -> None:  # noqa: ANN001
    res, _ = _analysis("gz60_ddp_mlp_01_clean")
    assert not _clean_dp_ranks_read_the_job(res), res.by_dp_rank
    res, _ = _analysis("gz60_ddp_mlp_01_device")
    assert not _slowed_rank_stands_out(res, 1), res.by_worker


def test_nth_in_group_counts_the_ops_of_its_group_that_started_before_it() -> None:
    from laggard.engine.sameop import nth_in_group

    rng = np.random.default_rng(7)
    n = 400
    rank, step, name, start = (rng.integers(0, k, n) for k in (3, 2, 4, 30))  # ties in start too
    nth = nth_in_group(rank, step, name, start=start)
    for i in range(n):  # by its definition: earlier start, or the same start and an earlier row
        same = (rank == rank[i]) & (step == step[i]) & (name == name[i])
        before = (start < start[i]) | ((start == start[i]) & (np.arange(n) < i))
        assert nth[i] == int((same & before).sum())
