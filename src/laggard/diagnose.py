"""Root causes with evidence, the share of the slowdown each explains, and the fix to apply.

Each cause has a signature in the trace (production experience, as on-call engineers read it):

* ``worker``: one hot cell in the DP x PP heatmap of S_w; its compute is slower than its peers'.
* ``stage-imbalance``: one stage's row lights up (often the last: the loss/logits layer): most of its
  workers are hot, or compute well over what the other stages' workers do (one noisier worker of
  the row must not hide it; it becomes a worker finding of its own when well above its row peers).
* ``sequence-imbalance``: microbatch times vary within a step, forward and backward of the same
  microbatch together (and follow the sum of squared sequence lengths when the trace has them).
* ``gc``: rare long forward passes on different ranks at different steps, backward untouched.
* ``comm``: transfers on one link or group far slower than the same transfers elsewhere; or the same
  slow tail on every link (ranks waiting for peers that run late: CPU contention, a congested
  fabric), which is reported as such and blamed on no one link.
* ``launch-delay``: untraced host time (``laggard.gaps``): ranks whose host ops take far more than
  their peers' (a slow data loader, Python overhead, CPU contention), or wall-clock steps longer
  than the replay of the traced ops (many gaps too small to model one by one).

A signature only nominates a candidate. Its ``score`` comes from a targeted what-if: replay the
job with only what the finding names made healthy (set to what its peers do), and measure the
share of the job's slowdown (measured step time over ideal) that disappears. ``gain`` is the
predicted speed-up of that fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.gaps import HOST_KIND
from laggard.ops import is_gc_name
from laggard.replay import replay_steps

if TYPE_CHECKING:
    from laggard.whatif import Analysis, Baseline

DEFAULT_THRESHOLD = 1.05
MIN_SCORE = 0.05  # findings that explain less of the slowdown are not reported
# a worker is heavy when its compute per step is this much above the other stages' median worker
# (the last stage of the demo job computes 1.02-1.1x the first with no injection: keep clear of it)
HEAVY_ROW_RATIO = 1.25
# a worker of a hot row is a suspect of its own when its compute is this much above its row peers'
OUTLIER_IN_ROW = 1.25
# a stage's finding goes before a worker finding on that stage that explains at most this much more
ROW_TIE = 0.05
# untraced host time: a rank is a suspect when its host time above its peers' is at least this share
# of the ideal step (smaller excesses are noise of a shared host) ...
HOST_MIN_SHARE = 0.02
# ... and at least this share of the worst rank's excess (the others are named with it)
HOST_HOT_SHARE = 0.5
# at most this many ranks named in one finding
HOST_MAX_RANKS = 8


@dataclass(kw_only=True, slots=True)
class Finding:
    cause: str
    workers: list[dict[str, int]] = field(default_factory=list)
    stages: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    evidence: str = ""
    score: float = 0.0
    gain: float = 1.0
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "workers": self.workers,
            "stages": self.stages,
            "steps": self.steps,
            "evidence": self.evidence,
            "score": _finite(self.score),
            "gain": _finite(self.gain),
            "fix": self.fix,
        }


@dataclass(kw_only=True, slots=True)
class Diagnosis:
    verdict: str  # healthy | straggling
    threshold: float
    findings: list[Finding]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "healthy_threshold": self.threshold,
            "findings": [f.to_json() for f in self.findings],
        }


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclass(kw_only=True, slots=True)
class _Candidate:
    finding: Finding
    weights: np.ndarray | None  # the targeted what-if; None for launch-delay


class _Ctx:
    """Per-op views of the analysed job that the detectors share."""

    def __init__(self, res: Analysis) -> None:
        base = res.base
        assert base is not None
        self.res = res
        self.base: Baseline = base
        job = base.job
        self.w = base.measured
        self.names = base.names
        self.name = base.name_code
        kinds = np.array(base.kinds, dtype=object)
        self.kind = kinds[base.kind_code] if len(kinds) else np.zeros(0, dtype=object)
        self.compute = (self.kind == "compute") | (self.kind == "other")
        low = [n.lower() for n in base.names]
        fwd_names = np.array(["forward" in n for n in low] + [False], dtype=bool)
        bwd_names = np.array(["backward" in n for n in low] + [False], dtype=bool)
        self.fwd = fwd_names[self.name] & (self.kind == "compute")
        self.bwd = bwd_names[self.name] & (self.kind == "compute")
        self.rank, self.dp, self.pp = base.rank, base.dp_rank, base.pp_rank
        self.step = base.graph.op_step
        self.mb = job.column("microbatch").astype(np.int64)
        self.peer = job.column("peer").astype(np.int64)
        self.synced = base.graph.op_group >= 0
        self.T, self.T_ideal = res.T_s, res.T_ideal_s
        self.T_meas = float(np.mean(res.step_wall_s))
        self.gap = self.T_meas - self.T_ideal
        ranks, first = np.unique(self.rank, return_index=True)
        self.ranks = ranks
        self.worker_of = {int(r): {"dp_rank": int(self.dp[i]), "stage": int(self.pp[i]), "rank": int(r)}
                          for r, i in zip(ranks, first, strict=True)}
        self.num_dp = len(np.unique(self.dp))
        self.num_pp = len(np.unique(self.pp))

    def group_mean(self, mask_ref: np.ndarray, keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Mean of ``w`` over ``mask_ref`` ops per key tuple; returns (per-op mean, has-reference)."""
        key = np.zeros(len(self.w), dtype=np.int64)
        for k in keys:
            k = k.astype(np.int64)
            key = key * (int(k.max()) + 2) + (k + 1)
        uniq, inv = np.unique(key, return_inverse=True)
        sums = np.bincount(inv, weights=np.where(mask_ref, self.w, 0.0), minlength=len(uniq))
        cnt = np.bincount(inv, weights=mask_ref.astype(float), minlength=len(uniq))
        mean = sums / np.maximum(cnt, 1)
        return mean[inv], (cnt > 0)[inv]

    def steps_of(self, mask: np.ndarray, limit: int = 12) -> list[int]:
        s = np.unique(self.base.graph.steps[self.step[mask]])
        return [int(x) for x in s[:limit]]


