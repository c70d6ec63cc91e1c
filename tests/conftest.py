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
    from laggard.analysis import analyze
    from laggard.io import load_job

    return {n: analyze(load_job(ND / f"trace-{n}.parquet")) for n in ("ST", "AR")}


@pytest.fixture(scope="session")
def ar(analyses):
    """The analysis of the published AR trace (one worker slowed down)."""
    return analyses["AR"]


@pytest.fixture(scope="session")
def st(analyses):
    """The analysis of the published ST trace (a slow last pipeline stage)."""
    return analyses["ST"]


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Path:
    """A directory path that cannot be created: it names a regular file."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    return blocker


@pytest.fixture(scope="session")
def expected():
    return {n: json.loads((ND / f"expected-{n}.json").read_text()) for n in ("ST", "AR")}


def run_cli(*args: str) -> int:
    from laggard.cli import main

    return main([str(a) for a in args])
