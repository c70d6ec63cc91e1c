"""Garbage collections in PyTorch-profiler traces: a real DDP gloo job (the demo job, GC pauses
injected) profiled with ``record_python_gc_info`` (torch's "Python GC" events) and traced by laggard's
own tracer in the same run. The Tracer records every collection through ``gc.callbacks``: an
independent record of the same pauses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from laggard.demo.launch import JobConfig, run_job
from laggard.groundtruth.inject import parse_injections

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def job_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("gc-profiler")
    cfg = JobConfig.quick(dp=2, pp=1, steps=8, injections=parse_injections(["gc-pauses:prob=0.5,pause_ms=60"]),
                          trace_dir=str(base / "trace"), profiler_dir=str(base / "prof"), profiler_gc=True)
    res = run_job(cfg)
    assert res.ok, res.failures
    return {"trace": base / "trace", "prof": base / "prof", "base": base}


def _analyze(path: Path):  # noqa: ANN202
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    job = load_job(path)
    return job, analyze(job)


def _gc_s_by_rank(job) -> dict[int, float]:  # noqa: ANN001
    t = job.table.to_pydict()
    out: dict[int, float] = {}
    for r, n, d in zip(t["rank"], t["name"], t["dur_ns"], strict=True):
        if n == "gc":
            out[r] = out.get(r, 0.0) + d / 1e9
    return out


def _strip_gc_events(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("rank*.json")):
        d = json.loads(f.read_text())
        d["traceEvents"] = [e for e in d["traceEvents"] if e.get("name") != "Python GC"]
        (dst / f.name).write_text(json.dumps(d))


def test_collections_become_gc_ops_of_the_time_they_took(job_dirs: dict[str, Path]) -> None:
    job, _ = _analyze(job_dirs["prof"])
    prof = _gc_s_by_rank(job)
    tracer = _gc_s_by_rank(_analyze(job_dirs["trace"])[0])
    assert sorted(prof) == sorted(tracer) == [0, 1]
    for r in (0, 1):
        # the same collections, recorded twice: the pauses (60 ms each, in half the forward passes)
        # dwarf the young generation's 0.01-0.2 ms collections that stay inside the compute
        assert tracer[r] > 0.2
        assert prof[r] == pytest.approx(tracer[r], rel=0.1), (r, prof[r], tracer[r])
    # every gc op sits where its rank's compute stream was idle: no op of the stream overlaps it
    t = job.table.to_pydict()
    for r in (0, 1):
        rows = [i for i in range(len(t["rank"])) if t["rank"][i] == r and t["stream"][i] == t["stream"][
            next(j for j in range(len(t["name"])) if t["rank"][j] == r and t["name"][j] == "gc")]]
        rows.sort(key=lambda i: t["start_ns"][i])
        start = np.array([t["start_ns"][i] for i in rows])
        end = start + np.array([t["dur_ns"][i] for i in rows])
        assert (start[1:] >= end[:-1] - 1_000).all()  # 1 us: the trace's rounding


def test_profiler_gc_pauses_are_named_gc(job_dirs: dict[str, Path]) -> None:
    _, a = _analyze(job_dirs["prof"])
    assert a.diagnosis.verdict == "straggling"
    top = a.diagnosis.findings[0]
    assert top.cause == "gc", [(f.cause, f.share) for f in a.diagnosis.findings]
    assert "launch-delay" not in [f.cause for f in a.diagnosis.findings if f.share >= 0.5 * top.share]
    # the tracer of the same run agrees
    _, t = _analyze(job_dirs["trace"])
    assert t.diagnosis.findings[0].cause == "gc"


def test_without_the_gc_events_the_pauses_are_host_time(job_dirs: dict[str, Path]) -> None:
    """The same traces less their "Python GC" events (a profile taken without record_python_gc_info):
    the pauses are untraced host time, and nothing says GC."""
    _strip_gc_events(job_dirs["prof"], job_dirs["base"] / "nogc")
    job, a = _analyze(job_dirs["base"] / "nogc")
    assert _gc_s_by_rank(job) == {}
    causes = [f.cause for f in a.diagnosis.findings]
    assert "gc" not in causes
    # the untraced host time carries the slowdown. A collection that lands inside a forward pass's
    # span is that rank's compute, and on a busy host a short run of such steps may name the rank
    # too, with a small share: a straggler's finding is listed before a cost every rank pays, so
    # the launch delay need not come first
    biggest = max(a.diagnosis.findings, key=lambda f: f.share)
    assert biggest.cause == "launch-delay", [(f.cause, round(f.share, 2)) for f in a.diagnosis.findings]
