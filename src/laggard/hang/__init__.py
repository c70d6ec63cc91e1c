"""Hangs and desyncs from Flight Recorder dumps (``laggard hang``): no torch here.

``dumps`` reads them, ``match`` lines collectives up across ranks, ``tracer_state`` adds what
laggard's tracer recorded, ``verdict`` decides; ``analyze_hang`` is the front door.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laggard.hang.verdict import HangConfig, HangReport, diagnose

__all__ = ["HangConfig", "HangReport", "analyze_hang", "diagnose"]


def __getattr__(name: str) -> Any:
    # loaded on first use: `laggard`'s start-up imports this package for its CLI
    if name in ("HangConfig", "HangReport", "diagnose"):
        return getattr(importlib.import_module("laggard.hang.verdict"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def analyze_hang(paths: list[str | Path], config: HangConfig | None = None) -> HangReport:
    """Read the dumps (files or directories, any names) and tracer states under ``paths``; the verdict."""
    from laggard.hang.dumps import expand_paths, load_dumps
    from laggard.hang.tracer_state import read_tracer_states
    from laggard.hang.verdict import diagnose

    ps = [Path(p) for p in paths]
    dumps = load_dumps(ps)
    _files, dirs = expand_paths(ps)
    return diagnose(dumps, read_tracer_states(dirs), config)
