"""``stage-imbalance``: one stage's row of the DP x PP heatmap is hot, or its compute is well over
what the other stages' workers do (often the last stage: the loss/logits layer). A noisier worker of
the row must not hide it; it becomes a worker finding of its own (``laggard.diagnose.worker``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from laggard.diagnose import noise
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, weights_of
from laggard.diagnose.findings import Candidate
from laggard.results.diagnosis import Consistency, Finding
from laggard.whatif.custom import Change


def hot_workers(ctx: Ctx, cfg: DiagnoseConfig) -> set[int]:
    """Workers whose S_w excess is at least ``hot_of_top`` of the top one (none on a flat heatmap)."""
    excess = {w["rank"]: w["slowdown"] - 1.0 for w in ctx.res.by_worker}
    top = max(excess.values())
    if top < (cfg.healthy_threshold - 1.0) * 0.5:
        return set()
    return {r for r, e in excess.items() if e >= cfg.hot_of_top * top}


def heavy_stages(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], slow_workers: list[int]) -> list[int]:
    """Rows of the heatmap that are hot (most workers hot in S_w) or heavy (most workers compute
    ``heavy_row_ratio`` x the other stages' median worker); the slow workers (``worker``) are left
    out of their row when some of it is left, so that most of a stage's replicas being slow GPUs
    does not make the stage heavy. With one worker per stage (a pure pipeline) a heavy stage and a
    slow GPU look the same: the row is its one worker, and the finding says so; there a slow worker
    (``worker.slow_workers``: ``worker_ratio`` x the other stages' median, beyond the noise) makes its
    stage heavy, as the worker finding has no stage peers to set it to (else a slow stage computing
    under ``heavy_row_ratio`` x the others' is named by neither finding)."""
    hot = hot_workers(ctx, cfg)
    by_stage = _rows(ctx, slow_workers)
    out = []
    for s, rs in by_stage.items():
        if _slow_worker_row(ctx, rs, slow_workers):
            out.append(s)
            continue
        others = [load[r] for r in load if ctx.worker_of[r]["stage"] != s]
        ref = float(np.median(others)) if others else 0.0
        heavy = sum(ref > 0 and load[r] >= cfg.heavy_row_ratio * ref for r in rs)
        num_hot = sum(r in hot for r in rs)
        if heavy > cfg.row_majority * len(rs) or num_hot > cfg.row_majority * len(rs):
            out.append(s)
    return out


def consistency(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], slow_workers: list[int],
                rows: dict[int, list[int]], stages: list[int] | None = None) -> dict[int, list[Consistency]]:
    """Per stage (of ``stages``; default all): its consistency (per step, the mean compute of its replicas in
    ``rows`` over the median of the other stages'), then each replica's; ``[]`` when it is not heavier beyond
    the noise.
    The stage must stand out from the step-to-step spread of the same ratio for the other stages
    (each over the stages other than it and this one; it shares what moves a whole pipeline, such as
    the sequences drawn); in a two-stage pipeline from one worker's spread (``noise.cell_sigma``) over
    its replicas and against the other stage's, and
    more than ``row_majority`` of its replicas must be heavy too: computing ``heavy_row_ratio`` x the
    other stages' median worker, standing out from the workers' noise (``worker.step_ratios``,
    each against its stage peers), carrying ``stage_replica_share`` of the stage's excess (over
    ``stage_replica_min_steps`` steps or more), or a slow worker left in a row that is all slow
    workers (a pure pipeline's): one slow replica makes a slow worker, not a heavy stage."""
    from laggard.diagnose.worker import named_by, step_ratios

    per = ctx.per_rank_step(ctx.compute)
    idx = {s: np.searchsorted(ctx.ranks, rs) for s, rs in rows.items()}
    pw = {s: _row_mean(per[i]) for s, i in idx.items()}  # per step: the mean compute of its replicas
    steps = ctx.step_numbers()[: per.shape[1]]
    stage_of = ctx.rank_stage
    wr = step_ratios(ctx, cfg, load)[0]
    out: dict[int, list[Consistency]] = {}
    for s, i in idx.items():
        if stages is not None and s not in stages:
            continue
        if _slow_worker_row(ctx, rows[s], slow_workers) and s < ctx.num_pp - 1:
            # a pure pipeline's stage is its one worker, judged by the worker detector against the
            # other ranks (the same ratio): not again against the spread of the other stages' ratios,
            # which the last stage's swings widen, so that a rank standing out from the other ranks'
            # noise would read as noise there. Not the last stage: its loss and logits make it heavier
            # than the others by design, by an amount that varies from run to run, and its row is
            # judged as a stage's
            (c,) = named_by(ctx, cfg, load, rows[s])
            if c.basis == "compute":  # (found by its effect on the step: judged as a stage's)
                out[s] = [dataclasses.replace(c, target=f"stage {s}"), c]
                continue
        others = [o for o in pw if o != s]
        if not others:
            out[s] = []
            continue
        ref = noise.row_median(np.stack([pw[o] for o in others]))
        ratio = noise.ratios(pw[s], ref)
        peers = [noise.ratios(pw[o], noise.row_median(np.stack([pw[x] for x in others if x != o]))) for o in others
                 if len(others) > 1]
        pool = (stage_of != s) & ~np.isin(ctx.ranks, slow_workers)
        if peers:
            # each peer's ratio is to one stage fewer than this stage's is: its spread overstates this
            # ratio's noise (3 stages: to one other stage against the median of two, sqrt(2 / 1.5))
            job = noise.noise_for(np.stack(peers), None, cfg)
            narrow = noise.ratio_sigma(1.0, len(others)) / noise.ratio_sigma(1.0, len(others) - 1)
            job = dataclasses.replace(job, sigma=max(job.sigma * narrow, cfg.noise_floor))
        else:  # two stages: one worker's step-to-step spread, over the stage's replicas, against the other's
            cell = noise.cell_sigma(per, pool if pool.any() else stage_of != s, cfg)
            job = noise.JobNoise(sigma=noise.ratio_sigma(cell / np.sqrt(len(i)), 1))
        row = noise.judge(f"stage {s}", "compute", ratio, pw[s] - ref, steps, job, cfg)
        wjob = noise.noise_for(wr, None, cfg, pool)
        reps = [noise.judge(f"rank {int(ctx.ranks[j])}", "compute", noise.ratios(per[j], ref), per[j] - ref, steps,
                            wjob, cfg) for j in i]
        ref_load = float(np.median([load[int(r)] for r in ctx.ranks[stage_of != s]]))
        # a replica left in its row only because all of it is slow (a pure pipeline's one worker) was
        # judged beyond the noise by the worker detector already
        stands = noise.stands_out(row, transient_ok=False)
        shared = stands and row.ratio > 1.0 and row.steps_total >= cfg.stage_replica_min_steps
        share = cfg.stage_replica_share * (row.ratio - 1.0) if shared else np.inf
        heavy = sum(noise.stands_out(c, transient_ok=False) or int(ctx.ranks[j]) in slow_workers
                    or load[int(ctx.ranks[j])] >= cfg.heavy_row_ratio * ref_load or c.ratio - 1.0 >= share
                    for c, j in zip(reps, i, strict=True))
        ok = stands and heavy > cfg.row_majority * len(reps)
        out[s] = [row, *reps] if ok else []
    return out


def _slow_worker_row(ctx: Ctx, row: list[int], slow_workers: list[int]) -> bool:
    """Whether ``row`` is a pure pipeline's stage that is its slow worker (one worker per stage)."""
    return ctx.num_dp == 1 and set(row) <= set(slow_workers)


def _row_mean(m: np.ndarray) -> np.ndarray:
    """The mean of each column over its rows, NaN ignored (NaN where a column has none)."""
    ok = np.isfinite(m)
    with np.errstate(invalid="ignore"):
        return np.where(ok.any(axis=0), np.where(ok, m, 0.0).sum(axis=0) / ok.sum(axis=0), np.nan)


def _rows(ctx: Ctx, slow_workers: list[int]) -> dict[int, list[int]]:
    """Each stage's workers, less its slow workers when some are left."""
    by_stage: dict[int, list[int]] = {}
    for r, w in ctx.worker_of.items():
        by_stage.setdefault(w["stage"], []).append(r)
    slow = set(slow_workers)
    return {s: [r for r in rs if r not in slow] or rs for s, rs in by_stage.items()}


def detect(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], slow_workers: list[int]) -> list[Candidate]:
    res = ctx.res
    out: list[Candidate] = []
    if ctx.num_pp <= 1:
        return out
    stage_ex = {s: v - 1.0 for s, v in res.by_stage.items()}
    # per-stage compute per worker, the slow workers left out (DP replicas may differ in number only
    # on broken traces)
    rows = _rows(ctx, slow_workers)
    heavy = heavy_stages(ctx, cfg, load, slow_workers)
    judged = consistency(ctx, cfg, load, slow_workers, rows, heavy)
    whole = _per_worker(ctx, rows, None)
    for s in heavy:
        if not judged[s]:
            continue  # its replicas compute within the job's noise of the other stages'
        # a stage slow in one run of steps only (its worker slowed, then recovered) is measured over
        # that run: over every step its healthy steps dilute the excess the noise gate found
        run = _run_steps(ctx, judged[s][0])
        per_worker = whole if run is None else _per_worker(ctx, rows, run)
        others = float(np.median(np.delete(per_worker, s)))
        ratio = per_worker[s] / max(others, 1e-12)
        if ratio < cfg.stage_compute_min:
            continue  # its compute is not heavier than the others'
        # a pure pipeline's stage whose one worker is slow beyond the noise (``slow_workers``) needs no
        # S_stage from ``pure_stage_ratio`` on: the pooled ideal keeps the pipeline's total work, so
        # S_stage stays near 1 even for a stage clearly heavier than the others
        pure_slow = _slow_worker_row(ctx, rows[s], slow_workers) and ratio >= cfg.pure_stage_ratio
        if ratio < cfg.heavy_row_ratio and not pure_slow:
            # hot in the heatmap but only a little heavier: its S_stage must stand out too
            others_ex = [v for k, v in stage_ex.items() if k != s]
            if stage_ex[s] <= 0 or stage_ex[s] < 0.5 * max(stage_ex.values()):
                continue
            if others_ex and stage_ex[s] < cfg.stage_vs_median * max(float(np.median(others_ex)), 0.0):
                continue  # every stage is hot: not one stage's problem
        rs = sorted(r for r, w in ctx.worker_of.items() if w["stage"] == s)
        if run is not None:
            cand = _run_candidate(ctx, s, rs, run, ratio, judged[s])
            if cand is not None:
                out.append(cand)
            continue
        changes = _scale_down(ctx, s, slow_workers)
        if not changes:
            continue
        share = 1.0 - float(per_worker.mean()) / per_worker[s] if per_worker[s] > 0 else 0.0
        ref_load = float(np.median([load[r] for r in load if ctx.worker_of[r]["stage"] != s]))
        num_heavy = sum(load[r] >= cfg.heavy_row_ratio * ref_load for r in rs)
        in_data, data_ratio = _data_share(ctx, s, rows[s])
        if in_data > cfg.data_share:
            out.append(_data_bound_stage(ctx, s, rs, in_data, data_ratio, changes, judged[s]))
            continue
        f = Finding(
            cause="stage-imbalance",
            stages=[int(s)],
            workers=[ctx.worker_of[r] for r in rs][:16],
            evidence=(
                f"stage {s} sets the pace: S_stage={res.by_stage[s]:.3f} "
                f"vs {np.median(list(res.by_stage.values())):.3f} "
                f"(median); its compute is {ratio:.2f}x the other stages'; {num_heavy} of its "
                f"{len(rs)} DP replicas compute over {cfg.heavy_row_ratio:.2f}x what the other stages' workers do"
                + (f" (one worker per stage: a slow GPU on rank {rs[0]} would look the same; if the stage's "
                   "layers do not explain it, check that GPU)" if ctx.num_dp == 1 else "")
            ),
            fix=(
                f"rebalance the pipeline: move about {100 * max(share, 0):.0f}% of stage {s}'s compute "
                f"({'the loss/logits layer' if s == ctx.num_pp - 1 else 'some layers'}) to other stages"
            ),
            fix_tool="partition",
            targets=judged[s],
        )
        out.append(Candidate(finding=f, changes=changes, weights=weights_of(ctx, changes)))
    return out


def _per_worker(ctx: Ctx, rows: dict[int, list[int]], steps: np.ndarray | None) -> np.ndarray:
    """Per stage, the compute of its workers in ``rows`` per worker, over the step indices ``steps``
    (None: every step)."""
    kept = np.isin(ctx.rank, [r for rs in rows.values() for r in rs]) & ctx.compute
    if steps is not None:
        kept &= np.isin(ctx.step, steps)
    per_stage = np.bincount(ctx.pp[kept], weights=ctx.w[kept], minlength=ctx.num_pp)
    workers_per_stage = np.maximum(np.bincount([ctx.worker_of[r]["stage"] for rs in rows.values() for r in rs],
                                               minlength=ctx.num_pp), 1)
    return per_stage / workers_per_stage


def _run_steps(ctx: Ctx, row: Consistency) -> np.ndarray | None:
    """The step indices of the one run of steps ``row`` (a stage's judgement) is slow in; None where it
    is not slow so (steady, or in bursts)."""
    if not (row.run and row.pattern == "transient" and row.slow_steps):
        return None
    return np.flatnonzero(np.isin(ctx.step_numbers(), row.slow_steps))


def _run_candidate(ctx: Ctx, s: int, rs: list[int], run: np.ndarray, ratio: float,
                   targets: list[Consistency]) -> Candidate | None:
    """Stage ``s`` slow in the run of step indices ``run`` only, ``ratio`` x the other stages' compute
    there: its layers are the same in every step, so no repartition fixes it; what slowed its workers
    in those steps does (one worker per stage: that worker's device or host). The fix replayed: each
    of its compute op types in the run at its own mean outside the run (None where no type is slower
    there)."""
    from laggard.results.diagnosis import step_spans

    numbers = ctx.step_numbers()
    first, last = int(numbers[run[0]]), int(numbers[run[-1]])
    on = (ctx.pp == s) & ctx.compute
    inside = np.isin(ctx.step, run)
    ref, ok = ctx.group_mean(on & ~inside, [ctx.name])
    mine, _ = ctx.group_mean(on & inside, [ctx.name])
    changes = []
    for c in np.unique(ctx.name[on & inside & ok]):
        i = int(np.flatnonzero(on & inside & (ctx.name == c))[0])
        if 0 < ref[i] < mine[i]:
            changes.append(Change(action="scale", selector=f"stage={s},step={first}-{last},optype={ctx.names[int(c)]}",
                                  factor=float(f"{ref[i] / mine[i]:.6g}")))
    if not changes:
        return None
    spans = step_spans([int(x) for x in numbers[run]])
    one = ctx.num_dp == 1
    who = f"rank {rs[0]}, the stage's one worker," if one else f"all {len(rs)} of its DP replicas"
    f = Finding(
        cause="worker" if one else "stage-imbalance",
        stages=[int(s)],
        workers=[ctx.worker_of[r] for r in rs][:16],
        steps=[int(x) for x in numbers[run]][:12],
        evidence=(f"stage {s} sets the pace in steps {spans} only: its compute there is {ratio:.2f}x the other "
                  f"stages' ({who} slow in those steps and at its usual speed in the others)"),
        fix=(f"check rank {rs[0]}'s device and host for steps {spans} (thermal throttling, clocks, a noisy "
             "neighbour, another job's load); its layers are the same in every step, so moving them would "
             "not help" if one else
             f"find what slowed every replica of stage {s} in steps {spans} (their nodes' load, their input, "
             "a shared link); its layers are the same in every step, so moving them would not help"),
        targets=targets,
    )
    return Candidate(finding=f, changes=changes, weights=weights_of(ctx, changes))


def _data_share(ctx: Ctx, s: int, row: list[int]) -> tuple[float, float]:
    """(the share of stage ``s``'s excess over the other stages' mean, op type by op type, that lies in
    its waits for input, those waits over the others'; ``worker.data_bound``) of its replicas ``row``."""
    from laggard.diagnose.worker import data_bound

    ref, ok = ctx.group_mean(ctx.compute & (ctx.pp != s), [ctx.name])
    mine = np.isin(ctx.rank, row) & ctx.compute & ok
    return data_bound(ctx, mine, ref) if mine.any() else (0.0, 1.0)


def _data_bound_stage(ctx: Ctx, s: int, rs: list[int], in_data: float, data_ratio: float, changes: list[Change],
                      targets: list[Consistency]) -> Candidate:
    """A heavy stage whose excess lies mostly in its waits for input: the input pipeline of its ranks
    to speed up (a pipeline's last stage reads the labels), not layers to move."""
    names = ", ".join(f"rank {r}" for r in rs[:4]) + (f" and {len(rs) - 4} more" if len(rs) > 4 else "")
    f = Finding(
        cause="data-loading",
        stages=[int(s)],
        workers=[ctx.worker_of[r] for r in rs][:16],
        evidence=(f"stage {s} ({names}) sets the pace: S_stage={ctx.res.by_stage[s]:.3f} vs "
                  f"{np.median(list(ctx.res.by_stage.values())):.3f} (median); its waits for input take "
                  f"{data_ratio:.2f}x the other stages' ({100 * in_data:.0f}% of its excess over them)"),
        fix=(f"speed up the input pipeline of stage {s} ({names}): more DataLoader workers, prefetching, pinned "
             "memory, a faster or local copy of its data; its layers and device are not the slow part"),
        targets=targets,
    )
    return Candidate(finding=f, changes=changes, weights=weights_of(ctx, changes))


def _scale_down(ctx: Ctx, s: int, slow_workers: list[int]) -> list[Change]:
    """Stage ``s``'s fix: one ``--scale`` per op type of its compute to the other stages' mean (the
    factor printed to 6 digits is the one replayed), leaving what a slow worker of the stage adds on
    top of its peers (that is the worker finding's). Only the op types over that level: a fix does
    not make a stage's op heavier (the last stage's forward holds the loss, so against the other
    stages' mean a first stage's forward, and any op type another stage runs more of, would be scaled
    up, and the time added would eat into what the fix gains). Empty when no op type of the stage is
    over it."""
    on = (ctx.pp == s) & ctx.compute
    ref, ok = ctx.group_mean(ctx.compute & (ctx.pp != s), [ctx.name])
    if not ok[on].any():
        return []
    row_ref = on & ~np.isin(ctx.rank, slow_workers)
    mine, mine_ok = ctx.group_mean(row_ref if row_ref.any() else on, [ctx.name])
    sel = on & ok & mine_ok & (mine > 0)
    changes = []
    for c in np.unique(ctx.name[sel]):
        i = int(np.flatnonzero(sel & (ctx.name == c))[0])
        if ref[i] < mine[i]:
            changes.append(Change(action="scale", selector=f"stage={s},optype={ctx.names[int(c)]}",
                                  factor=float(f"{ref[i] / mine[i]:.6g}")))
    return changes
