"""Context-parallel sharding of one packed sequence of documents over ``cp_size`` ranks.

With causal attention masked per document, a query at position p of its document attends to p + 1
keys, so the cost lives inside each document. The usual *per-sequence* split cuts the packed
sequence into 2 x CP chunks and gives rank i chunk i and its mirror 2CP-1-i: that balances one long
causal sequence but not a pack of many documents. *Per-document* sharding (as in WLB-LLM) cuts every
document into 2 x CP chunks and gives each rank a head/tail pair of every document; the remainder
tokens of a document (its length mod 2 x CP) are dealt to ranks in turn, without padding.

Tiny chunks run attention kernels inefficiently: a kernel processes queries in tiles of
``tile_tokens`` rows and pays a fixed cost per piece. ``AttentionCostModel`` charges for both, and
``cp_shard(..., method="auto")`` picks, per batch, the sharding whose most loaded rank is cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.mitigate._errors import check_positive_int, error

CP_METHODS = ("auto", "per-document", "per-sequence")


@dataclass(kw_only=True, slots=True, frozen=True)
class AttentionCostModel:
    """Predicted attention work of a piece of a document, in query-key pairs.

    A piece of ``n`` query rows costs its causal pairs scaled by the tile round-up
    (ceil(n / tile) * tile / n) plus ``piece_overhead_pairs`` (launch and set-up, in pair units).
    """

    tile_tokens: int = 128
    piece_overhead_pairs: float = 128.0 * 128.0

    def piece_costs(self, rel_start: np.ndarray, rel_end: np.ndarray) -> np.ndarray:
        """Cost of pieces [rel_start, rel_end) of documents (positions relative to the document start)."""
        s = rel_start.astype(np.float64)
        e = rel_end.astype(np.float64)
        rows = e - s
        pairs = 0.5 * (e * (e + 1) - s * (s + 1))
        tiles = np.ceil(rows / self.tile_tokens) * self.tile_tokens
        scale = np.divide(tiles, rows, out=np.ones_like(rows), where=rows > 0)
        return np.where(rows > 0, pairs * scale + self.piece_overhead_pairs, 0.0)


@dataclass(kw_only=True, slots=True)
class CPShard:
    """Each CP rank's token ranges [start, end) in the packed sequence and its predicted attention cost."""

    method: str
    cp_size: int
    ranges: list[list[tuple[int, int]]]
    costs: np.ndarray  # predicted attention cost per rank (query-key pairs, AttentionCostModel)
    tokens: np.ndarray  # tokens per rank
    alternatives: dict[str, np.ndarray] = field(default_factory=dict)  # per-rank costs of each method

    @property
    def imbalance(self) -> float:
        mean = float(self.costs.mean()) if len(self.costs) else 0.0
        return float(self.costs.max() / mean) if mean > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "cp_size": self.cp_size, "imbalance": self.imbalance,
                "ranges": [[list(r) for r in rr] for rr in self.ranges], "costs": self.costs.tolist(),
                "tokens": self.tokens.tolist(),
                "alternatives": {k: v.tolist() for k, v in self.alternatives.items()}}


