"""What each forward and backward pass of a microbatch should cost (``mb_expected``: the fitted cost
of its sequences, else the other DP ranks' same pass), and each worker's time over that cost
(``per_microbatch``), read by the ``worker`` detector (``laggard.diagnose.worker``): sequence
imbalance moves a DP rank's passes with what they hold, a slow worker moves all of them."""

from __future__ import annotations

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, compact, fast_peer_ref, group_median, peer_median


def mb_expected(ctx: Ctx) -> tuple[np.ndarray, np.ndarray] | None:
    """The forward and backward passes with a microbatch (op indices) and what each should cost: the
    fitted cost of its sequences where the trace has their lengths (a*sum(len^2) + b*sum(len) + c
    per stage and op type), else the median of the same (step, stage, op type, microbatch) on the
    other DP ranks (passes with no such peer are left out). None when there are none (or none has a
    peer). Computed once
    per job (``ctx.memo``)."""
    if "worker.mb_expected" not in ctx.memo:
        mb = _mb_expected(ctx)
        if mb is not None:
            mb = compact(mb[0], len(ctx.w)), mb[1]
        ctx.memo["worker.mb_expected"] = mb
    return ctx.memo["worker.mb_expected"]


def _mb_expected(ctx: Ctx) -> tuple[np.ndarray, np.ndarray] | None:
    from laggard.diagnose.sequence import seq_features
    from laggard.optable.ops import unique_inverse

    on = (ctx.fwd | ctx.bwd) & (ctx.mb >= 0)
    if not on.any():
        return None
    feats = seq_features(ctx, on)
    if feats is not None and len(feats[0]) == int(on.sum()):
        rows, sq, lin = feats
        expected = np.empty(len(rows))
        group = ctx.pp[rows] * (len(ctx.names) + 1) + ctx.name[rows]
        w = ctx.w[rows]
        # each (stage, op type)'s rows in their order, from one stable sort (not a mask per group)
        order = np.argsort(group, kind="stable")
        bounds = np.flatnonzero(np.diff(group[order])) + 1
        for sel in np.split(order, bounds):
            X = np.stack([sq[sel], lin[sel], np.ones(len(sel))], axis=1)
            coef, *_ = np.linalg.lstsq(X, w[sel], rcond=None)
            expected[sel] = np.maximum(X @ coef, 1e-12)
        return rows, expected
    # one int64 key per (step, stage, op type, microbatch), all >= 0 here: the groups (and their
    # order) of a row-wise unique of the four columns, in one 1-D sort
    key = np.zeros(int(on.sum()), dtype=np.int64)
    for col in (ctx.step[on], ctx.pp[on], ctx.name[on], ctx.mb[on]):
        key = key * (int(col.max()) + 1) + col
    _, group = unique_inverse(key)
    # a pass may be several ops (cut where it issues communication, or one per module called): its
    # cost is their sum on the rank, compared with the other ranks' sums; each op is expected its
    # share of the peers' median, so that every op of the pass has the pass's ratio
    rank_key = group.astype(np.int64) * (int(ctx.rank.max()) + 1) + ctx.rank[on]
    _, pass_of = unique_inverse(rank_key)
    w = ctx.w[on]
    total = np.bincount(pass_of, weights=w)
    pass_group = np.empty(len(total), dtype=np.int64)
    pass_group[pass_of] = group
    peers_of_pass = peer_median(total, pass_group)
    share = np.divide(w, total[pass_of], out=np.zeros_like(w), where=total[pass_of] > 0)
    peers = peers_of_pass[pass_of] * share
    ok = peers > 0
    if not ok.any():  # no pass has a peer (e.g. microbatches on one DP rank only)
        return None
    return np.flatnonzero(on)[ok], peers[ok]


def per_microbatch(ctx: Ctx, cfg: DiagnoseConfig) -> dict[int, float]:
    """Per rank: the median over its forward and backward passes of the op's time over what the same
    op should cost (``mb_expected``). Sequence imbalance moves the ratio to the other DP ranks' same
    microbatch both ways (a DP rank may draw long sequences in most of a short trace's
    microbatches), and not the ratio to the fitted cost; a slow worker moves both."""
    mb = mb_expected(ctx)
    if mb is None:
        return {}
    rows, expected = mb
    # one ratio per (rank, step, microbatch): its passes' time over what they should cost, summed over
    # the forward's and the backward's ops (a pass cut into ops by the communication it issues counts
    # whole; a median over single ops would let a slow forward's one op be outvoted by the backward's)
    from laggard.optable.ops import unique_inverse

    key = (ctx.rank[rows].astype(np.int64) * (int(ctx.step.max()) + 1) + ctx.step[rows]) \
        * (int(ctx.mb.max()) + 1) + ctx.mb[rows]
    _, inv = unique_inverse(key)
    spent, cost = np.bincount(inv, weights=ctx.w[rows]), np.bincount(inv, weights=expected)
    first = np.full(len(spent), len(rows), dtype=np.int64)
    np.minimum.at(first, inv, np.arange(len(rows)))
    ratio, ranks = spent / np.maximum(cost, 1e-12), ctx.rank[rows][first]
    if np.isfinite(ratio).all():  # each rank's median in one sort (group_median picks as np.median does)
        gi = np.searchsorted(ctx.ranks, ranks)  # ctx.ranks: every rank, sorted
        present = np.bincount(gi, minlength=len(ctx.ranks)) > 0
        meds = group_median(ratio, gi, len(ctx.ranks))
        med = dict(zip(ctx.ranks[present].tolist(), meds[present].tolist(), strict=True))
    else:
        order = np.argsort(ranks, kind="stable")
        r_sorted, v_sorted = ranks[order], ratio[order]
        bounds = np.flatnonzero(np.diff(r_sorted)) + 1
        med = {int(rs[0]): float(np.median(vs))
               for rs, vs in zip(np.split(r_sorted, bounds), np.split(v_sorted, bounds), strict=True) if len(rs)}
    # the fitted cost is one for all DP replicas of a stage, and the peers' median of a microbatch is
    # a slow one's where most replicas are slow: compare each rank with the fast peers of its stage
    rs = sorted(med)
    stage = np.array([ctx.worker_of[r]["stage"] for r in rs])
    v = np.array([med[r] for r in rs])
    ref = fast_peer_ref(v, stage, cfg.worker_ratio)
    return {r: float(x / y) if y > 0 else float("inf") for r, x, y in zip(rs, v, ref, strict=True)}
