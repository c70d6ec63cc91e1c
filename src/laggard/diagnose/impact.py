"""A rank's own effect on the step, per step, judged against the job's noise.

Per step: the replay with only the rank's ops measured (every other op at its ideal) over the
all-ideal replay, i.e. S_w step by step. Unlike a compute ratio against peers, it does not depend on
which peer is the reference (a rank slower than one anomalously fast peer is not slower than the
ideal), and it counts whatever the rank does to the step: compute, host time, transfers. The job's
noise is the spread of the same series over up to ``rider_reference_ranks`` other ranks
(``laggard.diagnose.noise``). Used to drop riders from multi-rank worker findings (``worker``) and to
pick the rank a low-confidence finding names (``fallback``).
"""

from __future__ import annotations

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


def judge_row(ctx: Ctx, cfg: DiagnoseConfig, ratio: np.ndarray, i: int, rank: int) -> Consistency:
    """Row ``i`` of ``impact_ratios`` (rank ``rank``) judged against the other rows' spread."""
    steps = ctx.step_numbers()[: ratio.shape[1]]
    return noise.judge(f"rank {rank}", "step", ratio[i], np.zeros(ratio.shape[1]), steps,
                       noise.noise_for(ratio, i, cfg), cfg)


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


__all__ = ["impact_ratios", "judge_row", "step_impact"]
