"""Candidates: a nominated finding with its targeted what-if, before the joint attribution scores it.
The result types (``Finding``, ``Diagnosis``) are data in ``laggard.results.diagnosis``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.results.diagnosis import Finding
from laggard.whatif.custom import Change


@dataclass(kw_only=True, slots=True, eq=False)  # numpy arrays: a generated == could only raise (no truth value)
class Candidate:
    """A nominated finding and its targeted what-if (``laggard.whatif.custom`` changes: only what it
    names made healthy) and the job's weights with them applied. ``gap_share``: the what-if models
    untraced gaps from this share of a step on (the launch-delay finding on many small gaps); such
    a candidate is scored on its own, outside the joint attribution (``weights`` None);
    ``hidden_share`` is the part of the slowdown it carries once the other causes are fixed, where
    they hide it today (the launch overhead every rank pays: the median rank's untraced host time).
    ``min_gain``: its own speed-up floor where it is above the diagnosis's ``min_gain`` (a link slow
    only in its tail, ``DiagnoseConfig.comm_tail_min_gain``). ``left``: for a straggler of the job with
    the found causes fixed (``laggard.diagnose.hidden``), the share of the slowdown those causes leave
    unexplained: it may explain ``min_share`` of that rest instead of the whole slowdown, where its own
    fix speeds the measured step up by the speed-up floor (``explain.floor_of``). For a candidate
    scored on its own job model (``explain.score_alone``): ``step_s``, its mean step there, ``removed_s``,
    what its fix takes off it, and ``ideal_paid_s``, the part of that the pooled ideal pays too (no part
    of the slowdown S measures)."""

    finding: Finding
    changes: list[Change]
    weights: np.ndarray | None = None
    gap_share: float | None = None
    hidden_share: float = 0.0
    min_gain: float | None = None
    left: float | None = None
    step_s: float = 0.0
    removed_s: float = 0.0
    ideal_paid_s: float = 0.0
    # found hidden by the joint attribution itself: it gains the named floor only fixed after the others
    # (``explain._hidden_last``, which sets its finding's ``hidden`` and ``once_fixed``)
    masked: bool = False

    def __post_init__(self) -> None:
        self.finding.whatif = [a for c in self.changes for a in c.args()]
        if self.gap_share is not None:
            self.finding.whatif = ["--gap-share", f"{self.gap_share:g}"] + self.finding.whatif
