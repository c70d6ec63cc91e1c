"""What the diagnosis reports: findings (causes with evidence, share and gain) and the verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


@dataclass(kw_only=True, slots=True)
class Finding:
    cause: str
    workers: list[dict[str, int]] = field(default_factory=list)
    stages: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    evidence: str = ""
    score: float = 0.0  # share of the slowdown that fixing only this removes (from the measured job)
    share: float = 0.0  # its part of the slowdown in the joint attribution (Shapley; the shares add up)
    gain: float = 1.0  # speed-up of fixing only this
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "workers": self.workers,
            "stages": self.stages,
            "steps": self.steps,
            "evidence": self.evidence,
            "score": finite(self.score),
            "share": finite(self.share),
            "gain": finite(self.gain),
            "fix": self.fix,
        }


@dataclass(kw_only=True, slots=True)
class Diagnosis:
    verdict: str  # healthy | straggling
    threshold: float
    findings: list[Finding]
    combined_share: float = 0.0  # the slowdown removed by fixing every finding together
    combined_gain: float = 1.0
    interaction: float = 0.0  # combined share minus the sum of the findings' own scores
    unexplained: float = 0.0  # 1 - combined share
    unexplained_by: list[dict[str, Any]] = field(default_factory=list)  # the attributions that carry it

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "healthy_threshold": self.threshold,
            "findings": [f.to_json() for f in self.findings],
        }
        if self.verdict == "straggling":
            out["combined"] = {"share": finite(self.combined_share), "gain": finite(self.combined_gain),
                               "interaction": finite(self.interaction), "unexplained": finite(self.unexplained),
                               "unexplained_by": self.unexplained_by}
        return out


@dataclass(kw_only=True, slots=True)
class Candidate:
    """A nominated finding and its targeted what-if: the job's weights with only what it names made
    healthy (None for launch-delay, which is the gap between the measured and the replayed job)."""

    finding: Finding
    weights: np.ndarray | None
