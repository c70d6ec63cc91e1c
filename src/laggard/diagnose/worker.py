"""``worker``: workers whose compute is well above their peers' (the other DP replicas of their
stage), every one of them named: one slow GPU or eight, on one stage, one DP rank or scattered.

Compared with the peers of their own stage, a heavy stage does not make its workers look slow, and
a worker is not hidden by another cause that slows a different part of the job (the S_w heatmap is
a replay of the whole job, where one slow pipeline hides another)."""

from __future__ import annotations

import warnings

import numpy as np

from laggard.diagnose import noise
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import (
    Ctx,
    existing,
    fast_peer_ref,
    fast_peer_row_median,
    rows_mask,
    step_peer_median,
    weights_of,
)
from laggard.diagnose.findings import Candidate
from laggard.diagnose.impact import impact_ratios, judge_row, step_impact
from laggard.diagnose.microbatch import mb_expected, per_microbatch
from laggard.engine.selection import nan_median
from laggard.results.diagnosis import Consistency, Finding


def slow_workers(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], stalled: set[int] | None = None) -> list[int]:
    """Ranks computing ``worker_ratio`` x their stage peers, worst first, both per step and per
    microbatch (``per_microbatch``). Every stage of one DP rank may be slow at once (one bad node);
    a DP rank that drew long sequences in the few steps of a trace computes more per step, but not
    more per microbatch: its typical microbatch costs what its peers' do, a slow GPU's all cost more.
    ``stalled``: ranks named for their own host time (``yardsticks``)."""
    ranks = sorted(load)
    stage = np.array([ctx.worker_of[r]["stage"] for r in ranks])
    lv = np.array([load[r] for r in ranks])
    ctx.memo["worker.not_yardstick"] = not_yardstick = yardsticks(ctx, cfg, ranks, stalled or set())
    if ctx.num_dp > 1:
        ref = fast_peer_ref(_without(lv, ranks, not_yardstick), stage, cfg.worker_ratio)
    else:  # no DP replicas: compare with the other stages
        ref = np.full(len(lv), float(np.median(lv)))
    rel = lv / np.maximum(ref, 1e-12)
    per_mb: dict[int, float] = {}
    if ctx.num_dp > 1:
        per_mb = per_microbatch(ctx, cfg)
        if per_mb:
            per_mb_rel = np.array([per_mb.get(r, np.inf) for r in ranks])
            rel = np.minimum(rel, np.maximum(per_mb_rel, _outside_passes(ctx, cfg, ranks, stage, ref)))
    keep = rel >= cfg.worker_ratio
    order = np.argsort(-rel[keep], kind="stable")
    flagged = [int(r) for r in np.array(ranks)[keep][order]]
    # named only when consistently slow beyond the job's noise (a noisy rank of a busy host, whose
    # median step happens to clear ``worker_ratio`` x its fastest peer's, is not a slow GPU)
    judged = consistency(ctx, cfg, load, flagged)
    slow = [r for r in flagged if noise.stands_out(judged[r], transient_ok=False)]
    if slow and len(slow) < len(flagged):
        # the flagged ranks within the noise are the job's noise: judged again with them in the pool
        # (left out, they narrow the noise the rest are judged against, and a rank that only shares a
        # busy host's jitter reads as consistent)
        judged = consistency(ctx, cfg, load, slow)
        slow = [r for r in slow if noise.stands_out(judged[r], transient_ok=False)]
    # a rank whose every fast peer is no yardstick has none (its reference is inf): never named
    off = {r for r, x in zip(ranks, ref.tolist(), strict=True) if np.isinf(x)}
    slow = [r for r in slow if r not in off]
    # ...or by their effect on the step, where their microbatch passes themselves are slow (not work
    # outside them: a rank with more garbage collections than its peers is not a slow worker; a trace
    # without microbatches, or a pure pipeline, has no per-pass ratio and is not held to it); or slow
    # in one run of steps (a straggler that recovers or starts late: its median step is a healthy one)
    slow += by_impact(ctx, cfg, [r for r in flagged if r not in slow and per_mb.get(r, np.inf) >= cfg.worker_ratio])
    slow += [r for r in by_run(ctx, cfg, load, flagged, slow) if r not in off]
    slow += [r for r in by_window(ctx, cfg, flagged, slow) if r not in off]
    riders = impact_riders(ctx, cfg, slow)
    return [r for r in slow if r not in riders]


