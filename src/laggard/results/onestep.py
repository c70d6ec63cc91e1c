"""What one profiled step can say, as plain data (``laggard.diagnose.onestep`` fills it): who arrived
late at the step's first collective, by how much, what came before it, and the wait it cost the others.
One step cannot tell a steady straggler from a one-off, so these are read, not judged."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def finite(x: float | None) -> float | None:  # (results.diagnosis imports this module: its own twin)
    return float(x) if x is not None and math.isfinite(x) else None


@dataclass(kw_only=True, slots=True)
class Arrival:
    """One rank in one step: when it began the step and reached its first collective."""

    rank: int
    entry_s: float  # its first op's start after the earliest rank's first op
    arrival_s: float  # its first collective's start after the earliest member's start of that collective
    waited_s: float  # its wait there for the last member to arrive

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "entry_s": finite(self.entry_s), "arrival_s": finite(self.arrival_s),
                "waited_s": finite(self.waited_s)}


@dataclass(kw_only=True, slots=True)
class LateRank:
    """A rank that reached its first collective of the step last, clearly after the others."""

    rank: int
    step: int
    collective: str  # the collective's op name
    late_by_s: float  # its arrival after the next-to-last member's
    caused_wait_s: float  # the other members' waits for it there, summed
    entry_s: float  # how much later it began the step than the other members (median)
    in_step_s: float  # how much longer it took from its first op to the collective than they did (median)
    gap_s: float  # ... of which untraced time between its ops (host work no op covers)
    last_op: str  # its last op before the collective
    slow_op: str  # its op that took the longest over the same op on the others ("" where none did)
    slow_op_excess_s: float
    before: str  # in words: what preceded the lateness

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "step": self.step, "collective": self.collective,
                "late_by_s": finite(self.late_by_s), "caused_wait_s": finite(self.caused_wait_s),
                "entry_s": finite(self.entry_s), "in_step_s": finite(self.in_step_s), "gap_s": finite(self.gap_s),
                "last_op": self.last_op, "slow_op": self.slow_op, "slow_op_excess_s": finite(self.slow_op_excess_s),
                "before": self.before}


@dataclass(kw_only=True, slots=True)
class OneStep:
    """One step read on its own."""

    step: int
    step_s: float  # its span on the trace: the earliest first op to the latest last end
    threshold_s: float  # lateness under this is the step's own noise (``laggard.diagnose.onestep``)
    arrivals: list[Arrival] = field(default_factory=list)  # every rank, by rank
    late: list[LateRank] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "step_s": finite(self.step_s), "threshold_s": finite(self.threshold_s),
                "arrivals": [a.to_json() for a in self.arrivals], "late": [x.to_json() for x in self.late]}


__all__ = ["Arrival", "LateRank", "OneStep"]
