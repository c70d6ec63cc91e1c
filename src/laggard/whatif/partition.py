"""A whole-layer pipeline split for a traced job, and its speed-up predicted by a what-if replay.

``plan_partition`` measures each stage's compute, spreads it over the layers the stages hold
(``laggard.mitigate.partition.layer_costs_from_stages``), finds the exact min-max contiguous split
(``split_stages``) and replays the job with each stage's per-microbatch compute scaled to its new
cost. It is what `laggard partition` prints, and what the analysis shows as a stage-imbalance
finding's gain when the layer count is known (``Finding.gain_layers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.engine.selection import nan_median
from laggard.errors import LaggardError

if TYPE_CHECKING:
    from laggard.mitigate.partition import StageSplit
    from laggard.optable.ops import Job

# a replica computing 1.25x its stage's other replicas is a slow worker (DiagnoseConfig.worker_ratio)
SLOW_REPLICA_RATIO = 1.25


def compute_ops(job: Job) -> np.ndarray:
    """Mask of the ops of kind compute (all False when the trace has none)."""
    kind_code, kinds = job.codes("kind")
    return kind_code == (kinds.index("compute") if "compute" in kinds else -2)


def stage_compute_s(job: Job) -> np.ndarray:
    """Mean per-step compute time of each pipeline stage (ops of kind compute with a microbatch)."""
    total, count = _stage_dp_compute(job)
    return total.sum(axis=1) / count.sum(axis=1)


def stage_replicas_s(job: Job) -> np.ndarray:
    """Per-step compute time of each (stage, DP replica); NaN where a replica has none."""
    total, count = _stage_dp_compute(job)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _stage_dp_compute(job: Job) -> tuple[np.ndarray, np.ndarray]:
    sel = compute_ops(job) & (job.column("microbatch") >= 0)
    if not sel.any():
        raise LaggardError("the trace has no per-microbatch compute ops; cannot measure stage costs")
    pp = job.column("pp_rank")[sel].astype(np.int64)
    num_stages = int(pp.max()) + 1
    dur = job.column("dur_ns")[sel] * 1e-9
    inst = np.stack([job.column("step")[sel].astype(np.int64), job.column("dp_rank")[sel].astype(np.int64),
                     job.column("tp_rank")[sel].astype(np.int64), pp], axis=1)
    uniq, inv = np.unique(inst, axis=0, return_inverse=True)
    per_inst = np.bincount(inv.ravel(), weights=dur, minlength=len(uniq))
    num_dp = int(uniq[:, 1].max()) + 1
    cell = uniq[:, 3] * num_dp + uniq[:, 1]
    total = np.bincount(cell, weights=per_inst, minlength=num_stages * num_dp).reshape(num_stages, num_dp)
    count = np.bincount(cell, minlength=num_stages * num_dp).reshape(num_stages, num_dp)
    if (count.sum(axis=1) == 0).any():
        raise LaggardError(f"stage(s) {np.flatnonzero(count.sum(axis=1) == 0).tolist()} have no compute ops")
    return total, count


def slow_replicas(job: Job) -> list[dict[str, Any]]:
    """Stages slow because of one DP replica (one worker), not their layers: the replica computes
    ``SLOW_REPLICA_RATIO`` x the median of its stage's other replicas."""
    rep = stage_replicas_s(job)
    out: list[dict[str, Any]] = []
    if rep.shape[1] < 2:
        return out
    ranks = {(int(s), int(d)): int(r)
             for s, d, r in zip(job.column("pp_rank"), job.column("dp_rank"), job.column("rank"), strict=True)} \
        if job.num_ops < 2_000_000 else {}
    for s in range(rep.shape[0]):
        row = rep[s]
        for d in np.flatnonzero(np.isfinite(row)):
            others = np.delete(row, d)
            ref = float(np.nanmedian(others)) if np.isfinite(others).any() else 0.0
            if ref > 0 and row[d] >= SLOW_REPLICA_RATIO * ref:
                out.append({"stage": s, "dp_rank": int(d), "rank": ranks.get((s, int(d))),
                            "ratio": float(row[d] / ref)})
    return out


def replay_scaled(job: Job, factors: np.ndarray) -> tuple[float, float]:
    """Measured and what-if mean step time (s) when each stage's per-microbatch compute is scaled."""
    from laggard.engine.baseline import prepare
    from laggard.engine.replay import replay_steps

    base = prepare(job)
    sel = compute_ops(base.job) & (base.job.column("microbatch") >= 0)
    f = np.ones(len(base.measured))
    f[sel] = factors[base.pp_rank[sel]]
    st = replay_steps(base.graph, np.stack([base.measured, base.measured * f], axis=1))
    t_old, t_new = (float(x) for x in st.mean(axis=0))
    return t_old, t_new


def parse_counts(spec: str) -> list[int]:
    """``"8,8,8,6"`` -> ``[8, 8, 8, 6]`` (``--layers-per-stage``)."""
    try:
        out = [int(x) for x in spec.replace(" ", "").split(",") if x]
    except ValueError:
        raise LaggardError(f"--layers-per-stage {spec!r}: expected comma-separated integers, e.g. 8,8,8,6") from None
    if not out or min(out) < 1:
        raise LaggardError(f"--layers-per-stage {spec!r}: every stage needs at least one layer")
    return out


def layers_known(job: Job) -> bool:
    """Whether the trace records how many layers the model has (job metadata)."""
    return job.meta.extra.get("num_layers") is not None or bool(job.meta.extra.get("layers_per_stage"))