def _worker_loads(ctx: _Ctx) -> np.ndarray:
    """Compute seconds per step of each worker (``ctx.ranks`` order): the median over the steps it
    ran, so that a few stalled steps (a noisy neighbour, a descheduled process) do not count."""
    ri = np.searchsorted(ctx.ranks, ctx.rank)
    num_steps = int(ctx.step.max()) + 1 if len(ctx.step) else 1
    cell = ri * num_steps + ctx.step
    size = len(ctx.ranks) * num_steps
    shape = (len(ctx.ranks), num_steps)
    per = np.bincount(cell[ctx.compute], weights=ctx.w[ctx.compute], minlength=size).reshape(shape)
    ran = np.bincount(cell, minlength=size).reshape(shape) > 0  # every worker ran at least one step
    return np.nanmedian(np.where(ran, per, np.nan), axis=1)


def _worker_and_stage(ctx: _Ctx, thr: float) -> list[_Candidate]:
    res = ctx.res
    out: list[_Candidate] = []
    sw = {w["rank"]: w["slowdown"] for w in res.by_worker}
    excess = {r: s - 1.0 for r, s in sw.items()}
    top = max(excess.values())
    if top < (thr - 1.0) * 0.5:
        return out
    hot = {r for r, e in excess.items() if e >= 0.5 * top}
    by_stage: dict[int, list[int]] = {}
    for r in sw:
        by_stage.setdefault(ctx.worker_of[r]["stage"], []).append(r)
    load_arr = _worker_loads(ctx)
    load = {int(r): float(x) for r, x in zip(ctx.ranks, load_arr, strict=True)}
    # a row of the heatmap is hot when most of its workers are hot, or when most of its workers
    # compute more per step than the other stages' workers. S_w = min(S_dp, S_stage) alone is not
    # enough: a noisier worker of a heavy stage raises the top excess (and so the hot threshold)
    # while its DP peers' S_w is the S_dp of their own DP rank, which that noise does not touch.
    heavy: dict[int, list[int]] = {}
    for s, rs in by_stage.items():
        others = [load[r] for r in sw if ctx.worker_of[r]["stage"] != s]
        ref_load = float(np.median(others)) if others else 0.0
        heavy[s] = [r for r in rs if ref_load > 0 and load[r] >= HEAVY_ROW_RATIO * ref_load]
    row_stages = [
        s
        for s, rs in by_stage.items()
        if ctx.num_dp > 1 and (sum(r in hot for r in rs) > 0.5 * len(rs) or len(heavy[s]) > 0.5 * len(rs))
    ]
    # a worker of a hot row is a suspect of its own only when it is hot and well above its row peers
    row_cells = []
    for s in row_stages:
        for r in by_stage[s]:
            peers = [load[q] for q in by_stage[s] if q != r]
            if r in hot and peers and load[r] >= OUTLIER_IN_ROW * float(np.median(peers)):
                row_cells.append(r)
    # stage imbalance: a whole row of the heatmap is hot
    stage_ex = {s: v - 1.0 for s, v in res.by_stage.items()}
    per_stage = np.bincount(ctx.pp[ctx.compute], weights=ctx.w[ctx.compute], minlength=ctx.num_pp)
    for s in row_stages:
        others_ex = [v for k, v in stage_ex.items() if k != s]
        if stage_ex[s] <= 0 or stage_ex[s] < 0.5 * max(stage_ex.values()):
            continue
        if others_ex and stage_ex[s] < 2 * max(float(np.median(others_ex)), 0.0):
            continue  # every stage is hot: not one stage's problem
        if ctx.num_pp > 1 and per_stage[s] < 1.1 * float(np.median(np.delete(per_stage, s))):
            continue  # its compute is not heavier than the others'

        on = (ctx.pp == s) & ctx.compute
        # the fix moves the stage's work to the other stages' level, op type by op type, and leaves
        # what a suspect worker of the stage adds on top of its peers (that is the worker finding's)
        ref, ok = ctx.group_mean(ctx.compute & (ctx.pp != s), [ctx.name])
        if not ok[on].any():
            continue
        row_ref = on & ~np.isin(ctx.rank, row_cells)
        mine, mine_ok = ctx.group_mean(row_ref if row_ref.any() else on, [ctx.name])
        sel = on & ok & mine_ok & (mine > 0)
        w = ctx.w.copy()
        w[sel] = ctx.w[sel] * (ref[sel] / mine[sel])
        w[on & ok & ~sel] = ref[on & ok & ~sel]
        cost_s = per_stage[s]
        ratio = cost_s / max(float(np.median(np.delete(per_stage, s))), 1e-12)
        share = 1.0 - float(per_stage.sum() / ctx.num_pp) / cost_s if cost_s > 0 else 0.0
        num_hot, num_heavy = sum(r in hot for r in by_stage[s]), len(heavy[s])
        f = Finding(
            cause="stage-imbalance",
            stages=[int(s)],
            workers=[ctx.worker_of[r] for r in sorted(by_stage[s])][:16],
            evidence=(
                f"stage {s} sets the pace: S_stage={res.by_stage[s]:.3f} vs {np.median(list(res.by_stage.values())):.3f} "
                f"(median); its compute is {ratio:.2f}x the other stages'; {num_heavy} of its "
                f"{len(by_stage[s])} DP replicas compute over {HEAVY_ROW_RATIO:.2f}x what the other stages' "
                f"workers do; hot in the S_w heatmap: {num_hot}"
            ),
            fix=(
                f"rebalance the pipeline: move about {100 * max(share, 0):.0f}% of stage {s}'s compute "
                f"({'the loss/logits layer' if s == ctx.num_pp - 1 else 'some layers'}) to other stages; "
                f"`laggard partition TRACE --stages {ctx.num_pp}` proposes the split"
            ),
        )
        out.append(_Candidate(finding=f, weights=w))
    # bad workers: a few hot cells outside hot rows, and workers well above the peers of their hot row
    # (their peers: the other workers of their stage, the rest of the row for a worker of a hot row)
    cells = [r for r in hot if ctx.worker_of[r]["stage"] not in row_stages] + row_cells
    cells.sort(key=lambda r: -excess[r])
    cap = max(2, math.ceil(0.05 * len(sw)))
    if cells and len(cells) <= cap:
        on = np.isin(ctx.rank, cells) & ctx.compute
        ref, ok = ctx.group_mean(ctx.compute & ~np.isin(ctx.rank, cells), [ctx.name, ctx.pp])
        if ok[on].any():
            w = ctx.w.copy()
            w[on & ok] = ref[on & ok]
            r0 = cells[0]
            mine = (ctx.rank == r0) & ctx.compute
            ratio = ctx.w[mine].sum() / max(ref[mine].sum(), 1e-12)
            wk = ctx.worker_of[r0]
            names = ", ".join(f"rank {r} (dp{ctx.worker_of[r]['dp_rank']}/pp{ctx.worker_of[r]['stage']})" for r in cells[:4])
            f = Finding(
                cause="worker",
                workers=[ctx.worker_of[r] for r in cells],
                stages=sorted({ctx.worker_of[r]["stage"] for r in cells}),
                evidence=(
                    f"{names}: S_w={sw[r0]:.3f} vs {np.median(list(sw.values())):.3f} (median worker); rank {r0}'s "
                    f"compute takes {ratio:.2f}x what its peers on stage {wk['stage']} take"
                ),
                fix=(
                    f"drain the node of rank {r0}" + (f" (and of {len(cells) - 1} more)" if len(cells) > 1 else "")
                    + " and check it (thermal throttling, clocks, ECC errors, noisy neighbours); "
                    f"confirm with `laggard whatif TRACE --fix worker=dp{wk['dp_rank']}:pp{wk['stage']}`"
                ),
            )
            out.append(_Candidate(finding=f, weights=w))
    return out