def by_run(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], flagged: list[int], slow: list[int]) -> list[int]:
    """Ranks not yet ``slow`` that are slow in one contiguous run of steps and healthy outside it, beyond
    the job's noise (``noise``'s run rule): a straggler that recovers halfway, or starts late, computes
    at its peers' speed in its median step, which ``slow_workers`` compares, and its compute ratio over
    every step reads as noise. Judged as ``consistency`` judges, against the ranks neither ``flagged``
    nor nominated here; their judgements are kept in ``ctx.memo`` for ``named_by``."""
    cands = run_flags(ctx, cfg, load, slow)
    judged = _consistency(ctx, cfg, load, list(dict.fromkeys(cands + flagged)), runs=True) if cands else {}
    found = {r: judged[r] for r in cands if judged[r].run}
    ctx.memo["worker.by_run"] = found
    return list(found)


def by_window(ctx: Ctx, cfg: DiagnoseConfig, flagged: list[int], slow: list[int]) -> list[int]:
    """DP ranks not yet ``slow`` that are slow input pipelines in bursts: their compute and input waits
    together over their stage peers', summed over windows of a few consecutive steps
    (``cfg.worker_window_steps``, the smallest that is), consistent beyond the noise of the same window
    ratio for the others, over ``worker_ratio`` x their peers' on average, and their excess mostly in
    their waits for input (``data_bound`` over ``data_share``). A DataLoader with W workers that cannot
    keep up hands its batches over W at a time, so every W-th step waits the whole shortfall and the
    others none: the rank's median step, which ``slow_workers`` compares, is a healthy one, and step by
    step it reads as bursts. That is the mechanism, so only input waits are judged so: compute in
    bursts has no such cause, and on a shared host a rank that runs more of the job's Python (rank 0's
    logging) computes in bursts too. The judgements are kept in ``ctx.memo`` for ``named_by``."""
    ctx.memo["worker.by_window"] = {}
    if ctx.num_dp < 2:  # no replicas doing the same work to compare a rank's input waits with
        return []
    per = np.nan_to_num(ctx.per_rank_step(ctx.compute))
    ns = per.shape[1]
    stage = ctx.rank_stage
    ref = step_peer_median(per, stage)  # per step, the stage's other ranks
    num_ref = np.bincount(stage)[stage] - 1
    mean_ratio = per.sum(axis=1) / np.maximum(ref.sum(axis=1), 1e-12)
    cands = [int(r) for i, r in enumerate(ctx.ranks.tolist())
             if int(r) not in slow and num_ref[i] > 0 and mean_ratio[i] >= cfg.worker_ratio]
    if cands:
        gm, _ = ctx.group_mean(ctx.compute & ~np.isin(ctx.rank, cands), [ctx.name, ctx.pp])
        cands = [r for r in cands if data_bound(ctx, (ctx.rank == r) & ctx.compute, gm)[0] > cfg.data_share]
    if not cands:
        return []
    pool = ~np.isin(ctx.ranks, list(flagged) + cands)
    steps = ctx.step_numbers()[:ns]
    found: dict[int, Consistency] = {}
    for b in sorted(set(cfg.worker_window_steps)):
        nb = ns // b
        if b < 2 or nb < cfg.worker_window_min or len(found) == len(cands):
            continue
        wp, wf = _windows(per, b), _windows(ref, b)
        wr, wex = noise.ratios(wp, wf), _windows(per - ref, b) / b
        for r in cands:
            if r in found:
                continue
            i = int(np.searchsorted(ctx.ranks, r))
            others = np.arange(len(ctx.ranks)) != i
            rows = others & pool if (others & pool).sum() >= 2 else others
            sig = noise.ratio_sigma(noise.cell_sigma(wp, rows, cfg, whole_for_two=True), int(num_ref[i]))
            job = noise.JobNoise.of(sig, wr[rows], cfg)
            c = noise.judge(f"rank {r}", "compute", wr[i], wex[i], steps[: nb * b : b], job, cfg)
            if c.pattern == "consistent":
                c.window_steps = b
                found[r] = c
    ctx.memo["worker.by_window"] = found
    return [r for r in cands if r in found]