def _pieces(doc_lengths: np.ndarray, cuts: np.ndarray, cut_rank: np.ndarray, model: AttentionCostModel
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split the packed sequence at document boundaries and at ``cuts`` (chunk starts, global positions,
    chunk c owned by ``cut_rank[c]``). Returns piece start, end, rank and cost (pieces in order)."""
    n = int(doc_lengths.sum())
    doc_start = np.concatenate([[0], np.cumsum(doc_lengths)[:-1]]).astype(np.int64)
    points = np.unique(np.concatenate([doc_start, cuts, [n]]))
    start, end = points[:-1], points[1:]
    doc = np.searchsorted(doc_start, start, side="right") - 1
    # several empty documents may share a start; searchsorted picks the last, which is the non-empty one
    chunk = np.searchsorted(cuts, start, side="right") - 1
    rank = cut_rank[chunk]
    rel0 = start - doc_start[doc]
    cost = model.piece_costs(rel0, rel0 + (end - start))
    return start, end, rank, cost


def _per_sequence_cuts(n: int, cp: int) -> tuple[np.ndarray, np.ndarray]:
    c = np.arange(2 * cp)
    cuts = (c * n) // (2 * cp)
    return cuts.astype(np.int64), np.where(c < cp, c, 2 * cp - 1 - c)


def _per_document_cuts(doc_lengths: np.ndarray, cp: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunk starts of every document's 2 x CP chunks (head of rank i = chunk i, tail = chunk 2CP-1-i).

    The ``d mod 2CP`` remainder tokens of a document go one per rank, starting where the previous
    document's remainder stopped (a rank that gets two takes one in its head and one in its tail)."""
    d = doc_lengths.astype(np.int64)
    two = 2 * cp
    q, r = np.divmod(d, two)
    offset = np.concatenate([[0], np.cumsum(r)[:-1]]) % cp
    ranks = np.arange(cp)
    pos = (ranks[None, :] - offset[:, None]) % cp  # place of rank i in the dealing order
    extra = np.where(pos < r[:, None], (r[:, None] - pos - 1) // cp + 1, 0)  # 0, 1 or 2 per (doc, rank)
    head = q[:, None] + (extra >= 1)
    tail = q[:, None] + (extra >= 2)
    sizes = np.concatenate([head, tail[:, ::-1]], axis=1)  # chunk c < cp: rank c; c >= cp: rank 2cp-1-c
    doc_start = np.concatenate([[0], np.cumsum(d)[:-1]])
    starts = doc_start[:, None] + np.concatenate([np.zeros((len(d), 1), dtype=np.int64),
                                                  np.cumsum(sizes, axis=1)[:, :-1]], axis=1)
    c = np.arange(two)
    owner = np.broadcast_to(np.where(c < cp, c, two - 1 - c), starts.shape)
    keep = sizes > 0
    return starts[keep], owner[keep]


def _shard(doc_lengths: np.ndarray, cp: int, method: str, model: AttentionCostModel
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = int(doc_lengths.sum())
    if method == "per-sequence":
        cuts, owner = _per_sequence_cuts(n, cp)
    else:
        cuts, owner = _per_document_cuts(doc_lengths, cp)
        if len(cuts) == 0:
            cuts, owner = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    order = np.argsort(cuts, kind="stable")
    cuts, owner = cuts[order], owner[order]
    # drop duplicate cut positions (empty chunks), keeping the last owner of each position
    last = np.r_[cuts[1:] != cuts[:-1], True]
    cuts, owner = cuts[last], owner[last]
    start, end, rank, cost = _pieces(doc_lengths, cuts, owner, model)
    costs = np.bincount(rank, weights=cost, minlength=cp)
    tokens = np.bincount(rank, weights=end - start, minlength=cp).astype(np.int64)
    return start, end, rank, costs, tokens


def _ranges(start: np.ndarray, end: np.ndarray, rank: np.ndarray, cp: int) -> list[list[tuple[int, int]]]:
    out: list[list[tuple[int, int]]] = []
    for i in range(cp):
        sel = rank == i
        s, e = start[sel], end[sel]
        if len(s) == 0:
            out.append([])
            continue
        # merge touching pieces into one range
        brk = np.flatnonzero(s[1:] != e[:-1]) + 1
        rs = s[np.r_[0, brk]]
        re_ = e[np.r_[brk - 1, len(e) - 1]]
        out.append(list(zip(rs.tolist(), re_.tolist(), strict=True)))
    return out


def cp_shard(doc_lengths: Any, cp_size: int, method: str = "auto", *,
             model: AttentionCostModel | None = None) -> CPShard:
    """Shard a packed sequence of documents (``doc_lengths`` in order) over ``cp_size`` CP ranks.

    ``method``: ``per-document``, ``per-sequence`` or ``auto`` (the one whose most loaded rank is
    predicted cheaper by ``model``; ties go to per-sequence). Returns each rank's token ranges and
    predicted attention cost.
    """
    if method not in CP_METHODS:
        raise error(f"cp_shard: method {method!r} not known (choose from {', '.join(CP_METHODS)})")
    cp = check_positive_int(cp_size, "cp_size")
    d = np.asarray(doc_lengths)
    if d.ndim != 1 or (len(d) and d.dtype.kind not in "iu"):
        raise error("cp_shard: doc_lengths must be a flat sequence of integers")
    d = d.astype(np.int64)
    if len(d) and d.min() < 0:
        raise error("cp_shard: document lengths must be >= 0")
    model = AttentionCostModel() if model is None else model
    if int(d.sum()) == 0:
        z = np.zeros(cp)
        return CPShard(method="per-sequence" if method == "auto" else method, cp_size=cp,
                       ranges=[[] for _ in range(cp)], costs=z, tokens=z.astype(np.int64))
    results = {m: _shard(d, cp, m, model) for m in (("per-sequence", "per-document") if method == "auto"
                                                     else (method,))}
    if method == "auto":
        seq_max = results["per-sequence"][3].max()
        doc_max = results["per-document"][3].max()
        method = "per-document" if doc_max < seq_max else "per-sequence"
    start, end, rank, costs, tokens = results[method]
    return CPShard(method=method, cp_size=cp, ranges=_ranges(start, end, rank, cp), costs=costs, tokens=tokens,
                   alternatives={m: r[3] for m, r in results.items()})


__all__ = ["CP_METHODS", "AttentionCostModel", "CPShard", "cp_shard"]