def _microbatch_matrix(ctx: _Ctx, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key per op for ops in mask, unique keys) with key = (rank, step, microbatch)."""
    r, s, m = ctx.rank[mask], ctx.step[mask], ctx.mb[mask]
    key = (r * (int(ctx.step.max()) + 1) + s) * (int(ctx.mb.max()) + 2) + (m + 1)
    return key, np.unique(key)


def _sequence(ctx: _Ctx, thr: float) -> list[_Candidate]:
    fm = ctx.fwd & (ctx.mb >= 0)
    bm = ctx.bwd & (ctx.mb >= 0)
    if fm.sum() < 8 or bm.sum() < 8:
        return []
    kf, _ = _microbatch_matrix(ctx, fm)
    kb, _ = _microbatch_matrix(ctx, bm)
    common, i_f, i_b = np.intersect1d(kf, kb, return_indices=True)
    if len(common) < 8:
        return []
    f = ctx.w[fm][i_f]
    b = ctx.w[bm][i_b]
    rs = common // (int(ctx.mb.max()) + 2)  # (rank, step)
    _, inv = np.unique(rs, return_inverse=True)
    cnt = np.bincount(inv)
    fmean = (np.bincount(inv, weights=f) / cnt)[inv]
    bmean = (np.bincount(inv, weights=b) / cnt)[inv]
    rf, rb = f / np.maximum(fmean, 1e-12) - 1, b / np.maximum(bmean, 1e-12) - 1
    spread = float(np.std(rf))
    if spread < 0.05 or np.std(rb) == 0 or np.std(rf) == 0:
        return []
    corr = float(np.corrcoef(rf, rb)[0, 1])
    if corr < 0.6:
        return []
    evidence = (
        f"microbatch times vary within steps (spread {100 * spread:.0f}%), forward and backward of the same "
        f"microbatch together (correlation {corr:.2f})"
    )
    fit = _fit_seq_cost(ctx, fm)
    if fit is not None:
        evidence += f"; forward time follows a*sum(len^2) + b*sum(len) (R^2={fit:.2f})"
    # balanced: every microbatch of a stage costs the step's mean
    comp = ctx.fwd | ctx.bwd
    ref, ok = ctx.group_mean(comp, [ctx.step, ctx.pp, ctx.name])
    w = ctx.w.copy()
    sel = comp & ok
    w[sel] = ref[sel]
    hot_steps = np.unique(ctx.step[fm][np.abs(ctx.w[fm] / np.maximum(ref[fm], 1e-12) - 1) > 2 * spread])
    finding = Finding(
        cause="sequence-imbalance",
        steps=[int(ctx.base.graph.steps[s]) for s in hot_steps[:12]],
        evidence=evidence,
        fix=(
            "balance sequences across microbatches and DP ranks by attention cost: "
            "`laggard.mitigate.balance(lengths, num_bins, method='wlb')` (with `laggard fit-cost TRACE` for the cost model)"
        ),
    )
    return [_Candidate(finding=finding, weights=w)]


def _fit_seq_cost(ctx: _Ctx, fm: np.ndarray) -> float | None:
    col = ctx.base.job.table.column("seq_lens")
    if col.null_count == len(col):
        return None
    lens = col.combine_chunks()
    from laggard.ops import to_numpy, valid_mask

    valid = valid_mask(lens)
    rows = np.flatnonzero(fm & valid)
    if len(rows) < 8:
        return None
    offsets = to_numpy(lens.offsets).astype(np.int64)
    values = to_numpy(lens.values).astype(np.float64)
    starts, ends = offsets[rows], offsets[rows + 1]
    owner = np.repeat(np.arange(len(rows)), ends - starts)
    idx = np.concatenate([np.arange(a, b) for a, b in zip(starts[:4096], ends[:4096], strict=True)]) if len(rows) <= 4096 else None
    if idx is None:  # vectorised gather for many rows
        idx = np.repeat(starts - np.concatenate([[0], np.cumsum(ends - starts)[:-1]]), ends - starts) + np.arange(int((ends - starts).sum()))
    sq = np.bincount(owner, weights=values[idx] ** 2, minlength=len(rows))
    lin = np.bincount(owner, weights=values[idx], minlength=len(rows))
    y = ctx.w[rows]
    # per-stage scale: fit y / stage mean against normalised features
    pp = ctx.pp[rows]
    smean = (np.bincount(pp, weights=y) / np.maximum(np.bincount(pp), 1))[pp]
    y = y / np.maximum(smean, 1e-12)
    X = np.stack([sq / max(sq.mean(), 1e-12), lin / max(lin.mean(), 1e-12), np.ones(len(rows))], axis=1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    pred = X @ coef
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else None


def _group_median(values: np.ndarray, groups: np.ndarray, num_groups: int) -> np.ndarray:
    """Median of ``values`` per group id (0..num_groups-1), vectorised; 0 for empty groups."""
    order = np.lexsort((values, groups))
    g = groups[order]
    starts = np.searchsorted(g, np.arange(num_groups))
    ends = np.searchsorted(g, np.arange(num_groups), side="right")
    lens = ends - starts
    nonempty = lens > 0
    lo = order[np.where(nonempty, starts + (lens - 1) // 2, 0)]
    hi = order[np.where(nonempty, starts + lens // 2, 0)]
    return np.where(nonempty, 0.5 * (values[lo] + values[hi]), 0.0)


def _peer_median(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """For each entry, the median of the other entries of its group (0 where it is alone)."""
    order = np.lexsort((values, groups))
    v, g = values[order], groups[order]
    start = np.searchsorted(g, g)
    size = np.searchsorted(g, g, side="right") - start
    j = np.arange(len(v)) - start  # the entry's place in its sorted group
    n = np.maximum(size - 1, 1)  # the others
    lo, hi = (n - 1) // 2, n // 2
    # the k-th of the others is the group's k-th if k < j, else its (k+1)-th
    at_lo = np.minimum(start + lo + (lo >= j), len(v) - 1)
    at_hi = np.minimum(start + hi + (hi >= j), len(v) - 1)
    out = np.empty(len(v))
    out[order] = np.where(size > 1, 0.5 * (v[at_lo] + v[at_hi]), 0.0)
    return out


def _robust_outliers(ctx: _Ctx, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ops in ``mask`` far above the median of their (rank, op type); returns (outlier mask, median)."""
    key = ctx.rank * (len(ctx.names) + 1) + ctx.name
    rows = np.flatnonzero(mask)
    med = np.zeros(len(ctx.w))
    out = np.zeros(len(ctx.w), dtype=bool)
    if len(rows) == 0:
        return out, med
    order = rows[np.lexsort((ctx.w[rows], key[rows]))]
    k = key[order]
    bounds = np.flatnonzero(np.diff(k)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.append(bounds, len(order))
    lens = ends - starts
    mid_lo = order[starts + (lens - 1) // 2]
    mid_hi = order[starts + lens // 2]
    m = 0.5 * (ctx.w[mid_lo] + ctx.w[mid_hi])
    seg = np.repeat(np.arange(len(starts)), lens)
    med[order] = m[seg]
    dev = np.abs(ctx.w[order] - med[order])
    mad = _group_median(dev, seg, len(starts))
    thresh = med[order] + np.maximum(8 * 1.4826 * mad[seg], 0.3 * med[order])
    out[order] = ctx.w[order] > thresh
    return out, med


def _gc(ctx: _Ctx, thr: float) -> list[_Candidate]:
    fwd_out, fmed = _robust_outliers(ctx, ctx.fwd)
    bwd_out, _ = _robust_outliers(ctx, ctx.bwd)
    gc_ops = np.array([is_gc_name(n) for n in ctx.names] + [False])[ctx.name]
    gc_time = float(ctx.w[gc_ops].sum()) / max(len(ctx.base.graph.steps), 1)
    n_out = int(fwd_out.sum())
    if n_out < 2 and gc_time < 0.01 * ctx.T:
        return []
    if n_out >= 2:
        # the backward of a stalled forward's microbatch should be normal
        kf, _ = _microbatch_matrix(ctx, fwd_out)
        kb, _ = _microbatch_matrix(ctx, bwd_out)
        paired = np.isin(kf, kb).mean()
        ranks = np.unique(ctx.rank[fwd_out])
        steps = np.unique(ctx.step[fwd_out])
        if paired > 0.3 or len(ranks) < 2 or len(steps) < 2:
            if gc_time < 0.01 * ctx.T:
                return []
            n_out = 0
    w = ctx.w.copy()
    w[fwd_out] = fmed[fwd_out] if n_out else w[fwd_out]
    w[gc_ops] = 0.0
    if n_out:
        extra = ctx.w[fwd_out] - fmed[fwd_out]
        ev = (
            f"{n_out} forward passes stalled by +{1e3 * float(np.median(extra)):.1f} ms (median) on "
            f"{len(np.unique(ctx.rank[fwd_out]))} ranks across {len(np.unique(ctx.step[fwd_out]))} steps while the "
            "backward passes of the same microbatches ran normally"
        )
    else:
        ev = f"traced garbage collections take {1e3 * gc_time:.1f} ms per step"
    finding = Finding(
        cause="gc",
        workers=[ctx.worker_of[int(r)] for r in np.unique(ctx.rank[fwd_out])][:16],
        steps=ctx.steps_of(fwd_out | gc_ops),
        evidence=ev,
        fix="enable planned GC: `laggard.mitigate.PlannedGC` (automatic GC off, collect on all ranks at the same step, "
        "e.g. every 200 steps or adaptively; gc.freeze() after start-up)",
    )
    return [_Candidate(finding=finding, weights=w)]


def _comm(ctx: _Ctx, thr: float) -> list[_Candidate]:
    comm = ctx.synced & ~ctx.compute
    if comm.sum() < 4:
        return []
    # a link: (rank, peer) for p2p, (rank, op type) for collectives
    is_p2p = (ctx.kind == "p2p_send") | (ctx.kind == "p2p_recv")
    src = np.where(ctx.kind == "p2p_recv", ctx.peer, ctx.rank)
    dst = np.where(ctx.kind == "p2p_recv", ctx.rank, ctx.peer)
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    link = np.where(is_p2p, lo * (int(ctx.rank.max()) + 2) + hi, -(ctx.rank + 1))
    type_med, _ = ctx.group_mean(comm, [ctx.name])  # mean as a robust-enough scale
    med_by_type = {}
    for c in np.unique(ctx.name[comm]):
        med_by_type[int(c)] = float(np.median(ctx.w[comm & (ctx.name == c)]))
    tmed = np.array([med_by_type.get(int(c), 0.0) for c in range(len(ctx.names))] + [0.0])[ctx.name]
    rows = np.flatnonzero(comm)
    key = link[rows] * (len(ctx.names) + 1) + ctx.name[rows]
    uniq, inv = np.unique(key, return_inverse=True)
    excess = np.bincount(inv, weights=np.maximum(ctx.w[rows] - tmed[rows], 0.0), minlength=len(uniq))
    mx_link = np.zeros(len(uniq))
    np.maximum.at(mx_link, inv, ctx.w[rows])
    med_link = _group_median(ctx.w[rows], inv, len(uniq))
    base_med = np.array([med_by_type[int(k % (len(ctx.names) + 1))] for k in uniq])
    tail = ((med_link > 3 * base_med) | (mx_link > 10 * base_med)) & (excess > 0)
    tail &= excess >= 0.3 * excess.max()
    # a bad link stands out from the other links of its op type; when they all have the same slow
    # tail (hosts short of CPU, a congested fabric), no one link is to blame
    type_of = uniq % (len(ctx.names) + 1)
    slow = tail & (excess > 2 * _peer_median(excess, type_of))
    if not slow.any() or slow.mean() > 0.5:
        return _comm_everywhere(ctx, rows, inv, uniq // (len(ctx.names) + 1), tail, tmed, is_p2p)
    bad_rows = rows[slow[inv]]
    w = ctx.w.copy()
    w[bad_rows] = tmed[bad_rows]
    i0 = int(np.argmax(np.where(slow, excess, -1)))
    rws = rows[inv == i0]
    r_a, r_b = int(src[rws[0]]), int(dst[rws[0]])
    nm = ctx.names[int(uniq[i0] % (len(ctx.names) + 1))]
    n_slow = int((ctx.w[rws] > 3 * base_med[i0]).sum())
    where = f"from rank {r_a} to rank {r_b}" if is_p2p[rws[0]] else f"of rank {int(ctx.rank[rws[0]])}"
    ev = (
        f"{nm} transfers {where} take {1e3 * med_link[i0]:.2f} ms (median, max {1e3 * mx_link[i0]:.2f} ms) vs "
        f"{1e3 * base_med[i0]:.2f} ms elsewhere; {n_slow} of {len(rws)} are slow"
    )
    ranks = sorted({int(x) for x in np.concatenate([src[bad_rows], dst[bad_rows]]) if x >= 0})
    finding = Finding(
        cause="comm",
        workers=[ctx.worker_of[r] for r in ranks if r in ctx.worker_of][:16],
        steps=ctx.steps_of(np.isin(np.arange(len(ctx.w)), bad_rows) & (ctx.w > 3 * tmed)),
        evidence=ev,
        fix=(
            f"check the link/NIC between rank {r_a} and rank {r_b} (flapping port, bad cable, congested switch); "
            "drain one of the two nodes or route around it"
            if is_p2p[rws[0]]
            else f"check the network of rank {int(ctx.rank[rws[0]])}'s node; drain it if the slow collectives persist"
        ),
    )
    return [_Candidate(finding=finding, weights=w)]


def _comm_everywhere(ctx: _Ctx, rows: np.ndarray, inv: np.ndarray, link_of_key: np.ndarray, tail: np.ndarray,
                     tmed: np.ndarray, is_p2p: np.ndarray) -> list[_Candidate]:
    """Transfers with the same slow tail on several links and ranks alike: not one link's fault."""
    bad_rows = rows[tail[inv]]
    ranks = np.unique(ctx.rank[bad_rows])
    links = np.unique(link_of_key[tail])
    if len(links) < 2 or len(ranks) < 2:
        return []
    w = ctx.w.copy()
    w[bad_rows] = tmed[bad_rows]
    slow_ops = ctx.w[bad_rows] > 3 * tmed[bad_rows]
    ms = 1e3 * ctx.w[bad_rows]
    what = "point-to-point transfers" if is_p2p[bad_rows].all() else "transfers"
    ev = (
        f"{what} on {len(links)} links over {len(ranks)} ranks share the same slow tail: median "
        f"{float(np.median(ms)):.2f} ms, p90 {float(np.percentile(ms, 90)):.2f} ms, {int(slow_ops.sum())} of "
        f"{len(bad_rows)} over 3x their op type's median; no link stands out from the others"
    )
    finding = Finding(
        cause="comm",
        workers=[ctx.worker_of[int(r)] for r in ranks if int(r) in ctx.worker_of][:16],
        steps=ctx.steps_of(np.isin(np.arange(len(ctx.w)), bad_rows[slow_ops])),
        evidence=ev,
        fix="not one bad link: ranks wait for peers that run late. Look for CPU contention on the hosts (more busy "
        "processes or threads than cores, data-loader workers, noisy neighbours) or fabric-wide congestion",
    )
    return [_Candidate(finding=finding, weights=w)]


def _launch(ctx: _Ctx, thr: float) -> list[_Candidate]:
    """Untraced host time: ranks whose host ops (``laggard.gaps``) take far more than their peers',
    fixed by a what-if; and what the replay still misses (gaps too small to model one by one)."""
    out: list[_Candidate] = []
    host = ctx.kind == HOST_KIND
    if host.any():
        out += _host_ranks(ctx, host)
    fidelity = ctx.res.replay_fidelity
    if fidelity >= thr and ctx.T_meas > ctx.T:
        out.append(_unmodelled(ctx, fidelity))
    return out


def _host_ranks(ctx: _Ctx, host: np.ndarray) -> list[_Candidate]:
    base = ctx.base
    nsteps = max(len(base.graph.steps), 1)
    ri = np.searchsorted(ctx.ranks, ctx.rank)
    excess = np.bincount(ri[host], weights=(ctx.w - base.ideal)[host], minlength=len(ctx.ranks)) / nsteps
    spent = np.bincount(ri[host], weights=ctx.w[host], minlength=len(ctx.ranks)) / nsteps
    top = float(excess.max())
    if top <= 0 or top < HOST_MIN_SHARE * ctx.T_ideal:
        return []
    hot = np.flatnonzero(excess >= HOST_HOT_SHARE * top)
    hot = hot[np.argsort(-excess[hot])][:HOST_MAX_RANKS]
    ranks = [int(ctx.ranks[i]) for i in hot]
    on = host & np.isin(ctx.rank, ranks)
    w = ctx.w.copy()
    w[on] = base.ideal[on]
    r0 = ranks[0]
    mine = host & (ctx.rank == r0)
    per_name = np.bincount(ctx.name[mine], weights=(ctx.w - base.ideal)[mine], minlength=len(ctx.names))
    where = ctx.names[int(np.argmax(per_name))].removeprefix("host:")
    peers = np.delete(spent, hot)
    names = ", ".join(f"rank {r} (dp{ctx.worker_of[r]['dp_rank']}/pp{ctx.worker_of[r]['stage']})" for r in ranks[:4])
    sel = ("rank=" + str(r0)) if len(ranks) == 1 else ("dp=" + str(ctx.worker_of[r0]["dp_rank"]))
    finding = Finding(
        cause="launch-delay",
        workers=[ctx.worker_of[r] for r in ranks],
        stages=sorted({ctx.worker_of[r]["stage"] for r in ranks}),
        steps=ctx.steps_of(on & (ctx.w > base.ideal)),
        evidence=(
            f"{names}: {1e3 * spent[hot[0]]:.1f} ms per step of host time no traced op covers "
            f"(median of the other ranks: {1e3 * float(np.median(peers)) if len(peers) else 0.0:.1f} ms), "
            f"mostly before {where}"
        ),
        fix=(
            f"find the host-side work on rank {r0} between its traced ops: a slow data loader (more workers, "
            "pin_memory, prefetching), Python overhead, CPU contention from other processes on its host; "
            f"confirm with `laggard whatif TRACE --fix {sel},kind=host`"
        ),
    )
    return [_Candidate(finding=finding, weights=w)]


def _unmodelled(ctx: _Ctx, fidelity: float) -> _Candidate:
    base = ctx.base
    g = base.graph
    owner = np.repeat(np.arange(g.num_ops), np.diff(g.dep_ptr))
    ready = np.zeros(g.num_ops)
    if len(owner):
        np.maximum.at(ready, owner, base.end_s[g.dep_idx])
    has_dep = np.diff(g.dep_ptr) > 0
    gaps = np.where(has_dep & ~ctx.synced, np.maximum(base.start_s - ready, 0.0), 0.0)
    per_rank = np.bincount(np.searchsorted(ctx.ranks, ctx.rank), weights=gaps, minlength=len(ctx.ranks))
    per_type = np.bincount(ctx.name, weights=gaps, minlength=len(ctx.names))
    nsteps = max(len(g.steps), 1)
    worst = int(np.argmax(per_rank))
    finding = Finding(
        cause="launch-delay",
        workers=[ctx.worker_of[int(ctx.ranks[worst])]],
        evidence=(
            f"steps take {ctx.T_meas:.4g} s on the wall clock but the replay of the traced ops takes {ctx.T:.4g} s "
            f"({fidelity:.3f}x): many small untraced gaps, {1e3 * per_rank[worst] / nsteps:.1f} ms per step on rank "
            f"{int(ctx.ranks[worst])}, mostly before {ctx.names[int(np.argmax(per_type))]}"
        ),
        fix="find the CPU-side work between kernel launches (data loading, Python overhead, host contention): "
        "profile the host, overlap data loading, use CUDA graphs",
        score=min((ctx.T_meas - ctx.T) / ctx.gap, 1.0) if ctx.gap > 0 else 0.0,
        gain=fidelity,
    )
    return _Candidate(finding=finding, weights=None)


DETECTORS = (_worker_and_stage, _sequence, _gc, _comm, _launch)


def diagnose(res: Analysis, *, threshold: float = DEFAULT_THRESHOLD) -> Diagnosis:
    """Findings for an analysed job, strongest first; a healthy job gets none."""
    if res.base is None:
        raise ValueError("diagnose needs the Analysis of a job (with its base)")
    ctx = _Ctx(res)
    total = ctx.T_meas / ctx.T_ideal if ctx.T_ideal > 0 else 1.0
    if max(res.slowdown, res.replay_fidelity, total) < threshold or ctx.gap <= 0:
        return Diagnosis(verdict="healthy", threshold=threshold, findings=[])
    cands = [c for det in DETECTORS for c in det(ctx, threshold)]
    replayed = [c for c in cands if c.weights is not None]
    if replayed:
        w = np.stack([c.weights for c in replayed], axis=1)
        t_fix = replay_steps(ctx.base.graph, w).mean(axis=0)
        for c, t in zip(replayed, t_fix.tolist(), strict=True):
            # a fix can beat the pooled ideal (it removes the cause from the ideal too): cap at 1
            c.finding.score = min((ctx.T - t) / ctx.gap, 1.0)
            c.finding.gain = ctx.T / t if t > 0 else float("inf")
    findings = _ranked([c.finding for c in cands if c.finding.score >= MIN_SCORE])
    return Diagnosis(verdict="straggling", threshold=threshold, findings=findings)


def _ranked(findings: list[Finding]) -> list[Finding]:
    """Strongest first. Scores are capped at 1: among fixes that remove the whole slowdown, the one
    that gains most comes first. A hot row explains its hot cells: a stage imbalance goes before the
    worker findings on that stage that explain about as much (within ``ROW_TIE`` of the slowdown)."""
    out = sorted(findings, key=lambda f: (-f.score, -f.gain))
    for st in [f for f in out if f.cause == "stage-imbalance"]:
        i = j = next(k for k, f in enumerate(out) if f is st)
        while j > 0 and out[j - 1].cause == "worker" and set(out[j - 1].stages) <= set(st.stages):
            if out[j - 1].score - st.score > ROW_TIE:
                break
            j -= 1
        out.insert(j, out.pop(i))
    return out