def _windows(m: np.ndarray, b: int) -> np.ndarray:
    """Per row, the sums of ``b`` consecutive columns (the trailing part window left out); NaN where a
    window holds a NaN (a step the rank has no value in: its window has none to compare)."""
    nb = m.shape[1] // b
    return m[:, : nb * b].reshape(m.shape[0], nb, b).sum(axis=2)


def run_flags(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], named: list[int], top: int = 8) -> list[int]:
    """Ranks not ``named`` whose compute is ``worker_ratio`` x their reference's (``step_ratios``) in one
    run of consecutive steps, long enough for the noise gate's run rule to judge. At most ``top`` of
    them, the longest runs first."""
    ratio = step_ratios(ctx, cfg, load)[0]
    n = ratio.shape[1]
    floor = max(cfg.noise_transient_min_steps, 2)
    found = []
    for i, r in enumerate(ctx.ranks.tolist()):
        if int(r) in named:
            continue
        _, length = noise.longest_run(np.nan_to_num(ratio[i], nan=0.0) >= cfg.worker_ratio)
        least = max(floor, cfg.noise_run_share * n)
        if length >= least and n - length > least:
            found.append((-length, int(r)))
    return [r for _, r in sorted(found)[:top]]


def yardsticks(ctx: Ctx, cfg: DiagnoseConfig, ranks: list[int], stalled: set[int]) -> frozenset[int]:
    """The ranks of ``stalled`` (named for their own host time) left out of their peers' yardstick of
    compute speed: where compute runs on the host's CPUs (``ctx.cpu_compute``), a stalled rank computes
    while its peers wait for it, on the cores they leave idle, so its compute is faster than a healthy
    rank's and its peers read slow beside it; left in, the stall's echo names healthy ranks as slow
    workers. A GPU's kernels are no faster for its host thread's stall: there every rank stays a
    yardstick. So does every rank where all of them are stalled (nobody else to compare with).
    ``cfg.worker_stalled_yardstick`` keeps them all in."""
    if cfg.worker_stalled_yardstick or not stalled or ctx.num_dp < 2 or not ctx.cpu_compute:
        return frozenset()
    out = frozenset(r for r in ranks if r in stalled)
    return out if len(out) < len(ranks) else frozenset()


def _without(values: np.ndarray, ranks: list[int] | np.ndarray, left_out: frozenset[int]) -> np.ndarray:
    """``values`` (one per rank of ``ranks``) with the ranks of ``left_out`` at inf: never a fast peer
    of another rank (``context.fast_peer_ref``), while their own reference is still their peers'."""
    if not left_out:
        return values
    out = np.array(values, dtype=float, copy=True)
    out[np.isin(np.asarray(ranks), list(left_out))] = np.inf
    return out


