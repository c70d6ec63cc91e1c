"""What-if analysis: replay the job with parts of it idealised and measure what each part costs.

Following Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis"
(OSDI '25): the *ideal* duration of an op is the mean (compute) or the median (communication
transfer) of its op type, pooled over all workers, steps and microbatches (one pool per span where a
capture splits a type into several spans a step: ``laggard.engine.sameop``). The straggler slowdown
is S = T / T_ideal, where T is the replayed step time with measured durations (launch gaps
removed) and T_ideal the replayed step time with every op idealised. Attributions keep one part
(an op type, a DP rank, a stage) as measured and everything else ideal.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.engine.baseline import Baseline, _batch_size, prepare, replay_mixed
from laggard.engine.gaps import GapConfig
from laggard.engine.replay import replay_steps
from laggard.engine.replay_chain import chained_wall_step_times, plan_chain
from laggard.errors import LaggardWarning
from laggard.optable.ops import Job, unique_first
from laggard.results.analysis import Analysis, Explained

if TYPE_CHECKING:
    from laggard.engine.symmetry import DPReduction

TOP_WORKER_SHARE = 0.03


# above this many DP ranks, per-DP-rank what-ifs replay a two-rank equivalent job (laggard.engine.symmetry)
DP_REDUCTION_MIN = 8


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return num.mean(axis=0) / den.mean(axis=0)


def _explain(base: Baseline, mask: np.ndarray, T: float, T_ideal: float) -> Explained:
    # removal: these ops ideal, the rest measured; addition: these ops measured, the rest ideal
    st_rem, st_add = replay_mixed(base, (mask, [False]), (mask, [True]))
    return _explained(float(st_rem.mean()), float(st_add.mean()), T, T_ideal)


def _explained(t_rem: float, t_add: float, T: float, T_ideal: float) -> Explained:
    gap = T - T_ideal
    return Explained(
        removed=(T - t_rem) / gap if gap > 0 else float("nan"),
        added=(t_add - T_ideal) / gap if gap > 0 else float("nan"),
        T_rem_s=t_rem,
        T_add_s=t_add,
    )


def analyze(job: Job, *, gaps: GapConfig | None = None) -> Analysis:
    """The what-if analysis of a job (see the module docstring); its diagnosis is added one level
    up, by ``laggard.analysis.pipeline.analyze``. ``gaps``: when untraced host time becomes host ops
    (``GapConfig(enabled=False)``: the published method, gaps left out)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        base = prepare(job, gaps)
        res = _analyze(base)
        from laggard.engine.arrivals import job_extras

        res.extras.update(job_extras(base.job))
        res.extras["untraced_gaps"] = base.gaps.to_json()
    for w in caught:
        if issubclass(w.category, LaggardWarning):
            res.warnings.append(str(w.message))
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    res.warnings = list(job.warnings) + [w for w in res.warnings if w not in job.warnings]
    return res


def _analyze(base: Baseline) -> Analysis:
    g = base.graph
    blocks, dps, stages, reduction, tp_col, tps = _scenarios(base)
    st_base, st_type, st_pp, st_ms, st_kind, *rest = replay_mixed(base, *blocks)
    st_tp = rest.pop(0) if len(tps) > 1 else None
    st_meas, st_ideal = st_base[:, 0], st_base[:, 1]
    T, T_ideal = float(st_meas.mean()), float(st_ideal.mean())
    slowdown = T / T_ideal
    by_optype = dict(zip(base.attr_names, _ratio(st_type, st_ideal[:, None]).tolist(), strict=True))
    by_opkind = dict(zip(("compute", "comm"), _ratio(st_kind, st_ideal[:, None]).tolist(), strict=True))
    st_dp = rest[0] if reduction is None else by_dp_rank_step_times(base, dps, reduction)
    by_dp = dict(zip(dps.tolist(), _ratio(st_dp, st_ideal[:, None]).tolist(), strict=True))
    by_stage = dict(zip(stages.tolist(), _ratio(st_pp, st_ideal[:, None]).tolist(), strict=True))
    by_tp = (dict(zip(tps.tolist(), _ratio(st_tp, st_ideal[:, None]).tolist(), strict=True))
             if st_tp is not None else None)
    ranks, by_worker, fixed = _workers(base, by_dp, by_stage, by_tp, tp_col)
    mw = _explain(base, np.isin(base.rank, fixed), T, T_ideal)
    ms = _explained(float(st_ms[:, 0].mean()), float(st_ms[:, 1].mean()), T, T_ideal)
    per_step = dict(zip(g.steps.tolist(), (st_meas / st_ideal).tolist(), strict=True))
    replayed_wall = replayed_wall_step_times(base)
    return Analysis(
        meta=base.job.meta,
        T_s=T,
        T_ideal_s=T_ideal,
        slowdown=slowdown,
        launch_slowdown=float(base.measured_step_s.mean()) / T,
        replay_fidelity=float(base.wall_step_s.mean() / replayed_wall.mean()),
        steps=g.steps.tolist(),
        step_measured_s=base.measured_step_s.tolist(),
        step_simulated_s=st_meas.tolist(),
        step_ideal_s=st_ideal.tolist(),
        step_wall_s=base.wall_step_s.tolist(),
        step_replayed_wall_s=replayed_wall.tolist(),
        by_optype=by_optype,
        by_opkind=by_opkind,
        by_dp_rank=by_dp,
        by_stage=by_stage,
        by_worker=by_worker,
        per_step=per_step,
        M_W=mw.removed,
        M_S=ms.removed,
        M_W_detail=mw,
        M_S_detail=ms,
        fixed_workers=[int(r) for r in fixed],
        num_workers=len(ranks),
        num_ops=base.num_traced_ops,
        base=base,
        step_by_dp_s=np.asarray(st_dp, dtype=np.float64),
        step_by_stage_s=np.asarray(st_pp, dtype=np.float64),
    )


