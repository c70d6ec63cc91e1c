"""Ground truth: the real speed-up of fixing each cause, measured by simulating the job again
without it (same seeds, so every other random draw stays where it was). Never by laggard's replay.

Causes hide each other (a slow link next to a heavy stage gains ~nothing when fixed alone, and
matters once the stage is fixed), so the effect of a cause is measured at both ends of the order
in which fixes can be made: removed last (``gain``: the job without it) and present alone
(``alone_gain``: the clean job with only it). ``effect_share`` is the larger of the two step-time
differences as a share of the job's slowdown (step time over the clean job's): the simulator's
answer to "does this cause matter", which the sweep's detection floor reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laggard.groundtruth.dessim.causes import DIAGNOSIS_CAUSE, Cause
from laggard.groundtruth.dessim.engine import SimConfig, SimOps, simulate


@dataclass(kw_only=True, slots=True)
class CauseTruth:
    cause: Cause
    gain: float  # T(all causes) / T(all but this one): the speed-up of fixing only this cause
    effect_share: float = float("nan")  # max(T(all) - T(all but it), T(it alone) - T(clean)) / (T(all) - T(clean))
    alone_gain: float = float("nan")  # T(only this cause) / T(clean): its effect on an otherwise clean job

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.cause.to_json(), "spec": self.cause.spec(), "gain": self.gain}
        if self.effect_share == self.effect_share:  # measured
            out["effect_share"] = self.effect_share
        if self.alone_gain == self.alone_gain:
            out["alone_gain"] = self.alone_gain
        return out


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


def simulate_with_truth(cfg: SimConfig, causes: list[Cause], *, alone_below: float = 1.0) -> SimTruth:
    """Simulate the job, once without any cause and once without each (len(causes) + 2 runs); then,
    for each cause whose removal explains less than ``alone_below`` of the slowdown, once with only
    that cause (the other end of the order of fixes; 1.0: for every cause, 0: never). Runs are
    cached by their set of causes, so no set is simulated twice."""
    cache: dict[tuple[int, ...], float] = {}

    def step_s(keep: tuple[int, ...]) -> float:
        if keep not in cache:
            cache[keep] = simulate(cfg, [causes[i] for i in keep]).mean_step_s
        return cache[keep]

    everything = tuple(range(len(causes)))
    sim = simulate(cfg, causes)
    cache[everything] = sim.mean_step_s
    clean = step_s(())
    slow = sim.mean_step_s - clean
    out = []
    for i, c in enumerate(causes):
        t = step_s(everything[:i] + everything[i + 1 :])
        ct = CauseTruth(cause=c, gain=sim.mean_step_s / t)
        last = (sim.mean_step_s - t) / slow if slow > 0 else 0.0
        ct.effect_share = last
        if last < alone_below:
            t_alone = step_s((i,))
            ct.alone_gain = t_alone / clean
            ct.effect_share = max(last, (t_alone - clean) / slow if slow > 0 else 0.0)
        out.append(ct)
    return SimTruth(sim=sim, clean_step_s=clean, causes=out)