def by_impact(ctx: Ctx, cfg: DiagnoseConfig, ranks: list[int]) -> list[int]:
    """Of flagged ``ranks`` whose compute ratio stays within the noise, the one whose own effect on the
    step (``laggard.diagnose.impact``) makes it the job's dominant straggler: over
    ``worker_impact_min_steps`` steps or more, consistently above the job's noise, its median
    ``worker_impact_k`` sigma over 1; and no other rank's effect larger (a healthy rank computing
    slower beside a host stall on another rank, on cores the stall keeps busy, is not named for it).
    Its judgement is kept in ``ctx.memo`` for ``detect``.

    On a host short of CPU every rank's compute speed swings with the others' load, and the compute
    ratio's noise with it: a rank steadily slower than its peers can sit within that widened noise,
    while its effect on the step stands far above the other ranks' effects, whose spread stays narrow
    (they are not the step's slowest); without this rule only a low-confidence finding names it."""
    ctx.memo["worker.by_impact"] = {}
    # not in the job with found causes fixed: their side effects stay in the other ranks' measured ops
    # (compute stretched on the cores a fixed host stall kept busy), and the dominant straggler left
    # there is that contention: naming it would name a healthy rank for the stall's side effect
    enough = len(ctx.step_numbers()) >= cfg.worker_impact_min_steps
    ratio = impact_ratios(ctx, cfg, ranks) if ranks and enough and not ctx.fixed else None
    if ratio is None:
        return []
    level = nan_median(ratio, 1)
    top = int(np.nanargmax(np.where(np.isfinite(level), level, -np.inf)))
    if top >= len(ranks):  # a rank not flagged slow has the largest effect on the step
        return []
    c = judge_row(ctx, cfg, ratio, top, ranks[top])
    if not (c.pattern == "consistent" or c.run) or c.ratio - 1.0 < cfg.worker_impact_k * c.noise:
        return []
    ctx.memo["worker.by_impact"] = {ranks[top]: c}
    return [ranks[top]]


