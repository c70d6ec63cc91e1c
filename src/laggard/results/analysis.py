"""The what-if analysis's result: plain data (numbers, lists, the job's metadata) and its JSON
document (``to_json``: the ``laggard analyze --json`` contract). Rendering lives in ``laggard.report``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.engine.replay import replay
from laggard.optable.hosts import HOSTS_KEY, hosts_of
from laggard.optable.ops import JobMeta
from laggard.optable.partial import MISSING_KEY
from laggard.results.diagnosis import finite as _num

if TYPE_CHECKING:
    from laggard.engine.baseline import Baseline
    from laggard.results.diagnosis import Diagnosis

@dataclass(kw_only=True, slots=True)
class Explained:
    """How much of the slowdown a set of ops explains (the paper's M_W / M_S)."""

    removed: float  # (T - T_rem) / (T - T_ideal): fix only these ops in the measured run
    added: float  # (T_add - T_ideal) / (T - T_ideal): keep only these ops measured in the ideal run
    T_rem_s: float
    T_add_s: float

    def to_json(self) -> dict[str, float | None]:
        return {k: _num(getattr(self, k)) for k in ("removed", "added", "T_rem_s", "T_add_s")}


@dataclass(kw_only=True, slots=True)
class Analysis:
    """The result of ``analyze``; ``to_json`` is the contract later tools rely on."""

    meta: JobMeta
    T_s: float
    T_ideal_s: float
    slowdown: float
    launch_slowdown: float
    # wall-clock step time / the same from a replay of the steps back to back (laggard.engine.replay_chain;
    # 1: the replay is the job, above 1: time the trace does not show)
    replay_fidelity: float
    steps: list[int]
    step_measured_s: list[float]
    step_simulated_s: list[float]
    step_ideal_s: list[float]
    step_wall_s: list[float]
    step_replayed_wall_s: list[float]  # per step, from the replay of the steps back to back
    by_optype: dict[str, float]
    # S_t of every compute op together and of every communication op together (the fleet's split
    # of the waste by op kind); replayed in the same pass as the other attributions
    by_opkind: dict[str, float]
    by_dp_rank: dict[int, float]
    by_stage: dict[int, float]
    by_worker: list[dict[str, Any]]
    per_step: dict[int, float]
    M_W: float
    M_S: float
    M_W_detail: Explained
    M_S_detail: Explained
    fixed_workers: list[int]
    num_workers: int
    num_ops: int
    warnings: list[str] = field(default_factory=list)
    # further results keyed by their JSON name (e.g. "arrivals" from the Kineto importer)
    extras: dict[str, Any] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    base: Baseline | None = None
    # per step (rows, in ``steps`` order): step time with only one DP rank (columns: ``by_dp_rank``'s
    # keys, sorted) or only one stage (``by_stage``'s keys, sorted) measured; the report's per-worker
    # x per-step heatmap reads them (None when not kept, e.g. an analysis rebuilt from JSON)
    step_by_dp_s: np.ndarray | None = field(default=None, compare=False)
    step_by_stage_s: np.ndarray | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        d = self.diagnosis
        verdict = d.verdict if d is not None else "not diagnosed"
        top = (f", top finding {d.findings[0].cause} ({d.findings[0].shown_gain:.2f}x)"
               if d is not None and d.findings else "")
        return (f"<Analysis {self.meta.name!r}: {self.num_workers} workers, {len(self.steps)} steps, "
                f"S={self.slowdown:.3f}, waste {100 * self.waste:.1f}%, {verdict}{top}>")

    def _repr_html_(self) -> str:
        """Notebook display: the headline and the findings (``laggard.report.html.write_report`` writes the
        full report)."""
        from html import escape

        d = self.diagnosis
        rows = "".join(f"<li><b>{escape(f.cause)}</b>: {100 * f.share:.0f}% of the slowdown, {f.shown_gain:.2f}x "
                       f"faster fixed{' (bound)' if f.gain_is_bound and f.gain_layers is None else ''}"
                       f"<br><small>{escape(f.evidence)}</small></li>" for f in (d.findings if d else []))
        verdict = escape(d.verdict) if d is not None else "not diagnosed"
        return (f"<div><b>laggard</b> {escape(self.meta.name)}: {self.num_workers} workers, {len(self.steps)} steps; "
                f"straggler slowdown <b>S = {self.slowdown:.3f}</b> (waste {100 * self.waste:.1f}%); "
                f"verdict: <b>{verdict}</b>" + (f"<ol>{rows}</ol>" if rows else "") + "</div>")

    def timelines(self) -> tuple[np.ndarray, np.ndarray]:
        """Replayed op end times (step-relative) with measured and with ideal durations."""
        assert self.base is not None
        ends, _ = replay(self.base.graph, np.stack([self.base.measured, self.base.ideal], axis=1))
        return ends[:, 0], ends[:, 1]

    @property
    def waste(self) -> float:
        return 1.0 - 1.0 / self.slowdown if self.slowdown > 0 else 0.0

    @property
    def gpu_hours(self) -> float | None:
        if self.meta.world_size is None:
            return None
        return self.meta.num_gpus * float(np.sum(self.step_measured_s)) / 3600.0

    def to_json(self) -> dict[str, Any]:
        gh = self.gpu_hours
        return {
            "slowdown": _num(self.slowdown),
            "waste": _num(self.waste),
            "T_s": _num(self.T_s),
            "T_ideal_s": _num(self.T_ideal_s),
            "launch_slowdown": _num(self.launch_slowdown),
            "replay_fidelity": _num(self.replay_fidelity),
            "num_workers": self.num_workers,
            "num_steps": len(self.steps),
            "num_ops": self.num_ops,
            "num_gpus": self.meta.num_gpus if self.meta.world_size is not None else None,
            "gpu_hours": _num(gh),
            "gpu_hours_wasted": _num(gh * self.waste) if gh is not None else None,
            "by_optype": {k: _num(v) for k, v in self.by_optype.items()},
            "by_opkind": {k: _num(v) for k, v in self.by_opkind.items()},
            "by_dp_rank": {str(k): _num(v) for k, v in self.by_dp_rank.items()},
            "by_stage": {str(k): _num(v) for k, v in self.by_stage.items()},
            "by_worker": [{**w, "slowdown": _num(w["slowdown"])} for w in self.by_worker],
            "per_step": {str(s): _num(v) for s, v in self.per_step.items()},
            "M_W": _num(self.M_W),
            "M_S": _num(self.M_S),
            "M_W_detail": {**self.M_W_detail.to_json(), "fixed_ranks": self.fixed_workers},
            "M_S_detail": self.M_S_detail.to_json(),
            "step_time_measured": {str(s): _num(v) for s, v in zip(self.steps, self.step_measured_s, strict=True)},
            "step_time_simulated": {str(s): _num(v) for s, v in zip(self.steps, self.step_simulated_s, strict=True)},
            "step_time_ideal": {str(s): _num(v) for s, v in zip(self.steps, self.step_ideal_s, strict=True)},
            "step_time_wall": {str(s): _num(v) for s, v in zip(self.steps, self.step_wall_s, strict=True)},
            "step_time_replayed_wall": {str(s): _num(v)
                                        for s, v in zip(self.steps, self.step_replayed_wall_s, strict=True)},
            "meta": {"name": self.meta.name, "source": self.meta.source, **self.meta.parallel_sizes(),
                     **({"layout": self.meta.extra["layout"]} if "layout" in self.meta.extra else {}),
                     # how a zero-code trace's layout was read (laggard.io.native_layout)
                     **({"layout_inferred": self.meta.extra["layout_inferred"]}
                        if "layout_inferred" in self.meta.extra else {}),
                     # the ranks a partial trace lacks (laggard.optable.partial.note_missing)
                     **({MISSING_KEY: self.meta.extra[MISSING_KEY]} if MISSING_KEY in self.meta.extra else {}),
                     # where each rank ran (laggard.optable.hosts), where the trace says
                     **({HOSTS_KEY: hosts} if (hosts := hosts_of(self.meta.extra)) else {})},
            "warnings": list(self.warnings),
            **(self.diagnosis.to_json() if self.diagnosis is not None else {}),
            **self.extras,
        }


__all__ = ["Analysis", "Explained"]
