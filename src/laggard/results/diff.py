"""The result of ``laggard diff A B`` as plain data: how much B's step time differs from A's and
which parts of the job carry the change (``laggard.whatif.diff`` fills it; ``laggard.report.diff``
renders it). ``to_json`` is the ``laggard diff --json`` document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laggard.results.diagnosis import finite as _num

# the part of the change no duration of B carries
NOT_FROM_DURATIONS = "not from durations (B's structure: layout, op counts, op types A lacks)"


@dataclass(kw_only=True, slots=True)
class Contribution:
    """One part of the change: B replayed with A's durations for these ops."""

    # the ops, in the what-if selector syntax (``optype=backward-compute,stage=3``); None for the two
    # parts no selector names: "every other op type" (the ops outside the named parts) and "not from
    # durations" (what B's own structure changes: layout, op types one run lacks, order)
    selector: str | None
    what: str  # in words: "backward-compute on stage 3"
    share: float  # Shapley value over the parts / (T_b - T_a): the shares of all parts add up to 1
    alone: float  # (T_b - T_b with only these ops at A's durations) / (T_b - T_a)
    delta_s: float  # share x (T_b - T_a): seconds of the step's change
    num_ops: int  # ops of B it changes
    # B's time in these ops over A's level of it, - 1 (+0.30: they take 30% longer in B); NaN for the
    # part "not from durations"
    duration_change: float = float("nan")
    changes: list[str] = field(default_factory=list)  # the `laggard whatif` flags that make it
    command: str | None = None  # the `laggard whatif` command on B that replays it alone

    def to_json(self) -> dict[str, Any]:
        return {
            "selector": self.selector,
            "what": self.what,
            "share": _num(self.share),
            "alone": _num(self.alone),
            "delta_s": _num(self.delta_s),
            "num_ops": self.num_ops,
            "duration_change": _num(self.duration_change),
            "changes": self.changes,
            "command": self.command,
        }


@dataclass(kw_only=True, slots=True)
class RunSummary:
    """One side of the comparison."""

    name: str
    source: str
    paths: list[str]
    layout: dict[str, int]  # dp, pp, tp, ... (JobMeta.parallel_sizes)
    num_ranks: int
    num_steps: int
    num_ops: int  # traced ops (as `laggard analyze` counts them): the host ops of untraced gaps not counted
    T_s: float  # replayed step time (mean over steps), untraced host gaps modelled
    measured_step_s: float  # traced step time (mean over steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "source": self.source, "paths": self.paths, "layout": self.layout,
            "num_ranks": self.num_ranks, "num_steps": self.num_steps, "num_ops": self.num_ops,
            "T_s": _num(self.T_s), "measured_step_s": _num(self.measured_step_s),
        }


@dataclass(kw_only=True, slots=True)
class DiffResult:
    a: RunSummary
    b: RunSummary
    change: float  # T_b / T_a - 1
    T_b_as_a_s: float  # B replayed with A's durations everywhere the two can be compared
    grain: str  # what one duration of A is matched with in B: "rank" | "stage" | "optype" (per op type)
    contributions: list[Contribution]  # sorted by share, largest first
    not_compared: list[str] = field(default_factory=list)  # op types or parts one run lacks, in words
    notes: list[str] = field(default_factory=list)  # how the two were made comparable, and caveats
    within_noise: bool = False  # |change| under DiffConfig.min_change: the shares are of a tiny change
    # what differs between the two jobs' layouts ("ranks", "dp", "pp", "tp", ..., "op types"); empty
    # when they are alike, and then ``layout_warning`` is None
    layout_mismatch: list[str] = field(default_factory=list)
    # "A is dp 4 x pp 2 (8 ranks), B is dp 2 x pp 4 (8 ranks): the attribution compares unlike jobs"
    layout_warning: str | None = None
    # the part "not from durations" carries more than DiffConfig.structure_share of the change: the
    # headline states it beside the parts named
    structure_large: bool = False

    @property
    def delta_s(self) -> float:
        return self.b.T_s - self.a.T_s

    @property
    def structure(self) -> Contribution | None:
        """The part "not from durations", where the change has one."""
        parts = (c for c in self.contributions if c.selector is None and c.what == NOT_FROM_DURATIONS)
        return next(parts, None)

    @property
    def warnings(self) -> list[str]:
        """What to read the attribution with: unlike layouts, and a change mostly not from durations."""
        out = [self.layout_warning] if self.layout_warning else []
        s = self.structure
        if self.structure_large and s is not None:
            points = f"{100 * abs(self.change * s.share):.1f} of its {100 * abs(self.change):.1f} points"
            out.append(f"{100 * s.share:.1f}% of the change ({points}) is {NOT_FROM_DURATIONS}: the parts "
                       "named explain only the rest")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "change": _num(self.change),
            "delta_s": _num(self.delta_s),
            "T_b_as_a_s": _num(self.T_b_as_a_s),
            "grain": self.grain,
            "within_noise": self.within_noise,
            "contributions": [c.to_json() for c in self.contributions],
            "shares_sum": _num(sum(c.share for c in self.contributions)),
            "not_compared": self.not_compared,
            "notes": self.notes,
            "layout_mismatch": self.layout_mismatch,
            "warnings": self.warnings,
        }


__all__ = ["NOT_FROM_DURATIONS", "Contribution", "DiffResult", "RunSummary"]
