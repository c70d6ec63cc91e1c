"""``launch-delay``: untraced host time (``laggard.engine.gaps``).

Two signatures: ranks whose host ops take far more than their peers' (a slow data loader, Python
overhead, CPU contention on their host), fixed by a what-if that gives their host ops their stage
peers' value (the typical value of their position where they have no peers); and many gaps too
small to be modelled one by one, on every rank (a launch overhead): wall-clock steps longer than the
replay, or untraced host time on the median rank (other causes hide a launch overhead: a host that
waits for a slow device has time to spare). It is scored by the what-if that models every gap as
host ops and removes them (``--gap-share 0 --zero kind=host``).
"""

from __future__ import annotations

import numpy as np

from laggard.diagnose import noise
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, step_peer_median, to_peers, weights_of
from laggard.diagnose.findings import Candidate
from laggard.engine.gaps import HOST_KIND
from laggard.results.diagnosis import Consistency, Finding
from laggard.whatif.custom import Change


def detect(ctx: Ctx, cfg: DiagnoseConfig) -> list[Candidate]:
    out: list[Candidate] = []
    host = ctx.kind_is(HOST_KIND)
    if host.any():
        out += _host_ranks(ctx, cfg, host)
    fidelity = ctx.res.replay_fidelity
    idle_med, everywhere = _overhead(ctx, cfg, out)
    if out and everywhere:
        # beside the overhead every rank pays, a rank's own host time is named only where it is
        # ``launch_rank_ratio`` x its peers' (as the overhead's worst rank) or its excess over them is
        # itself an overhead's share of the step (``_idle_floor``): stages differ in host work by design
        # (the last one runs the loss's Python glue between its passes, cut as host time), so a few
        # percent more host time on one stage beside an overhead every rank pays is its role, not a
        # stall; a stall stands out by a ratio or by a share of the step that role does not explain
        out = _host_ranks(ctx, cfg, host, beside_overhead=True)
        idle_med, everywhere = _overhead(ctx, cfg, out)
    if fidelity >= cfg.healthy_threshold or everywhere:
        out.append(_unmodelled(ctx, cfg, host, fidelity, idle_med if everywhere else 0.0, own_ranks(out)))
    return out


def own_ranks(cands: list[Candidate]) -> list[int]:
    """The ranks the launch-delay candidates among ``cands`` name for their own host time, in order."""
    return [w["rank"] for c in cands if c.finding.cause == "launch-delay" for w in c.finding.workers]


def _overhead(ctx: Ctx, cfg: DiagnoseConfig, own: list[Candidate]) -> tuple[float, bool]:
    """The median rank's untraced host time per step, and whether it is an overhead every rank pays,
    the ranks named for their own host time (``own``) left out: with few ranks one rank's stall pulls
    the median toward it, and the stall would read as an overhead every rank pays. The median rank is
    one rank, the lower of the middle two of an even count: of two ranks the mean is half one rank's
    stall, which neither pays, while the lower of two is what both pay at least."""
    gaps = ctx.base.gaps
    idle = (gaps.idle_s / max(gaps.num_steps, 1))[~np.isin(gaps.ranks, own_ranks(own))]
    idle_med = lower_median(idle)
    return idle_med, idle_med >= _idle_floor(ctx, cfg) * ctx.T_ideal


