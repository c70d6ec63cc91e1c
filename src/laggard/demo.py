"""`laggard demo`: analyse the shipped example trace and write the HTML report."""

from __future__ import annotations

from pathlib import Path

from laggard.ops import LaggardError

_DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "ndtimeline"


def example_trace() -> Path:
    trace = _DATA / "trace-AR.parquet"
    if not trace.exists():
        raise LaggardError(f"{trace}: the example trace is missing (run from a laggard source checkout)")
    return trace
