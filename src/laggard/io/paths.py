"""What a trace path names, shared by the loader (``laggard.io``) and the job cache (``laggard.io.cache``)."""

from __future__ import annotations

from pathlib import Path


def is_glob(path: Path) -> bool:
    """Whether ``path`` is a glob of per-rank profiler traces: a wildcard in it and no such file."""
    return any(ch in str(path) for ch in "*?[") and not path.exists()