def lower_median(values: np.ndarray) -> float:
    """The median of ``values`` taken as one of them: the lower of the middle two of an even count (0
    when empty)."""
    v = np.sort(np.asarray(values, dtype=float))
    return float(v[(len(v) - 1) // 2]) if len(v) else 0.0


def _idle_floor(ctx: Ctx, cfg: DiagnoseConfig) -> float:
    """The median rank's untraced host time, as a share of the ideal step, that is a launch overhead:
    higher where the compute ops are CPU-side passes cut from a profiler trace, whose Python glue
    between passes every rank has (``DiagnoseConfig.launch_idle_share_host``)."""
    return cfg.launch_idle_share_host if ctx.host_passes else cfg.launch_idle_share


def _host_ranks(ctx: Ctx, cfg: DiagnoseConfig, host: np.ndarray, beside_overhead: bool = False) -> list[Candidate]:
    """Ranks whose host ops take well over their peers' (``beside_overhead``: beside an overhead every
    rank pays, see ``detect``)."""
    base = ctx.base
    nsteps = max(len(base.graph.steps), 1)
    ri = np.searchsorted(ctx.ranks, ctx.rank)
    excess = np.bincount(ri[host], weights=(ctx.w - base.ideal)[host], minlength=len(ctx.ranks)) / nsteps
    spent = np.bincount(ri[host], weights=ctx.w[host], minlength=len(ctx.ranks)) / nsteps
    top = float(excess.max())
    if top <= 0 or top < cfg.host_min_share * ctx.T_ideal:
        return []
    hot = np.flatnonzero(excess >= cfg.host_hot_share * top)
    hot = hot[np.argsort(-excess[hot])][: cfg.host_max_ranks]
    groups = peer_groups(ctx)
    if beside_overhead:
        med = {i: _peer_median(spent, groups, hot, i) for i in hot.tolist()}
        floor_s = _idle_floor(ctx, cfg) * ctx.T_ideal
        hot = np.array([i for i in hot.tolist() if spent[i] >= cfg.launch_rank_ratio * med[i]
                        or spent[i] - med[i] >= floor_s], dtype=np.int64)
        if not len(hot):
            return []
    # each named only when its host time stands out from the job's noise, steadily or in bursts
    judged = host_consistency(ctx, cfg, host, hot)
    hot = np.array([i for i in hot.tolist() if noise.stands_out(judged[i])], dtype=np.int64)
    if not len(hot) or len(hot) > cfg.host_max_rank_share * len(ctx.ranks):
        return []  # most ranks alike: the overhead every rank pays (``_unmodelled``), not theirs
    ranks = [int(ctx.ranks[i]) for i in hot]
    on = host & np.isin(ctx.rank, ranks)
    r0 = ranks[0]
    mine = host & (ctx.rank == r0)
    per_name = np.bincount(ctx.name[mine], weights=(ctx.w - base.ideal)[mine], minlength=len(ctx.names))
    where = ctx.names[int(np.argmax(per_name))].removeprefix("host:")
    of_stage = " of its stage" if ctx.num_dp > 1 else ""
    names = ", ".join(f"rank {r} (dp{ctx.worker_of[r]['dp_rank']}/pp{ctx.worker_of[r]['stage']})" for r in ranks[:4])
    # their host ops set to their stage peers' (``to_peers``), not to each host op type's median over
    # every rank, the stalled one included: with few ranks that median lies partway to the stall, and
    # the what-if would promise only part of what the stall costs
    changes = to_peers(ctx, [Change(action="fix", selector=f"rank={r},kind={HOST_KIND}") for r in ranks], host)
    finding = Finding(
        cause="launch-delay",
        workers=[ctx.worker_of[r] for r in ranks],
        stages=sorted({ctx.worker_of[r]["stage"] for r in ranks}),
        steps=ctx.steps_of(on & (ctx.w > base.ideal)),
        evidence=(
            f"{names}: {1e3 * spent[hot[0]]:.1f} ms per step of host time no traced op covers "
            f"(median of the other ranks{of_stage}: {1e3 * _peer_median(spent, groups, hot, hot[0]):.1f} ms), "
            f"mostly before {where}"
        ),
        fix=_host_fix(r0, judged[hot[0]].period),
        targets=[judged[i] for i in hot.tolist()],
    )
    return [Candidate(finding=finding, changes=changes, weights=weights_of(ctx, changes))]


def _host_fix(rank: int, period: int) -> str:
    """The fix for one rank's own host time; ``period``: its stalls come every that many steps, which
    is work the loop does on a schedule, not a loader or contention that strikes at random."""
    if period:
        return (f"find what rank {rank} does every {period} steps between its traced ops (a checkpoint, an "
                "evaluation, metrics or logs written synchronously): make it asynchronous, spread it over "
                "the ranks, or do it less often")
    return (f"find the host-side work on rank {rank} between its traced ops: a slow data loader (more workers, "
            "pin_memory, prefetching), Python overhead, CPU contention from other processes on its host")


def _peer_median(spent: np.ndarray, groups: np.ndarray, hot: np.ndarray, i: int) -> float:
    """The median host time per step of rank ``i``'s peers (its ``peer_groups``) not among ``hot``."""
    peers = spent[(groups == groups[i]) & ~np.isin(np.arange(len(spent)), hot)]
    return float(np.median(peers)) if len(peers) else 0.0


def peer_groups(ctx: Ctx) -> np.ndarray:
    """Per rank (``ctx.ranks`` order): the group whose other members are its reference for host time.
    With DP replicas, its stage: a stage's place in the pipeline sets how much of a host delay shows
    (a rank that then waits on a transfer absorbs it, one whose input is already there pays it, so the
    same delay on every rank shows on some stages and not on others). Without replicas, every rank."""
    if ctx.num_dp > 1:
        return ctx.rank_stage
    return np.zeros(len(ctx.ranks), dtype=np.int64)


def host_consistency(ctx: Ctx, cfg: DiagnoseConfig, host: np.ndarray, hot: np.ndarray,
                     values: np.ndarray | None = None, pool: np.ndarray | None = None) -> dict[int, Consistency]:
    """Per ``hot`` rank (index into ``ranks``): per step, its host time's excess over the median of its
    peers' (``peer_groups``) in that step, as a ratio of the step (1 + excess / ideal step: a reference of zero
    host time has no ratio of its own), judged against the same ratio of the ranks not hot (``pool``: of
    those, the ranks to judge against, default all). Host time: the ``host`` ops' durations, or their
    ``values`` (seconds per op)."""
    per = np.nan_to_num(ctx.per_rank_step(host, values))
    steps = ctx.step_numbers()[: per.shape[1]]
    n = len(ctx.ranks)
    ref = step_peer_median(per, peer_groups(ctx))
    ex = per - ref
    ratio = 1.0 + ex / max(ctx.T_ideal, 1e-12)
    pool = ~np.isin(np.arange(n), hot) if pool is None else pool & ~np.isin(np.arange(n), hot)
    return {int(i): noise.judge(f"rank {int(ctx.ranks[i])}", "host", ratio[i], ex[i], steps,
                                noise.noise_for(ratio, int(i), cfg, pool), cfg) for i in hot.tolist()}


def _outside_gc(ctx: Ctx, gaps: np.ndarray) -> np.ndarray:
    """The gaps before each op (seconds), those before a recorded garbage collection left out: the gap
    right before a collection is the pause's own start, the gc detector's: counted here too, a rank
    that collects more often than its peers would read as a host stall for the pauses the gc finding
    already names."""
    return np.where(ctx.gc, 0.0, gaps)


def _gaps_before(ctx: Ctx) -> np.ndarray:
    """Per op: the time (seconds) its rank was idle before it started, after its dependencies ended
    (0 for a collective's or a transfer's op, whose wait may be its peers')."""
    base, g = ctx.base, ctx.base.graph
    owner = np.repeat(np.arange(g.num_ops), np.diff(g.dep_ptr))
    ready = np.zeros(g.num_ops)
    if len(owner):
        np.maximum.at(ready, owner, base.end_s[g.dep_idx])
    has_dep = np.diff(g.dep_ptr) > 0
    return np.where(has_dep & ~ctx.synced, np.maximum(base.start_s - ready, 0.0), 0.0)


def _unmodelled(ctx: Ctx, cfg: DiagnoseConfig, host: np.ndarray, fidelity: float, idle_med_s: float,
                hot: list[int]) -> Candidate:
    """Many small gaps the model leaves out: scored by the what-if that models every gap as host ops
    and removes them (``--gap-share 0 --zero kind=host``) on every rank but ``hot`` (those the
    host-rank finding names: their excess is its): the speed-up if the untraced host work between
    ops went away, a number the user can replay; its share is capped at the job's gap (wall clock -
    ideal) (``explain.score_alone``), and is at least the median rank's untraced host time (what the
    step pays once the causes that hide it are fixed; ``Candidate.hidden_share``)."""
    raw = _gaps_before(ctx)
    per_type = np.bincount(ctx.name, weights=raw, minlength=len(ctx.names))
    gaps = _outside_gc(ctx, raw)
    per_rank = np.bincount(np.searchsorted(ctx.ranks, ctx.rank), weights=gaps, minlength=len(ctx.ranks))
    per_rank[np.isin(ctx.ranks, hot)] = -1.0
    nsteps = max(len(ctx.base.graph.steps), 1)
    worst = int(np.argmax(per_rank))
    # over the other ranks' median and over its stage peers' (``peer_groups``): one peer alone is a
    # poor yardstick on a busy host, and all ranks are no yardstick for a stage's place in the pipeline
    others = (np.arange(len(per_rank)) != worst) & (per_rank >= 0)
    groups = peer_groups(ctx)
    refs = [per_rank[others], per_rank[others & (groups == groups[worst])]]
    stands_out = all(len(r) for r in refs) and per_rank[worst] / nsteps >= cfg.host_min_share * ctx.T_ideal \
        and all(per_rank[worst] >= cfg.launch_rank_ratio * float(np.median(r)) for r in refs)
    # ... and only when its gaps stand out from the job's step-to-step noise, as every named rank: on
    # shared cores one rank of a clean pipeline is descheduled more than the others in a few steps
    judged = None
    if stands_out:
        judged = host_consistency(ctx, cfg, gaps > 0, np.array([worst]), gaps, per_rank >= 0)[worst]
        stands_out = noise.stands_out(judged) and _untraced_stands_out(ctx, cfg, host, gaps, worst, per_rank >= 0)
    hidden = ""
    if idle_med_s > 0:
        hidden = (f"; the median rank spends {1e3 * idle_med_s:.1f} ms per step of host time no traced op covers "
                  f"({100 * idle_med_s / ctx.T_ideal:.1f}% of the ideal step), which the other causes hide today "
                  "and the step pays once they are fixed")
    finding = Finding(
        cause="launch-delay",
        # the overhead every rank pays: job-wide, no rank named, unless one rank's gaps stand out from
        # the others' (``launch_rank_ratio``: an untraced stall on one rank in a profiler trace)
        workers=[ctx.worker_of[int(ctx.ranks[worst])]] if stands_out else [],
        evidence=(
            f"steps take {ctx.T_meas:.4g} s on the wall clock but the replay of the traced ops (steps back to back) "
            f"takes {float(np.mean(ctx.res.step_replayed_wall_s)):.4g} s "
            f"({fidelity:.3f}x): untraced gaps between ops, "
            f"{_quoted(ctx, hot + ([int(ctx.ranks[worst])] if stands_out else []))}, "
            f"mostly before {ctx.names[int(np.argmax(per_type))]}{hidden}"
        ),
        fix=overhead_fix(ctx),
        targets=[judged] if stands_out and judged is not None else [],
    )
    selector = ",".join([f"kind={HOST_KIND}"] + [f"rank!={r}" for r in hot])
    return Candidate(finding=finding, changes=[Change(action="zero", selector=selector)], gap_share=0.0,
                     hidden_share=min(_hidden_s(ctx, idle_med_s, hot) / ctx.gap, 1.0) if ctx.gap > 0 else 0.0)


def overhead_fix(ctx: Ctx) -> str:
    """The fix for untraced host time between ops: on a GPU the CPU-side work between kernel launches
    (CUDA graphs take the launches off the host); where the compute itself runs on the host's CPUs
    there are no launches, and the gaps are its Python, input and contention."""
    if ctx.cpu_compute:
        return ("find the host work between the traced ops (data loading, Python overhead, logging, host "
                "contention): profile the host, overlap data loading, move per-step work out of the loop")
    return ("find the CPU-side work between kernel launches (data loading, Python overhead, host contention): "
            "profile the host, overlap data loading, use CUDA graphs")


def _untraced_stands_out(ctx: Ctx, cfg: DiagnoseConfig, host: np.ndarray, gaps: np.ndarray, i: int,
                         pool: np.ndarray) -> bool:
    """Whether rank ``i``'s untraced host time as a whole (its host ops and the ``gaps`` too small to be
    one) stands out from the others' step-to-step spread of the same. Whether a descheduling on a busy
    host lands in a gap too small to model or in one the model holds as a host op is chance, so the
    small gaps alone spread far less from step to step than a rank's untraced time does: a rank whose
    small gaps ran a few ms over its peers' in most steps stands out against them and not against its
    whole untraced time, while a stall of its own adds to that as much as to its small gaps. ``host``:
    the ops of kind host."""
    untraced = np.where(host, ctx.w, 0.0) + gaps
    return noise.stands_out(host_consistency(ctx, cfg, host | (gaps > 0), np.array([i]), untraced, pool)[i])


def _quoted(ctx: Ctx, beyond: list[int]) -> str:
    """The ranks the overhead's evidence quotes: those with the most untraced host time (``GapSummary.
    idle_s``, modelled as host ops or not) among the ``beyond`` ranks, which stand out from the job's
    noise (named for their own host time, or this finding's rank); only the median rank's where none
    does: a rank within the noise, quoted for the gaps every rank has, reads as the one to look at."""
    gaps = ctx.base.gaps
    per = dict(zip(gaps.ranks.tolist(), (gaps.idle_s / max(gaps.num_steps, 1)).tolist(), strict=True))
    median = lower_median(np.array(list(per.values())))
    med = f"{1e3 * median:.1f} ms per step of host time on the median rank"
    top = sorted((r for r in dict.fromkeys(beyond) if r in per), key=lambda r: -per[r])[:4]
    if not top:
        return med
    return med + "; the most, beyond the job's noise: " + ", ".join(f"rank {r} {1e3 * per[r]:.1f} ms" for r in top)


def _hidden_s(ctx: Ctx, idle_med_s: float, own: list[int]) -> float:
    """The median rank's untraced host time per step (the ranks named for their own left out) that counts
    as slowdown once the causes hiding it are fixed: all of it where the ideal stands for the best fix
    (``Ctx.ideal_by_fix``); else only the gaps too small to be modelled as host ops, since the modelled
    ones every rank has are in the pooled ideal too (at their typical value)."""
    if ctx.ideal_by_fix or idle_med_s <= 0:
        return idle_med_s
    gaps = ctx.base.gaps
    keep = ~np.isin(gaps.ranks, own)
    left = ((gaps.idle_s - gaps.modelled_s) / max(gaps.num_steps, 1))[keep]
    return lower_median(left)
