from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
ND = DATA / "ndtimeline"


@pytest.fixture(scope="session")
def nd_dir() -> Path:
    return ND


@pytest.fixture(scope="session")
def analyses():
    """Analyses of the two published traces, computed once."""
    from laggard.io import load_job
    from laggard.whatif import analyze

    return {n: analyze(load_job(ND / f"trace-{n}.parquet")) for n in ("ST", "AR")}


@pytest.fixture(scope="session")
def expected():
    return {n: json.loads((ND / f"expected-{n}.json").read_text()) for n in ("ST", "AR")}


def run_cli(*args: str) -> int:
    from laggard.cli import main

    return main([str(a) for a in args])