def layers_per_stage(job: Job, num_stages: int, num_layers: int | None = None,
                     per_stage: str | list[int] | None = None, *, what: str = "the trace") -> list[int]:
    """The decoder layers each stage of the trace holds: given (``per_stage``), from the job's
    metadata, or an even split of the model's ``num_layers``; asks for exactly what it lacks."""
    from laggard.mitigate.partition import even_counts

    if per_stage is None and num_layers is None and job.meta.extra.get("layers_per_stage"):
        per_stage = [int(x) for x in job.meta.extra["layers_per_stage"]]
    if per_stage is not None:
        counts = parse_counts(per_stage) if isinstance(per_stage, str) else list(per_stage)
        if len(counts) != num_stages:
            raise LaggardError(f"--layers-per-stage gives {len(counts)} stages; the trace has {num_stages}")
        return counts
    n = num_layers if num_layers is not None else job.meta.extra.get("num_layers")
    if n is None:
        raise LaggardError(f"{what}: the trace does not record how many layers the model has (job metadata "
                           "num_layers or layers_per_stage): give --num-layers N (the model's decoder layers) "
                           "or --layers-per-stage A,B,... (the layers each stage holds now)")
    if isinstance(n, bool) or not isinstance(n, int) or n < num_stages:
        raise LaggardError(f"--num-layers must be an integer >= the trace's {num_stages} stages, got {n!r}")
    return even_counts(n, num_stages)


@dataclass(kw_only=True, slots=True)
class PartitionPlan:
    """A proposed whole-layer split of a traced job's stages and its predicted effect."""

    measured: np.ndarray  # compute per step of each stage (s), as sized (median replica when one is slow)
    slow_workers: list[dict[str, Any]]  # stages slow because of one replica (moving layers will not fix them)
    costs: np.ndarray  # per layer (s): [embedding], decoder..., [loss]
    kinds: list[str]
    current: StageSplit
    proposed: StageSplit
    embedding: bool
    loss: bool
    # the what-if replay (same number of stages only): mean step time now and with the split (s)
    t_s: float | None = None
    t_new_s: float | None = None
    factors: np.ndarray | None = None

    @property
    def model_speedup(self) -> float:
        """How much cheaper the bottleneck stage gets in the cost model."""
        return self.current.max_cost / self.proposed.max_cost if self.proposed.max_cost > 0 else float("inf")

    @property
    def speedup(self) -> float | None:
        """The replayed step's speed-up (None: the stage count changes, so no replay)."""
        if self.t_s is None or not self.t_new_s:
            return None
        return self.t_s / self.t_new_s

    def decoder_counts(self, counts: list[int]) -> list[int]:
        """Decoder layers per stage, as the layout string counts them (embedding and loss apart)."""
        out = list(counts)
        out[0] -= 1 if self.embedding else 0
        out[-1] -= 1 if self.loss else 0
        return out

    def to_json(self, trace: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "trace": trace, "measured_stage_compute_s": self.measured.tolist(), "layer_costs_s": self.costs.tolist(),
            "layer_kinds": self.kinds, "current": self.current.to_json(), "proposed": self.proposed.to_json(),
            "model_bottleneck_speedup": self.model_speedup, "whatif": None, "slow_workers": self.slow_workers,
        }
        if self.factors is not None:
            out["whatif"] = {"stage_compute_factors": self.factors.tolist(), "T_s": self.t_s, "T_new_s": self.t_new_s,
                             "speedup": self.speedup,
                             "changes": [f"scale stage={s} compute x{f:.4g}" for s, f in enumerate(self.factors)]}
        return out


def plan_partition(job: Job, *, stages: int | None = None, num_layers: int | None = None,
                   per_stage: str | list[int] | None = None, embedding: bool = True, loss: bool = True,
                   what: str = "the trace") -> PartitionPlan:
    """The exact min-max whole-layer split of the job's stages (into ``stages``; default the trace's)
    and, for as many stages as the trace has, its step time replayed. A stage slow because of one
    replica is sized by its median replica (a slow worker is not its layers)."""
    from laggard.mitigate.partition import describe_split, layer_costs_from_stages, split_stages

    measured = stage_compute_s(job)
    slow = slow_replicas(job)
    if slow:
        measured = nan_median(stage_replicas_s(job), 1)
    p_old = len(measured)
    counts = layers_per_stage(job, p_old, num_layers, per_stage, what=what)
    costs, kinds = layer_costs_from_stages(measured, counts, embedding=embedding, loss=loss)
    old_counts = list(counts)
    old_counts[0] += 1 if embedding else 0
    old_counts[-1] += 1 if loss else 0
    current = describe_split(costs, old_counts, layer_kinds=kinds)
    proposed = split_stages(costs, p_old if stages is None else stages, layer_kinds=kinds)
    plan = PartitionPlan(measured=measured, slow_workers=slow, costs=costs, kinds=kinds, current=current,
                         proposed=proposed, embedding=embedding, loss=loss)
    if len(proposed.counts) == p_old:
        plan.factors = np.divide(proposed.stage_costs, current.stage_costs, out=np.ones(p_old),
                                 where=current.stage_costs > 0)
        plan.t_s, plan.t_new_s = replay_scaled(job, plan.factors)
    return plan


__all__ = ["SLOW_REPLICA_RATIO", "PartitionPlan", "compute_ops", "layers_known", "layers_per_stage",
           "parse_counts", "plan_partition", "replay_scaled", "slow_replicas", "stage_compute_s",
           "stage_replicas_s"]