def _scenarios(base: Baseline) -> tuple[list[tuple[Any, Any]], np.ndarray, np.ndarray, Any, np.ndarray | None,
                                         np.ndarray]:
    """The blocks of scenarios ``replay_mixed`` replays (measured and ideal runs; then op types, stages,
    the last stage, communication, TP slices and DP ranks with only that part measured), with the DP
    ranks, stages, the DP reduction (None: DP ranks replayed one by one), the TP column and TP ranks."""
    dps, stages = unique_first(base.dp_rank)[0], unique_first(base.pp_rank)[0]
    attr_vals = np.arange(len(base.attr_names))
    reduction = _dp_reduction(base) if len(dps) > DP_REDUCTION_MIN else None
    last_stage = base.pp_rank == stages.max()
    blocks = [(None, [1, 0]), (base.attr_code, attr_vals), (base.pp_rank, stages), (last_stage, [False, True]),
              (base.is_comm(), [False, True])]
    # tensor parallelism: the TP ranks of one DP replica share its DP rank and stage, so their S_dp and
    # S_stage are one value; the TP slice (every rank of one TP rank measured) tells them apart
    tp_col = base.job.column("tp_rank").astype(np.int64) if base.job.meta.tp_size > 1 else None
    tps = np.unique(tp_col[tp_col >= 0]) if tp_col is not None else np.zeros(0, np.int64)
    if len(tps) > 1:
        blocks.append((tp_col, tps))
    if reduction is None:
        blocks.append((base.dp_rank, dps))
    return blocks, dps, stages, reduction, tp_col, tps


def _workers(base: Baseline, by_dp: dict[int, float], by_stage: dict[int, float], by_tp: dict[int, float] | None,
             tp_col: np.ndarray | None) -> tuple[np.ndarray, list[dict[str, Any]], np.ndarray]:
    """The ranks, each worker's S_w (slowest first) and the ranks M_W fixes. S_w = min(S_dp, S_stage)
    (and S_tp: a rank is the intersection of its DP replica, its stage and its TP slice); M_W fixes
    the top 3% of them."""
    ranks, first = unique_first(base.rank)
    w_dp, w_pp = base.dp_rank[first], base.pp_rank[first]
    s_w = np.minimum([by_dp[int(d)] for d in w_dp], [by_stage[int(p)] for p in w_pp])
    if by_tp is not None:
        s_w = np.minimum(s_w, [by_tp.get(int(t), np.inf) for t in tp_col[first]])
    order = np.lexsort((ranks, -s_w))
    by_worker = [
        {"dp_rank": int(w_dp[i]), "stage": int(w_pp[i]), "rank": int(ranks[i]), "slowdown": float(s_w[i]),
         **({"tp_rank": int(tp_col[first[i]])} if by_tp is not None else {})}
        for i in order
    ]
    num_fix = max(1, math.ceil(len(ranks) * TOP_WORKER_SHARE))
    return ranks, by_worker, ranks[order[:num_fix]]


def replayed_wall_step_times(base: Baseline) -> np.ndarray:
    """Per step, the wall-clock time of the measured job replayed with its steps back to back."""
    stream, _ = base.job.codes("stream")
    plan = plan_chain(base.graph, base.rank, stream.astype(np.int64), base.is_host(), base.start_s)
    return chained_wall_step_times(base.graph, plan, base.measured)[0]


def _dp_reduction(base: Baseline) -> DPReduction | None:
    """``reduce_dp`` of the base's job, once per job and graph (a base with other durations, as the
    hidden-straggler pass replays, shares it: ``Baseline.structure``)."""
    from laggard.engine.symmetry import reduce_dp

    job, graph, red = base.structure.get("dp_reduction", (None, None, None))
    if job is not base.job or graph is not base.graph:
        red = reduce_dp(base.job, base.graph)
        base.structure["dp_reduction"] = (base.job, base.graph, red)
    return red


def by_dp_rank_step_times(base: Baseline, dps: np.ndarray, reduction: DPReduction | None = None) -> np.ndarray:
    """Step times with one DP rank measured and every other op ideal, for each DP rank.

    With a ``reduction`` (DP ranks interchangeable, see ``laggard.engine.symmetry``) each what-if replays a
    two-DP-rank job instead of the whole job; the result is the same.
    """
    if reduction is None:
        return replay_mixed(base, (base.dp_rank, dps))[0]
    from laggard.engine.symmetry import per_dp_weights

    rows = np.searchsorted(reduction.dp_values, dps)
    batch = _batch_size(reduction.graph.num_ops, reduction.graph.num_nodes, len(rows))
    out = np.empty((len(base.graph.steps), len(dps)), dtype=np.float64)
    for i in range(0, len(rows), batch):
        w = per_dp_weights(reduction, base.measured, base.ideal, rows[i : i + batch])
        out[:, i : i + batch] = replay_steps(reduction.graph, w)
    return out


__all__ = ["Analysis", "Baseline", "analyze", "by_dp_rank_step_times", "prepare"]
