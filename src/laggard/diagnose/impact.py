"""A rank's own effect on the step, per step, judged against the job's noise.

Per step: the replay with only the rank's ops measured (every other op at its ideal) over the
all-ideal replay, i.e. S_w step by step. Unlike a compute ratio against peers, it does not depend on
which peer is the reference (a rank slower than one anomalously fast peer is not slower than the
ideal), and it counts whatever the rank does to the step: compute, host time, transfers. The job's
noise is the spread of the same series over up to ``rider_reference_ranks`` other ranks
(``laggard.diagnose.noise``). Used to drop riders from multi-rank worker findings (``worker``) and to
pick the rank a low-confidence finding names (``fallback``); a stage's own effect, against the other
stages', for the stage such a finding names (``stage_impact``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from laggard.diagnose import noise
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.results.diagnosis import Consistency


def step_impact(ctx: Ctx, cfg: DiagnoseConfig, ranks: list[int]) -> dict[int, Consistency]:
    """Each of ``ranks``' per-step S_w judged against the others' spread (see the module); empty when
    the replay would hold more than ``rider_max_cells`` op weights (several ranks of a 4,096-worker
    job) or no other rank can give the noise."""
    ratio = impact_ratios(ctx, cfg, ranks)
    if ratio is None:
        return {}
    return {r: judge_row(ctx, cfg, ratio, i, r) for i, r in enumerate(ranks)}


def judge_row(ctx: Ctx, cfg: DiagnoseConfig, ratio: np.ndarray, i: int, rank: int, target: str | None = None
              ) -> Consistency:
    """Row ``i`` of ``impact_ratios`` (rank ``rank``) judged against the other rows' spread, and, to be
    consistent, slow in more steps than the other rows' rate of slow steps gives by chance
    (``_more_than_chance``)."""
    steps = ctx.step_numbers()[: ratio.shape[1]]
    job = noise.noise_for(ratio, i, cfg)
    c = noise.judge(target or f"rank {rank}", "step", ratio[i], np.zeros(ratio.shape[1]), steps, job, cfg)
    return c if _more_than_chance(c, ratio[i], job, cfg) else dataclasses.replace(c, pattern="noise", run=False)


def _more_than_chance(c: Consistency, row: np.ndarray, job: noise.JobNoise, cfg: DiagnoseConfig) -> bool:
    """Whether a consistent (or run) judgement of an effect on the step holds against the others' rate
    of slow steps (binomial tail under ``impact_chance_p``). An effect on the step is the step's
    slowest rank: in a job of alike ranks each is the slowest in about 1/n of the steps and the others'
    effects sit at 1 in the rest, so their spread understates the noise, and a rank slow in half the
    steps of a short job is often only the one that happened to be slowest most."""
    if c.pattern not in ("consistent", "transient") or (c.pattern == "transient" and not c.run):
        return True
    bar = 1.0 + cfg.noise_step_k * job.sigma
    q = job.rate_over(bar)
    r = row[np.isfinite(row)]  # its slow steps over all steps (a run's description counts fewer)
    return q is None or noise.binom_tail(int(np.sum(r > bar)), len(r), q) < cfg.impact_chance_p


def impact_ratios(ctx: Ctx, cfg: DiagnoseConfig, ranks: list[int]) -> np.ndarray | None:
    """Per-step S_w (rows: ``ranks``, then up to ``rider_reference_ranks`` others, evenly spread);
    None where the replay would be too large or no other rank can give the noise."""
    from laggard.engine.baseline import replay_mixed

    others = [int(r) for r in ctx.ranks if int(r) not in ranks]
    stride = max(1, len(others) // max(cfg.rider_reference_ranks, 1))
    rows = list(ranks) + others[::stride][: cfg.rider_reference_ranks]
    if len(ctx.w) * (len(rows) + 1) > cfg.rider_max_cells or len(rows) < 2:
        return None
    # per row, that rank's ops measured and the rest ideal; and the all-ideal run
    ideal, alone = replay_mixed(ctx.base, (None, [0]), (ctx.rank, rows))
    return noise.ratios(alone.T, np.broadcast_to(ideal[:, 0], (len(rows), len(ideal))))


def stage_impact(ctx: Ctx, cfg: DiagnoseConfig, stages: list[int]) -> dict[int, Consistency]:
    """Each of ``stages``' per-step S_stage (the replay with only its ops measured over the all-ideal
    one) judged against the other stages' spread of the same; empty with one stage or where the replay
    would be too large (``rider_max_cells``)."""
    from laggard.engine.baseline import replay_mixed

    every = sorted({int(s) for s in ctx.pp.tolist()}) if len(ctx.pp) else []
    if len(every) < 2 or len(ctx.w) * (len(every) + 1) > cfg.rider_max_cells:
        return {}
    ideal, alone = replay_mixed(ctx.base, (None, [0]), (ctx.pp, every))
    ratio = noise.ratios(alone.T, np.broadcast_to(ideal[:, 0], (len(every), len(ideal))))
    return {s: judge_row(ctx, cfg, ratio, i, -1, target=f"stage {s}") for i, s in enumerate(every) if s in stages}


__all__ = ["impact_ratios", "judge_row", "stage_impact", "step_impact"]
