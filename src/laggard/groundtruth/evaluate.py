"""Does the diagnosis find what was injected? Random synthetic scenarios with known causes.

Used by the tests (acceptance) and by `make bench` (confusion matrix). Strengths are drawn above
these detection floors; clean jobs must come out healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.analysis.pipeline import analyze
from laggard.groundtruth.inject import parse_injection
from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

CAUSE_OF_INJECTION = {
    "slow-worker": "worker",
    "heavy-last-stage": "stage-imbalance",
    "seqlen-imbalance": "sequence-imbalance",
    "gc-pauses": "gc",
    "slow-link": "comm",
    "launch-delay": "launch-delay",
}
FLOORS = {
    "slow-worker": "factor >= 1.5",
    "heavy-last-stage": "factor >= 1.5",
    "seqlen-imbalance": "sigma >= 0.4",
    "gc-pauses": "prob >= 0.05, pause_ms >= 30 (forward pass ~10 ms)",
    "slow-link": "delay_ms >= 5 (transfers ~0.4 ms)",
    "launch-delay": "ms >= 2 per compute launch (computes ~10-20 ms)",
}


@dataclass(kw_only=True, slots=True)
class Scenario:
    cfg: SynthConfig
    injection: str | None  # spec, None for a clean job

    @property
    def expected(self) -> str:
        return "healthy" if self.injection is None else CAUSE_OF_INJECTION[self.injection.split(":")[0]]


@dataclass(kw_only=True, slots=True)
class Outcome:
    scenario: Scenario
    got: str  # top finding's cause, or "healthy" / "none"
    predicted_gain: float | None
    actual_gain: float | None
    slowdown: float

    @property
    def correct(self) -> bool:
        return self.got == self.scenario.expected


def scenarios(num: int, *, seed: int = 0, max_workers: int = 1024) -> list[Scenario]:
    """``num`` random scenarios: every cause and clean jobs in turn, random layouts and strengths."""
    rng = np.random.default_rng(seed)
    kinds = [None, *CAUSE_OF_INJECTION]
    out = []
    for i in range(num):
        kind = kinds[i % len(kinds)]
        pp = int(rng.choice([2, 4, 8]))
        workers = int(np.exp(rng.uniform(np.log(8), np.log(max_workers))))
        dp = max(2, workers // pp)
        mb = int(rng.choice([4, 8])) if pp < 8 else 8
        cfg = SynthConfig(dp=dp, pp=pp, microbatches=mb, steps=4, seed=int(rng.integers(1 << 30)))
        if kind is None:
            spec = None
        elif kind == "slow-worker":
            spec = f"slow-worker:rank={int(rng.integers(dp * pp))},factor={rng.uniform(1.5, 3):.2f}"
        elif kind == "heavy-last-stage":
            spec = f"heavy-last-stage:factor={rng.uniform(1.5, 3):.2f}"
        elif kind == "seqlen-imbalance":
            spec = f"seqlen-imbalance:sigma={rng.uniform(0.4, 0.8):.2f}"
        elif kind == "gc-pauses":
            spec = f"gc-pauses:prob={rng.uniform(0.05, 0.1):.3f},pause_ms={rng.uniform(30, 80):.0f}"
        elif kind == "slow-link":
            src = int(rng.integers(dp)) * pp + int(rng.integers(pp - 1))
            spec = f"slow-link:src={src},dst={src + 1},delay_ms={rng.uniform(5, 20):.1f}"
        else:
            spec = f"launch-delay:ms={rng.uniform(2, 5):.2f}"
        out.append(Scenario(cfg=cfg, injection=spec))
    return out


def run(sc: Scenario, *, check_gain: bool = True) -> Outcome:
    inj = [parse_injection(sc.injection)] if sc.injection else []
    res = analyze(synthesize_with_truth(sc.cfg, inj).job)
    d = res.diagnosis
    assert d is not None
    if d.verdict == "healthy":
        got = "healthy"
    else:
        got = d.findings[0].cause if d.findings else "none"
    predicted = actual = None
    if check_gain and sc.injection and d.findings and got == sc.expected:
        clean = analyze(synthesize_with_truth(sc.cfg, []).job, diagnose=False)
        predicted = d.findings[0].gain
        if got == "launch-delay":
            actual = float(np.mean(res.step_measured_s) / np.mean(clean.step_measured_s))
        else:
            actual = res.T_s / clean.T_s
    return Outcome(scenario=sc, got=got, predicted_gain=predicted, actual_gain=actual, slowdown=res.slowdown)


def confusion(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    labels = ["healthy", *CAUSE_OF_INJECTION.values()]
    m: dict[str, dict[str, int]] = {e: {} for e in labels}
    for o in outcomes:
        row = m[o.scenario.expected]
        row[o.got] = row.get(o.got, 0) + 1
    return m