def _outside_passes(ctx: Ctx, cfg: DiagnoseConfig, ranks: list[int], stage: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per rank: 1 + its compute outside the microbatch passes (the optimizer, work between passes)
    over its fast stage peers' (the median per step, as ``worker_loads``), as a share of their whole
    compute (``ref``). The per-microbatch speed clears a rank whose passes only drew longer sequences;
    it must not clear one whose extra work is outside them (work a slow rank runs after its backward
    reads as optimizer work, and its passes alone look healthy)."""
    other = nan_median(outside_compute(ctx), 1)
    idx = np.searchsorted(ctx.ranks, ranks)
    lo = np.nan_to_num(other[idx], nan=0.0)
    ref_other = fast_peer_ref(lo, stage, cfg.worker_ratio)
    return 1.0 + np.maximum(lo - ref_other, 0.0) / np.maximum(ref, 1e-12)


def impact_riders(ctx: Ctx, cfg: DiagnoseConfig, ranks: list[int]) -> set[int]:
    """Of several slow ``ranks``, those that ride along: alone, their steps are within the job's noise
    while another of ``ranks`` stands out (``laggard.diagnose.impact``). The compute ratio against
    fast peers names a rank slower than one anomalously fast peer (beside it, healthy ranks clear
    ``worker_ratio`` next to the true straggler); its own effect on the step shows whether it slows
    the job."""
    if len(ranks) < 2:
        return set()
    judged = step_impact(ctx, cfg, ranks)
    if not any(c.pattern == "consistent" or c.run for c in judged.values()):
        return set()
    return {r for r, c in judged.items() if c.pattern == "noise"}


def consistency(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], ranks: list[int]) -> dict[int, Consistency]:
    """Each of ``ranks``' per-step compute speed over its fast stage peers' in that step
    (``step_ratios``), judged against the job's noise (``laggard.diagnose.noise``): the step-to-step
    spread of one rank's speed, pooled over the ranks not in ``ranks`` (every other rank when that
    leaves none), widened for a reference of few peers (``noise.ratio_sigma``). Kept per job for the
    last ``ranks`` and ``cfg`` (``ctx.memo``): ``detect`` judges again the ranks ``slow_workers`` judged,
    where all of them stood out."""
    if not ranks:
        return {}
    last = ctx.memo.get("worker.consistency")
    if last is not None and last[0] == ranks and last[1] == cfg:
        return dict(last[2])
    out = _consistency(ctx, cfg, load, ranks)
    ctx.memo["worker.consistency"] = list(ranks), cfg, dict(out)
    return out


def _consistency(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], ranks: list[int],
                 runs: bool = False) -> dict[int, Consistency]:
    ratio, excess = step_ratios(ctx, cfg, load)
    speed, num_ref = ctx.memo["worker.speed"]
    pool = ~np.isin(ctx.ranks, ranks)
    steps = ctx.step_numbers()[: ratio.shape[1]]
    out = {}
    for r in ranks:
        i = int(np.searchsorted(ctx.ranks, r))
        others = np.arange(len(ctx.ranks)) != i
        rows = others & pool if np.isfinite(speed[others & pool]).sum() >= 2 else others
        sig = noise.ratio_sigma(noise.cell_sigma(speed, rows, cfg), int(num_ref[i]))
        job = noise.JobNoise.of(sig, ratio[rows], cfg)
        out[r] = noise.judge(f"rank {r}", "compute", ratio[i], excess[i], steps, job, cfg, runs=runs)
    return out


def step_ratios(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """Per (rank, step): its compute speed over its reference's, and the excess in seconds (its
    compute less what it takes at the reference's speed). Speed: with DP replicas, the step's forward
    and backward time over what they should cost (``mb_expected``: the sequences drawn move a step's
    compute by tens of %, not its speed); else, and in traces without microbatches, the step's
    compute. The reference is the median of the rank's fast stage peers (``context.fast_peers`` on
    the medians over steps, as ``slow_workers`` compares them) in that step; with one worker per
    stage, the other ranks'. Computed once per job (``ctx.memo``, with the speeds and each rank's
    number of reference peers under ``worker.speed``)."""
    left_out = ctx.memo.get("worker.not_yardstick", frozenset())
    if ctx.memo.get("worker.step_ratios.left_out") == left_out and "worker.step_ratios" in ctx.memo:
        return ctx.memo["worker.step_ratios"]
    per = ctx.per_rank_step(ctx.compute)
    speed = per
    mb = mb_expected(ctx) if ctx.num_dp > 1 else None
    if mb is not None:
        rows, expected = mb
        mask = rows_mask(len(ctx.w), rows)
        spent = ctx.per_rank_step(mask)
        w_exp = np.zeros(len(ctx.w))
        w_exp[rows] = expected
        exp_spent = np.where(spent > 0, ctx.per_rank_step(mask, w_exp), np.nan)
        speed = _with_outside_work(ctx, cfg, spent, exp_spent)
    n = len(ctx.ranks)
    if ctx.num_dp > 1:
        lv = np.array([load[int(r)] for r in ctx.ranks]) if mb is None else nan_median(speed, 1)
        stage = ctx.rank_stage
        # each rank's row_median over its fast peers' rows, all ranks at once; the ranks that are no
        # yardstick (``yardsticks``) are no rank's fast peer
        lv = _without(np.nan_to_num(lv, nan=np.inf), ctx.ranks, left_out)
        ref, num_ref = fast_peer_row_median(lv, speed, stage, cfg.worker_ratio)
    else:
        ref = np.full(per.shape, np.nan)
        for i in range(n if n > 1 else 0):
            ref[i] = noise.row_median(speed[np.delete(np.arange(n), i)])
        num_ref = np.full(n, n - 1)
    ratio = noise.ratios(speed, ref)
    ctx.memo["worker.speed"] = speed, num_ref
    ctx.memo["worker.step_ratios"] = ratio, per * (1.0 - 1.0 / ratio)
    ctx.memo["worker.step_ratios.left_out"] = left_out
    return ctx.memo["worker.step_ratios"]


def _with_outside_work(ctx: Ctx, cfg: DiagnoseConfig, spent: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Per (rank, step): the passes' speed (time over expected cost); for a rank whose compute outside
    the passes (optimizer, work between passes) makes it ``worker_ratio`` x slower still (the median
    over steps), that compute counted too, against its stage peers' per-step median: a slow rank's
    extra work may run outside its passes (after its backward), where the passes' speed alone shows
    none of it; for every other rank the speed stays its passes' (their step-to-step spread is the
    job's noise, and optimizer time would only widen it)."""
    speed = spent / expected
    other = np.nan_to_num(outside_compute(ctx), nan=0.0)
    other_ref = step_peer_median(other, ctx.rank_stage)  # the same step's other ranks of its stage
    whole = (spent + other) / (expected + other_ref)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rank with no pass in any step: all NaN
        heavy = nan_median(whole / speed, 1) >= cfg.worker_ratio
    speed[heavy] = whole[heavy]
    return speed


