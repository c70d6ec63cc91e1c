"""What ``laggard top`` shows of a running job, as plain data: per-rank step times over the recent
steps, the worst rank and its excess over its peers, and the window analysis' first finding.

``laggard.monitor.top`` fills it (from a trace directory or a collector), ``laggard.report.top``
renders it; neither lives here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PHASES = ("waiting", "running", "ended")


@dataclass(kw_only=True, slots=True)
class RankRow:
    """One rank over the window's steps (times in ms; None where it has no ops in the window)."""

    rank: int
    dp_rank: int | None = None
    stage: int | None = None
    status: str = ""  # its tracer's status ("running", "closed", "failed: ...", "gone"); "" when not known
    last_step: int | None = None  # the latest step it wrote ops of, complete or not
    step_ms: float | None = None  # median over the window's steps of its ops' span (first start to last end)
    # median over the window's steps of its own work: its ops that are not communication (the time
    # it waited for its peers is inside its communication ops, so a rank that holds the others back
    # has more of this than they have, while every rank's span is the slowest one's)
    busy_ms: float | None = None
    recent_ms: list[float] = field(default_factory=list)  # busy time of each window step, oldest first (nan: none)
    excess: float | None = None  # busy_ms / the median of its peers' busy_ms - 1
    slowdown: float | None = None  # S_w of the window's analysis


@dataclass(kw_only=True, slots=True)
class Worst:
    """The rank whose own work per step most exceeds its peers' (the same stage's other ranks)."""

    rank: int
    busy_ms: float
    peers_ms: float  # the median of its peers' busy_ms
    excess: float  # busy_ms / peers_ms - 1
    num_peers: int


@dataclass(kw_only=True, slots=True)
class TopState:
    """One frame of ``laggard top``."""

    source: str  # the trace directory, or "URL job ID"
    name: str  # the job's name
    phase: str = "waiting"  # one of PHASES: no complete step yet, steps coming, or the job ended
    ended_why: str = ""  # why the job counts as ended (or why top stopped: Ctrl-C)
    window: tuple[int, int] | None = None  # the first and last step the numbers cover
    num_steps: int = 0  # complete steps in the window
    last_step: int | None = None  # the latest step any rank wrote ops of
    num_ranks: int = 0  # ranks seen
    expected_ranks: int = 0  # ranks the job has (its world size, where known)
    step_ms: float | None = None  # the job's step time: median over the window's steps of the longest rank span
    ranks: list[RankRow] = field(default_factory=list)
    worst: Worst | None = None
    slowdown: float | None = None  # S of the window's analysis
    verdict: str | None = None
    finding: dict[str, Any] | None = None  # the diagnosis' first finding, as ``Finding.to_json()`` gives it
    num_findings: int = 0
    error: str | None = None  # why the window's analysis failed
    notes: list[str] = field(default_factory=list)  # what the reader should know (a rank gone, a hang suspected)
    updated_unix_s: float = 0.0

    def rank_row(self, rank: int) -> RankRow | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def to_json(self) -> dict[str, Any]:
        def num(x: float | None) -> float | None:
            return None if x is None or not math.isfinite(x) else round(float(x), 6)

        return {
            "source": self.source, "name": self.name, "phase": self.phase, "ended_why": self.ended_why,
            "window": list(self.window) if self.window else None, "num_steps": self.num_steps,
            "last_step": self.last_step, "num_ranks": self.num_ranks, "expected_ranks": self.expected_ranks,
            "step_ms": num(self.step_ms),
            "ranks": [{"rank": r.rank, "dp_rank": r.dp_rank, "stage": r.stage, "status": r.status,
                       "last_step": r.last_step, "step_ms": num(r.step_ms), "busy_ms": num(r.busy_ms),
                       "recent_ms": [num(x) for x in r.recent_ms], "excess": num(r.excess),
                       "slowdown": num(r.slowdown)} for r in self.ranks],
            "worst": None if self.worst is None else {
                "rank": self.worst.rank, "busy_ms": num(self.worst.busy_ms), "peers_ms": num(self.worst.peers_ms),
                "excess": num(self.worst.excess), "num_peers": self.worst.num_peers},
            "slowdown": num(self.slowdown), "verdict": self.verdict, "finding": self.finding,
            "num_findings": self.num_findings, "error": self.error, "notes": list(self.notes),
            "updated_unix_s": self.updated_unix_s,
        }


__all__ = ["PHASES", "RankRow", "TopState", "Worst"]
