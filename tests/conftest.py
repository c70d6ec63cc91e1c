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
    from laggard.analysis.pipeline import analyze
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
    from laggard.cli.base import main

    return main([str(a) for a in args])


def job_from_rows(rows: list[tuple], streams: bool = False):  # -> laggard.optable.ops.Job
    """A 2-DP-rank job from rows (rank, step, name, kind, start_ms, dur_ms, group, seq); ``streams``:
    compute and communication on streams of their own, a communication op waiting for the rank's
    previous row of the step."""
    import numpy as np

    from laggard.optable.ops import Job, JobMeta, make_table

    cols = list(zip(*rows, strict=True))
    extra = {}
    if streams:
        extra["stream"] = ["compute" if k == "compute" else "comm" for k in cols[3]]
        prev: dict[tuple, int] = {}
        deps = []
        for i, (rank, step, _, kind, *_rest) in enumerate(rows):
            deps.append([prev[rank, step]] if kind != "compute" and (rank, step) in prev else None)
            prev[rank, step] = i
        extra["deps"] = deps
    return Job(
        table=make_table({
            "rank": np.array(cols[0]), "step": np.array(cols[1]), "name": list(cols[2]), "kind": list(cols[3]),
            "start_ns": (np.array(cols[4]) * 1e6).astype(np.int64), "dur_ns": (np.array(cols[5]) * 1e6).astype(np.int64),
            "group": list(cols[6]), "seq": np.array(cols[7]), **extra,
        }),
        meta=JobMeta(dp_size=2),
    )