def outside_compute(ctx: Ctx) -> np.ndarray:
    """Seconds of compute per (rank, step) outside the passes ``mb_expected`` has a cost for (the
    optimizer, work between passes; ``Ctx.per_rank_step``: NaN where the rank ran nothing); every
    compute op where there are none. Computed once per job (``ctx.memo``): ``slow_workers`` and
    ``step_ratios`` both read it."""
    if "worker.outside_compute" not in ctx.memo:
        mb = mb_expected(ctx)
        passes = rows_mask(len(ctx.w), mb[0]) if mb is not None else np.zeros(len(ctx.w), dtype=bool)
        ctx.memo["worker.outside_compute"] = ctx.per_rank_step(ctx.compute & ~passes)
    return ctx.memo["worker.outside_compute"]


def detect(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], cells: list[int]) -> list[Candidate]:
    if not cells:
        return []
    on = np.isin(ctx.rank, cells) & ctx.compute
    ref, ok = ctx.group_mean(ctx.compute & ~np.isin(ctx.rank, cells), [ctx.name, ctx.pp])
    if not ok[on].any():
        return []
    cells = worth_naming(ctx, cfg, cells)
    changes = _peer_changes(ctx, cells)
    sw = {x["rank"]: x["slowdown"] for x in ctx.res.by_worker}
    r0 = cells[0]
    mine = (ctx.rank == r0) & ctx.compute
    ratio = ctx.w[mine].sum() / max(ref[mine].sum(), 1e-12)
    wk = ctx.worker_of[r0]
    names = ", ".join(f"rank {r} (dp{ctx.worker_of[r]['dp_rank']}/pp{ctx.worker_of[r]['stage']})" for r in cells[:4])
    more = f" and {len(cells) - 4} more" if len(cells) > 4 else ""
    lead = f"{names}{more}: S_w={sw[r0]:.3f} vs {np.median(list(sw.values())):.3f} (median worker); rank {r0}'s "
    others = f" (and of {len(cells) - 1} more)" if len(cells) > 1 else ""
    in_data, data_ratio = data_bound(ctx, mine, ref)
    if in_data > cfg.data_share:
        cause = "data-loading"
        evidence = (f"{lead}waits for its input take {data_ratio:.2f}x its peers' on stage {wk['stage']} "
                    f"({100 * in_data:.0f}% of its excess over them)")
        fix = (f"speed up the input pipeline of rank {r0}{others}: more DataLoader workers, prefetching, pinned "
               "memory, a faster or local copy of its data; its device is not the slow part")
    else:
        cause = "worker"
        evidence = f"{lead}compute takes {ratio:.2f}x what its peers on stage {wk['stage']} take"
        fix = (f"drain the node of rank {r0}{others} and check it "
               "(thermal throttling, clocks, ECC errors, noisy neighbours)")
    f = Finding(
        cause=cause,
        workers=[ctx.worker_of[r] for r in cells],
        stages=sorted({ctx.worker_of[r]["stage"] for r in cells}),
        evidence=evidence,
        fix=fix,
        targets=named_by(ctx, cfg, load, cells),
    )
    return [Candidate(finding=f, changes=changes, weights=weights_of(ctx, changes))]


