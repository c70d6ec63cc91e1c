"""How long a job stood still: the window a hang verdict covers, for the fleet's goodput.

A job that hangs (``hang``, ``desync``, ``missing-ranks``) lost every GPU from the moment its first
rank entered the collective that never completed (the oldest pending entry of any rank's buffer;
with none pending, the newest entry of any rank: the last sign of progress) until its last dump
(the watchdog's, the emergency flush's or the end's: the job was killed then or later, so the
window is a lower bound). ``find_hang`` looks for the Tracer's dumps (``flight-rank{R}.pkl|json``)
in a trace directory and returns the verdict with its window.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from laggard.errors import LaggardError, LaggardWarning
from laggard.hang.dumps import RankDump

HUNG_VERDICTS = ("hang", "desync", "missing-ranks")  # the job stopped; straggling and healthy did not
_DUMP_NAME = re.compile(r"^flight-rank\d+\.(pkl|json)$")  # laggard.optable.tracedir.flight_name


@dataclass(kw_only=True, slots=True)
class HangWindow:
    verdict: str
    culprit_ranks: list[int]
    start_ns: int  # Unix ns: the first rank entered what never completed
    end_ns: int  # Unix ns: the last dump

    @property
    def lost_s(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9


def stalled_window(dumps: list[RankDump]) -> tuple[int, int] | None:
    """(start, end) in Unix ns of the time the job stood still (see the module); None without times."""
    pending = [e.created_ns for d in dumps for e in d.entries if not e.done and e.created_ns > 0]
    seen = [d.seen_ns for d in dumps if d.seen_ns]
    if not seen:
        return None
    start = min(pending) if pending else max((e.created_ns for d in dumps for e in d.entries if e.created_ns > 0),
                                             default=None)
    if start is None:
        return None
    return int(start), int(max(seen))


def find_hang(trace_dir: Path) -> HangWindow | None:
    """The hang of the job traced in ``trace_dir`` from the dumps beside its trace: None when there
    are none, they do not read as a hang, or they cannot be read (warned: a fleet goes on)."""
    if not trace_dir.is_dir() or not any(_DUMP_NAME.match(p.name) for p in trace_dir.iterdir()):
        return None
    from laggard.hang.dumps import load_dumps
    from laggard.hang.tracer_state import read_tracer_states
    from laggard.hang.verdict import diagnose

    files = sorted(p for p in trace_dir.iterdir() if _DUMP_NAME.match(p.name))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LaggardWarning)
            dumps = load_dumps(files)
            report = diagnose(dumps, read_tracer_states([trace_dir]))
    except LaggardError as e:
        warnings.warn(f"{trace_dir}: hang dumps not read ({e})", LaggardWarning, stacklevel=2)
        return None
    if report.verdict not in HUNG_VERDICTS:
        return None
    window = stalled_window(dumps)
    if window is None:
        return None
    return HangWindow(verdict=report.verdict, culprit_ranks=list(report.culprit_ranks), start_ns=window[0],
                      end_ns=window[1])


__all__ = ["HUNG_VERDICTS", "HangWindow", "find_hang", "stalled_window"]
