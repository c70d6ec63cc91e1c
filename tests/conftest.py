from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
ND = DATA / "ndtimeline"

# Modules whose tests run multi-rank jobs of real processes (gloo ranks, the demo, Flight Recorder jobs)
# and check what their timing shows. `make test` runs the suite on two pytest workers (pytest-xdist,
# --dist loadscope): these modules run one at a time, on one worker, beside at most the other worker's
# single process, the load they are checked under (a busy loop); two 4-rank jobs at once on two cores
# stretched a host stall's measured fix and a stalled rank's peers' gaps past their bounds. Every other
# module is a unit of its own, so that its module fixtures run once.
REAL_JOB_MODULES = frozenset(f"tests/{m}.py" for m in (
    "collectives/test_collectives_dist", "demo/test_demo_act", "demo/test_demo_job", "demo/test_netshape",
    "cli/test_run", "diagnose/test_diagnose_demo", "diagnose/test_host_fix_gain", "diagnose/test_launch_pipeline",
    "engine/test_gaps", "fleet/test_fleet_goodput", "hang/test_hang", "io/test_kineto_crumbs", "io/test_kineto_ddp",
    "io/test_kineto_gc", "io/test_kineto_layout", "io/test_kineto_loader", "io/test_kineto_microbatches",
    "io/test_kineto_p2p", "io/test_kineto_sequences", "io/test_kineto_stall", "mitigate/test_mitigate_controller_dist",
    "mitigate/test_mitigate_demo", "mitigate/test_mitigate_dist", "monitor/test_demo_into_collector",
    "monitor/test_monitor_dashboard", "monitor/test_monitor_hang", "tracer/test_tracer_clock",
    "tracer/test_tracer_dist", "tracer/test_autotrace", "integrations/test_frameworks",
))
REAL_JOBS_UNIT = "real-jobs"

# The CLI caches loaded jobs (laggard.io.cache): the suite's cache is its own, in a temporary
# directory removed at the end, never the user's ~/.cache (each pytest-xdist worker has one; the
# commands tests run as subprocesses inherit it).
_TEST_CACHE = tempfile.mkdtemp(prefix="laggard-test-cache-")
os.environ["LAGGARD_CACHE_DIR"] = _TEST_CACHE
os.environ.pop("LAGGARD_NO_CACHE", None)
os.environ.pop("LAGGARD_CACHE_MAX_GIB", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_TEST_CACHE, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook (run without it, never called)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 - xdist's types
    """``--dist loadscope`` with the modules of ``REAL_JOB_MODULES`` as one unit of work: it holds the
    most tests, so the scheduler hands it out first and its ~10 minutes start at once. (xdist's own
    ``loadgroup`` marks tests by rewriting their node ids, which pytest 9 no longer takes.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class RealJobsApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return REAL_JOBS_UNIT if module in REAL_JOB_MODULES else super()._split_scope(nodeid)

    return RealJobsApart(config, log)


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
            "start_ns": (np.array(cols[4]) * 1e6).astype(np.int64),
            "dur_ns": (np.array(cols[5]) * 1e6).astype(np.int64),
            "group": list(cols[6]), "seq": np.array(cols[7]), **extra,
        }),
        meta=JobMeta(dp_size=2),
    )
