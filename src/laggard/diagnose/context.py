"""Per-op views of the analyzed job that every detector reads, and the grouped statistics they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from laggard.engine.selection import group_kth, nan_median
from laggard.engine.spikes import group_mean, group_median, sort_by_group  # noqa: F401  (group_median: re-exported for the detectors)
from laggard.optable.ops import HOST_GAP_CUT_KEY, fits_table, is_gc_name, unique_inverse

if TYPE_CHECKING:
    from laggard.engine.baseline import Baseline
    from laggard.results.analysis import Analysis


class Ctx:
    def __init__(self, res: Analysis, *, fixed: bool = False) -> None:
        """``fixed``: ``res`` is the job with the found causes fixed (``laggard.diagnose.hidden``), its
        other ops as measured, side effects of those causes included (a busy host's stretched compute)."""
        base = res.base
        assert base is not None
        self.res = res
        self.fixed = fixed
        self.base: Baseline = base
        job = base.job
        self.w = base.measured
        self.names = base.names
        self.name = base.name_code
        kinds = np.array(base.kinds, dtype=object)
        self.kind = kinds[base.kind_code] if len(kinds) else np.zeros(0, dtype=object)
        is_compute = self.kind_is("compute")
        # the compute ops are CPU-side passes an importer cut from a profiler trace (the idle gaps in
        # them taken out as host time): its Python between passes is on every rank
        self.host_passes = HOST_GAP_CUT_KEY in job.meta.extra
        # the compute runs on the host's CPUs (the Tracer timed it with the CPU's clock, not CUDA events;
        # a profiler trace with no GPU activity): ranks sharing a host share the cores it runs on
        self.cpu_compute = self.host_passes or job.meta.extra.get("timing") == "perf_counter_ns"
        # compute: a rank's own work, garbage collections left out (a rank that collects more is not
        # a slow worker or a heavy stage; the gc detector judges the collections)
        self.gc = np.array([is_gc_name(n) for n in base.names] + [False], dtype=bool)[self.name]
        self.compute = self.kind_is("compute", "other") & ~self.gc
        low = [n.lower() for n in base.names]
        fwd_names = np.array(["forward" in n for n in low] + [False], dtype=bool)
        bwd_names = np.array(["backward" in n for n in low] + [False], dtype=bool)
        self.fwd = fwd_names[self.name] & is_compute
        self.bwd = bwd_names[self.name] & is_compute
        self.rank, self.dp, self.pp = base.rank, base.dp_rank, base.pp_rank
        self.step = base.graph.op_step
        self.mb = job.column("microbatch").astype(np.int64)
        self.peer = job.column("peer").astype(np.int64)
        from laggard.engine.spikes import fwd_bwd_partner

        # each forward pass's backward (same rank, step, microbatch), -1 elsewhere
        self.partner = fwd_bwd_partner(base.names, self.name, is_compute, base.rank,
                                       base.graph.op_step, self.mb)
        self.synced = base.graph.op_group >= 0
        self.T, self.T_ideal = res.T_s, res.T_ideal_s
        self.T_meas = float(np.mean(res.step_wall_s))  # wall clock: a late step end counts once
        self.gap = self.T_meas - self.T_ideal
        # np.unique(rank, return_index=True) and the counts of distinct DP ranks and stages, through
        # lookup tables (``unique_inverse``) instead of three sorts of every op
        ranks, rank_idx = unique_inverse(self.rank)
        first = np.full(len(ranks), len(self.rank), dtype=np.int64)
        np.minimum.at(first, rank_idx, np.arange(len(self.rank)))
        self.ranks = ranks
        self.worker_of = {int(r): {"dp_rank": int(self.dp[i]), "stage": int(self.pp[i]), "rank": int(r)}
                          for r, i in zip(ranks, first, strict=True)}
        self.rank_stage = self.pp[first].astype(np.int64)  # each rank's stage, ``ranks`` order
        self.num_dp = len(unique_inverse(self.dp)[0])
        self.num_pp = len(unique_inverse(self.pp)[0])
        self.memo: dict[str, object] = {}  # what several detectors read, computed once (``worker.step_ratios``)
        # the ideal stands for the best fix's job, not the pooled one (``laggard.diagnose.unseen``: S
        # cannot see the slowdown): there, time the pooled ideal pays too is part of the slowdown
        self.ideal_by_fix = False

    def kind_is(self, *kinds: str) -> np.ndarray:
        """``np.isin(self.kind, kinds)`` by kind code (a lookup: comparing 7.7M object strings costs
        ~0.1 s a mask)."""
        flag = np.array([k in kinds for k in self.base.kinds], dtype=bool)
        return flag[self.base.kind_code] if len(flag) else np.zeros(len(self.kind), dtype=bool)

    def group_mean(self, mask_ref: np.ndarray, keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Mean of ``w`` over ``mask_ref`` ops per key tuple; returns (per-op mean, has-reference)."""
        return group_mean(self.w, mask_ref, keys)

    def steps_of(self, mask: np.ndarray, limit: int = 12) -> list[int]:
        s = np.unique(self.base.graph.steps[self.step[mask]])
        return [int(x) for x in s[:limit]]

    def worker_loads(self) -> np.ndarray:
        """Compute seconds per step of each worker (``ranks`` order): the median over the steps it
        ran, so that a few stalled steps (a noisy neighbour, a descheduled process) do not count."""
        return nan_median(self.per_rank_step(self.compute), 1)

    def per_rank_step(self, mask: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
        """Seconds of the ``mask`` ops per (rank, step) (or the sum of other per-op ``values``):
        ``ranks`` order x step index (``step``); NaN where the rank ran no op at all in the step."""
        if "ctx.rank_step_cells" not in self.memo:  # each op's (rank, step) cell, and the cells that ran ops
            ri = np.searchsorted(self.ranks, self.rank)
            num_steps = int(self.step.max()) + 1 if len(self.step) else 1
            cell = ri * num_steps + self.step
            shape = (len(self.ranks), num_steps)
            cell = compact(cell, shape[0] * shape[1])
            ran = np.bincount(cell, minlength=shape[0] * shape[1]).reshape(shape) > 0
            self.memo["ctx.rank_step_cells"] = cell, ran
        cell, ran = self.memo["ctx.rank_step_cells"]
        w = self.w if values is None else values
        per = np.bincount(cell[mask], weights=w[mask], minlength=ran.size).reshape(ran.shape)
        return np.where(ran, per, np.nan)

    def step_numbers(self) -> np.ndarray:
        """The job's step number of each step index."""
        return np.asarray(self.base.graph.steps, dtype=np.int64)

    def microbatch_keys(self, mask: np.ndarray) -> np.ndarray:
        """Key (rank, step, microbatch) of each op in ``mask``."""
        r, s, m = self.rank[mask], self.step[mask], self.mb[mask]
        return (r * (int(self.step.max()) + 1) + s) * (int(self.mb.max()) + 2) + (m + 1)


def peer_median(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """For each entry, the median of the other entries of its group (0 where it is alone)."""
    fast = _peer_median_selected(values, groups)
    if fast is not None:
        return fast
    order = sort_by_group(values, groups)
    v, g = values[order], groups[order]
    start, size = _runs(g)
    j = np.arange(len(v)) - start  # the entry's place in its sorted group
    n = np.maximum(size - 1, 1)  # the others
    lo, hi = (n - 1) // 2, n // 2
    # the k-th of the others is the group's k-th if k < j, else its (k+1)-th
    at_lo = np.minimum(start + lo + (lo >= j), len(v) - 1)
    at_hi = np.minimum(start + hi + (hi >= j), len(v) - 1)
    out = np.empty(len(v))
    out[order] = np.where(size > 1, 0.5 * (v[at_lo] + v[at_hi]), 0.0)
    return out


def step_peer_median(per: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per (rank, step) of ``per`` (ranks x steps): the median of the same step's other ranks of its
    group (``groups``, one per rank; 0 where it is alone), one ``peer_median`` over all cells."""
    ns = per.shape[1]
    cell = np.asarray(groups, dtype=np.int64)[:, None] * ns + np.arange(ns)[None, :]
    return peer_median(per.ravel(), cell.ravel()).reshape(per.shape)


def _peer_median_selected(values: np.ndarray, groups: np.ndarray) -> np.ndarray | None:
    """``peer_median`` from four order statistics of each group (``selection.group_kth``: no sort of
    the values): of the n = size - 1 others, the k-th smallest is the group's k-th where the entry is
    above it, else the group's (k+1)-th (an entry equal to the k-th: removing one copy of a value
    leaves the same others whichever copy, and the (k+1)-th is then the answer). None where the
    group ids are not small non-negative integers, a value is NaN (its place is not by value) or the
    groups come in too many sizes: the caller sorts."""
    if not len(values) or groups.dtype.kind not in "iu" or np.isnan(values).any():
        return None
    lo_g, hi_g = int(groups.min()), int(groups.max())
    if lo_g < 0 or not fits_table(hi_g + 1, len(groups)):
        return None

    def kth(size: int) -> list[int]:
        if size < 2:
            return [0, 0, 0, 0]
        lo, hi = (size - 2) // 2, (size - 1) // 2
        return [lo, lo + 1, hi, hi + 1]

    picked = group_kth(values, groups, hi_g + 1, kth)
    if picked is None:
        return None
    sel, sizes = picked
    s = sel[groups]
    at_lo = np.where(values > s[:, 0], s[:, 0], s[:, 1])
    at_hi = np.where(values > s[:, 2], s[:, 2], s[:, 3])
    return np.where(sizes[groups] > 1, 0.5 * (at_lo + at_hi), 0.0)


def _runs(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each entry of sorted ``g``: where its run of equal values starts, and the run's length
    (``np.searchsorted(g, g)`` and the right side less it, in one linear pass instead of a binary
    search per entry, whose log factor costs the most on a large job's hundreds of thousands of
    passes)."""
    n = len(g)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    firsts = np.concatenate([[0], np.flatnonzero(g[1:] != g[:-1]) + 1])
    lens = np.diff(np.append(firsts, n))
    return np.repeat(firsts, lens), np.repeat(lens, lens)


def compact(index: np.ndarray, bound: int) -> np.ndarray:
    """``index`` (values in ``[0, bound)``) as int32 where ``bound`` allows: for the op indices and
    cells a detector keeps in ``Ctx.memo`` for the job's lifetime (half the memory at 4,096 workers)."""
    return index.astype(np.int32) if bound < 2**31 else index


def rows_mask(n: int, rows: np.ndarray) -> np.ndarray:
    """The mask of ``n`` entries true at ``rows`` (``np.isin(np.arange(n), rows)`` without the sort)."""
    out = np.zeros(n, dtype=bool)
    out[rows] = True
    return out


def fast_peer_ref(values: np.ndarray, groups: np.ndarray, within: float) -> np.ndarray:
    """For each entry, the median of the fast peers of its group: the other entries at most
    ``within`` x the fastest of them (0 where it is alone). Against the median of all peers, a stage
    where most DP replicas are slow GPUs would make the slow ones the norm and the healthy ones look
    fast; the fastest cluster is what a healthy worker of that stage computes."""
    out = np.zeros(len(values))
    fp = _FastPeers.of(values, groups, within)
    if fp is None:  # NaN among the values: one group at a time
        for i, peers in enumerate(fast_peers(values, groups, within)):
            if len(peers):
                out[i] = float(np.median(values[peers]))
        return out
    # the peers are the first k of the group's sorted values less the entry itself: the median of
    # the others by index arithmetic (np.median's pick, and its mean of the middle two)
    n = fp.k - fp.inside
    lo, hi = (n - 1) // 2, n // 2
    v = fp.v
    at_lo = np.minimum(fp.start + lo + (fp.inside & (lo >= fp.j)), len(v) - 1)
    at_hi = np.minimum(fp.start + hi + (fp.inside & (hi >= fp.j)), len(v) - 1)
    out[fp.order] = np.where(n > 0, (v[at_lo] + v[at_hi]) / 2, 0.0)
    return out


@dataclass(kw_only=True, slots=True, eq=False)  # numpy arrays: a generated == could only raise (no truth value)
class _FastPeers:
    """Each entry's fast peers as a run of its group's values sorted (by group, value, position):
    positions ``start`` to ``start + k`` of ``order`` less the entry's own place ``j`` (when
    ``inside``); all arrays in sorted order."""

    order: np.ndarray
    v: np.ndarray
    start: np.ndarray
    k: np.ndarray
    j: np.ndarray
    inside: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray, groups: np.ndarray, within: float) -> _FastPeers | None:
        if np.isnan(values).any():
            return None
        order = sort_by_group(values, groups)
        v, g = values[order], groups[order]
        start = np.searchsorted(g, g)
        size = np.searchsorted(g, g, side="right") - start
        j = np.arange(len(v)) - start
        # the fastest of the others: the group's first, or its second for the first itself
        m = v[np.minimum(start + (j == 0), len(v) - 1)]
        # how many of the group's values are at most within x that (one searchsorted per group)
        t = within * m
        k = np.empty(len(v), dtype=np.int64)
        for a in np.flatnonzero(j == 0).tolist():
            b = a + int(size[a])
            k[a:b] = np.searchsorted(v[a:b], t[a:b], side="right")
        k = np.where(size > 1, k, 0)
        return cls(order=order, v=v, start=start, k=k, j=j, inside=(j < k) & (size > 1))


def fast_peer_row_median(values: np.ndarray, m: np.ndarray, groups: np.ndarray, within: float
                          ) -> tuple[np.ndarray, np.ndarray]:
    """For each entry i: ``noise.row_median(m[fast_peers(values, groups, within)[i]])`` (each column's
    median over the rows of i's fast peers, NaN ignored; NaN where there is none) and the number of
    its fast peers. Per group the peers are the first k of its sorted values less the entry itself
    (k takes at most two values in a group): each column is sorted once per (group, k) and every
    entry's median picked by index arithmetic (np.median's pick and mean of the middle two)."""
    fp = _FastPeers.of(values, groups, within)
    out = np.full(m.shape, np.nan)
    if fp is None or np.isinf(m).any():  # NaN values, or inf cells (np.nanmedian keeps them): one at a time
        from laggard.diagnose.noise import row_median

        peers = fast_peers(values, groups, within)
        for i, p in enumerate(peers):
            if len(p):
                out[i] = row_median(m[p])
        return out, np.array([len(p) for p in peers], dtype=np.int64)
    num = np.empty(len(values), dtype=np.int64)
    num[fp.order] = fp.k - fp.inside
    cols = np.arange(m.shape[1])
    for a, k in sorted({(int(a), int(k)) for a, k in zip(fp.start.tolist(), fp.k.tolist(), strict=True) if k}):
        sel = np.flatnonzero((fp.start == a) & (fp.k == k))  # entries (sorted positions) with these peers
        x = m[fp.order[a : a + k]]  # the peers' rows, plus the entry's own where it is among them
        o = np.argsort(x, axis=0, kind="stable")  # NaN last
        y = np.take_along_axis(x, o, axis=0)
        pos = np.empty_like(o)
        np.put_along_axis(pos, o, np.arange(k)[:, None], axis=0)
        c = np.isfinite(x).sum(axis=0)
        inside = fp.inside[sel]
        q = np.where(inside, fp.j[sel], 0)  # the entry's own row in x
        own = inside[:, None] & np.isfinite(x[q])  # its own finite cell leaves the column
        n = c[None, :] - own
        lo, hi = (n - 1) // 2, n // 2
        skip = pos[q]
        at_lo = np.clip(lo + (own & (lo >= skip)), 0, k - 1)
        at_hi = np.clip(hi + (own & (hi >= skip)), 0, k - 1)
        val = (y[at_lo, cols[None, :]] + y[at_hi, cols[None, :]]) / 2
        out[fp.order[sel]] = np.where(n > 0, val, np.nan)
    return out, num


def fast_peers(values: np.ndarray, groups: np.ndarray, within: float) -> list[np.ndarray]:
    """For each entry, the indices of its fast peers (``fast_peer_ref``): the other entries of its
    group at most ``within`` x the fastest of them (none where it is alone), in index order."""
    out: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(values)
    fp = _FastPeers.of(values, groups, within)
    if fp is not None:
        for p, i in enumerate(fp.order.tolist()):
            a, k = int(fp.start[p]), int(fp.k[p])
            if k:
                run = fp.order[a : a + k]
                out[i] = np.sort(np.delete(run, fp.j[p]) if fp.inside[p] else run)
        return out
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) < 2:
            continue
        v = values[idx]
        for j, i in enumerate(idx):
            others, ov = np.delete(idx, j), np.delete(v, j)
            out[i] = others[ov <= within * ov.min()]
    return out


def existing(ctx: Ctx, selectors: list[str]) -> list[str]:
    """The selectors that name at least one op of the job (a what-if rejects one that names none)."""
    from laggard.errors import LaggardError
    from laggard.whatif.custom import select_ops

    out = []
    for s in selectors:
        try:
            select_ops(ctx.base, s)
        except LaggardError:
            continue
        out.append(s)
    return out


def to_peers(ctx: Ctx, changes: list, among: np.ndarray) -> list:
    """``changes`` with each ``--fix`` made ``--peer`` (the mean of the same op type on the same stage
    over the ops no change selects) where every op it selects has such ops of its type on its stage
    among ``among``. ``--fix`` sets an op to its type's median over the whole job, the slow ops and
    the other stages included; its stage peers are the nearer reference. Where a stage has no other
    such op (a pure pipeline, every replica of the stage named), ``--peer`` would change nothing: the
    change stays ``--fix``."""
    from laggard.whatif.custom import Change, select_ops

    masks = [select_ops(ctx.base, c.selector) for c in changes]
    chosen = np.logical_or.reduce(masks) if masks else np.zeros(len(ctx.w), dtype=bool)
    nn = len(ctx.names)
    cell = ctx.name.astype(np.int64) + nn * ctx.pp.astype(np.int64)  # (op type, stage)
    has_peer = np.zeros(nn * (int(ctx.pp.max()) + 1), dtype=bool)
    has_peer[cell[~chosen & among]] = True
    return [Change(action="peer", selector=c.selector, factor=c.factor)
            if c.action == "fix" and m.any() and has_peer[cell[m]].all() else c
            for c, m in zip(changes, masks, strict=True)]


def weights_of(ctx: Ctx, changes: list) -> np.ndarray:
    """The measured durations with these ``laggard.whatif.custom`` changes applied."""
    from laggard.whatif.custom import apply_changes

    return apply_changes(ctx.base, changes)[0]
