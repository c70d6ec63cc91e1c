"""Hangs and desyncs from Flight Recorder dumps (``laggard hang``): no torch here.

``dumps`` reads them, ``match`` lines collectives up across ranks, ``tracer_state`` adds what
laggard's tracer recorded, ``verdict`` decides; ``analyze_hang`` is the front door.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from laggard.util.lazy import lazy_exports

if TYPE_CHECKING:
    from laggard.hang.verdict import HangConfig, HangReport, diagnose

__all__ = ["HangConfig", "HangReport", "analyze_hang", "diagnose"]


# loaded on first use: `laggard`'s start-up imports this package for its CLI
__getattr__, __dir__, _ = lazy_exports(__name__, dict.fromkeys(("HangConfig", "HangReport", "diagnose"),
                                                               "laggard.hang.verdict"))


def analyze_hang(paths: list[str | Path], config: HangConfig | None = None) -> HangReport:
    """Read the dumps (files or directories, any names) and tracer states under ``paths``; the verdict."""
    from laggard.hang.dumps import expand_paths, load_dumps
    from laggard.hang.tracer_state import read_tracer_states
    from laggard.hang.verdict import diagnose

    ps = [Path(p) for p in paths]
    dumps = load_dumps(ps)
    _files, dirs = expand_paths(ps)
    return diagnose(dumps, read_tracer_states(dirs), config)
