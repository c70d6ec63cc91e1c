"""Ground truth: the real speed-up of fixing each cause, measured by simulating the job again
without it (same seeds, so every other random draw stays where it was). Never by laggard's replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laggard.dessim.causes import DIAGNOSIS_CAUSE, Cause
from laggard.dessim.engine import SimConfig, SimOps, simulate


@dataclass(kw_only=True, slots=True)
class CauseTruth:
    cause: Cause
    gain: float  # T(all causes) / T(all but this one): the speed-up of fixing only this cause

    def to_json(self) -> dict[str, Any]:
        return {**self.cause.to_json(), "spec": self.cause.spec(), "gain": self.gain}


@dataclass(kw_only=True, slots=True)
class SimTruth:
    sim: SimOps
    clean_step_s: float
    causes: list[CauseTruth] = field(default_factory=list)

    @property
    def slowdown(self) -> float:
        """Measured step time over the same job without any injected cause."""
        return self.sim.mean_step_s / self.clean_step_s

    def to_json(self) -> dict[str, Any]:
        cfg = self.sim.cfg
        return {
            "config": {k: getattr(cfg, k) for k in ("dp", "pp", "vpp", "microbatches", "steps", "seed", "jitter",
                                                    "launch_s", "queue_depth", "skew_s")},
            "step_s": self.sim.mean_step_s,
            "clean_step_s": self.clean_step_s,
            "slowdown_vs_clean": self.slowdown,
            "causes": [c.to_json() for c in self.causes],
            "expected_findings": sorted({DIAGNOSIS_CAUSE[c.cause.kind] for c in self.causes}),
        }


def simulate_with_truth(cfg: SimConfig, causes: list[Cause]) -> SimTruth:
    """Simulate the job, then once without each cause and once without any (len(causes) + 2 runs)."""
    sim = simulate(cfg, causes)
    clean = simulate(cfg, []).mean_step_s if causes else sim.mean_step_s
    out = []
    for i, c in enumerate(causes):
        rest = causes[:i] + causes[i + 1 :]
        t = simulate(cfg, rest).mean_step_s if rest else clean
        out.append(CauseTruth(cause=c, gain=sim.mean_step_s / t))
    return SimTruth(sim=sim, clean_step_s=clean, causes=out)