def data_bound(ctx: Ctx, mine: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(the share of the excess of the ops ``mine`` over their reference durations ``ref`` that lies in
    traced waits for input, kind other: the DataLoader's next batch; those waits' total over their
    reference's). The part whose time is over its peers' is the part to fix: a rank or stage slow
    mostly in its input waits is slow at loading its input, whatever its device; GC is not compute
    and has its own detector. Shared by the slow-worker and heavy-stage findings, so one rule names
    the cause wherever the slow rank is compared.

    The excess is netted per rank and op type before the negative parts are dropped: the reference is
    an op type's mean, and where one type runs as a long and a short span in each step (a model's
    forward beside a head's) or one span varies from step to step, every long span is over the mean
    and every short one under it. Clipped op by op, those differences (which sum to nothing) would
    count as excess and dilute a real one; netted, only a type the rank spends more time in counts."""
    sel = np.flatnonzero(mine)
    if not len(sel):
        return 0.0, 1.0
    d = np.nan_to_num(ctx.w[sel] - ref[sel])
    groups, at = np.unique(np.stack([ctx.rank[sel], ctx.name[sel]]), axis=1, return_inverse=True)
    net = np.bincount(at.ravel(), weights=d, minlength=groups.shape[1]).clip(0)
    is_data = np.bincount(at.ravel(), weights=ctx.kind_is("other")[sel].astype(float),
                          minlength=groups.shape[1]) > 0
    excess, data_excess = float(net.sum()), float(net[is_data].sum())
    data = mine & ctx.kind_is("other")
    ratio = float(ctx.w[data].sum() / max(float(np.nan_to_num(ref[data]).sum()), 1e-12))
    return (data_excess / excess if excess > 0 else 0.0), ratio


def _peer_changes(ctx: Ctx, cells: list[int]) -> list:
    """Each slow worker's compute set to its stage peers' mean, op type by op type."""
    from laggard.whatif.custom import Change

    return [Change(action="peer", selector=s)
            for r in cells for s in existing(ctx, [f"rank={r},kind=compute", f"rank={r},kind=other"])]


def worth_naming(ctx: Ctx, cfg: DiagnoseConfig, cells: list[int]) -> list[int]:
    """Of several slow ``cells``, those that carry ``worker_marginal_share`` of what fixing all of them
    removes from the step: the step with every other cell fixed less the step with all of them, over the
    measured step less the latter. A rank that is slower
    than its peers by a sliver of the step (a TP peer's compute held up beside a slow partner, a rank
    that drew a heavier share of the host) passes the compute-ratio test yet gives the step nothing;
    draining its node fixes nothing. Two equally slow ranks each carry all of it: with the other fixed,
    each is alone the straggler. Judged only where the joint fix gains ``min_named_gain``: behind
    another cause (a heavy stage) the step shows no rank's part, and all are kept. At most
    ``worker_marginal_max`` cells are judged (one replay each); beyond that all are kept."""
    if len(cells) < 2 or len(cells) > cfg.worker_marginal_max:
        return cells
    from laggard.engine.replay import replay_steps

    w = np.stack([weights_of(ctx, _peer_changes(ctx, cells))]
                 + [weights_of(ctx, _peer_changes(ctx, [c for c in cells if c != r])) for r in cells], axis=1)
    t = replay_steps(ctx.base.graph, w).mean(axis=0)
    removed = ctx.T - t[0]
    if t[0] <= 0 or ctx.T / t[0] < cfg.min_named_gain:  # hidden behind another cause: no part to judge
        return cells
    keep = [r for r, x in zip(cells, t[1:], strict=True) if (x - t[0]) / removed >= cfg.worker_marginal_share]
    return keep or cells[:1]


def named_by(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], cells: list[int]) -> list[Consistency]:
    """Each slow rank's consistency (of ``slow_workers``' ranks): its compute ratio's, or its effect on
    the step's where that is what it was found by (``by_impact``), its run's (``by_run``), or its
    windows' (``by_window``)."""
    impact = {**(ctx.memo.get("worker.by_run") or {}), **(ctx.memo.get("worker.by_window") or {}),
              **(ctx.memo.get("worker.by_impact") or {})}
    judged = consistency(ctx, cfg, load, [r for r in cells if r not in impact])
    return [impact[r] if r in impact else judged[r] for r in cells]
