"""What the diagnosis reports, as plain data: findings (causes with evidence, share and gain) and the
verdict, with their JSON (``to_json``). Detectors in ``laggard.diagnose`` produce them; rendering
lives in ``laggard.report``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# laggard commands that carry a fix out, and what they do: a detector names one (``fix_tool``);
# where the trace is known the analysis writes it out in full (``fix_command``)
FIX_TOOLS = {"partition": "proposes the split"}


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
    fix_tool: str = ""  # the laggard command that carries the fix out (a key of FIX_TOOLS)
    fix_command: str = ""  # that command for this trace, in words (``analysis.partition_hint``)
    whatif: list[str] = field(default_factory=list)  # the `laggard whatif` flags whose speed-up is `gain`
    command: str = ""  # the whole command, with the trace and the flags it was loaded with
    # "high": a detector read the cause's signature; "low": no signature fitted and this is the largest
    # carrier of the residual (its what-if says how much fixing it would give, not why it is slow)
    confidence: str = "high"
    # named only when the detectors ran again on the job with the first findings fixed: a straggler
    # those findings hid (its signature was within their noise)
    hidden: bool = False

    @property
    def fix_text(self) -> str:
        """The fix, with the command that carries it out where there is one."""
        if self.fix_command:
            return f"{self.fix}; {self.fix_command}"
        if self.fix_tool:
            return f"{self.fix} (`laggard {self.fix_tool}` {FIX_TOOLS[self.fix_tool]})"
        return self.fix

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
            "fix": self.fix_text,
            "whatif": self.command,
            "confidence": self.confidence,
            "hidden": self.hidden,
        }


@dataclass(kw_only=True, slots=True)
class Diagnosis:
    verdict: str  # healthy | straggling | not enough to judge | cannot judge (the replay does not model the job)
    threshold: float
    findings: list[Finding]
    reason: str = ""  # why a job could not be judged (verdicts "not enough to judge" and "cannot judge")
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
        if self.reason:
            out["reason"] = self.reason
        if self.verdict == "straggling":
            out["combined"] = {"share": finite(self.combined_share), "gain": finite(self.combined_gain),
                               "interaction": finite(self.interaction), "unexplained": finite(self.unexplained),
                               "unexplained_by": self.unexplained_by}
        return out


__all__ = ["FIX_TOOLS", "Diagnosis", "Finding", "finite"]
