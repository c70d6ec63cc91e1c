"""Traces recorded on a real GPU (an NVIDIA H200, torch 2.11.0+cu130; ``benchmarks/gpu_check.py``,
see ``tests/data/gpu/README.md``): what no CPU-only machine produces.

* ``gloo_cuda_*``: 2 processes on the one GPU, rank 1 doing 1.5x the matrix work, gradients
  all-reduced by gloo through host copies; traced by the Tracer (CUDA events) and torch.profiler
  (CUPTI kernels). Ground truth: rank 1 is the slow worker.
* ``nccl_flight``: a 1-rank NCCL job with the Flight Recorder on: its dump and its Tracer trace.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from laggard.analysis.pipeline import analyze
from laggard.io import load_job
from tests.conftest import run_cli

GPU = Path(__file__).parents[1] / "data" / "gpu"
SLOW = 1


def _workers(res) -> list[int]:  # noqa: ANN001
    return sorted({w["rank"] for f in res.diagnosis.findings if f.cause == "worker" for w in f.workers})


def test_profiler_trace_of_gpu_ranks_with_host_collectives_names_the_slow_rank() -> None:
    """GPU compute with gloo collectives on the host: the collectives come from the CPU side (the
    importer once looked only for NCCL kernels on GPU ranks, found none, and called the job's whole
    slowdown untraced launch delay)."""
    job = load_job(GPU / "gloo_cuda_kineto")
    tab = job.table.to_pydict()
    coll = [(r, s, g, q) for r, s, k, g, q in zip(tab["rank"], tab["step"], tab["kind"], tab["group"], tab["seq"],
                                                   strict=True) if k == "collective"]
    names = {n for n, k in zip(tab["name"], tab["kind"], strict=True) if k == "collective"}
    assert names == {"gloo:all_reduce"}
    steps = sorted({s for _, s, _, _ in coll})
    assert len(steps) == 8
    for s in steps:  # one all_reduce per rank and step, the same (group, seq) on both ranks
        ends = {(g, q) for r, st, g, q in coll if st == s}
        assert len(ends) == 1 and len([1 for _, st, _, _ in coll if st == s]) == 2
    res = analyze(job)
    assert res.diagnosis.verdict == "straggling"
    assert _workers(res) == [SLOW]


def test_tracer_trace_timed_with_cuda_events_names_the_slow_rank() -> None:
    job = load_job(GPU / "gloo_cuda_tracer")
    assert job.meta.extra["timing"] == "cuda-events"
    res = analyze(job)
    assert res.diagnosis.verdict == "straggling"
    assert _workers(res) == [SLOW]
    assert 0.97 < res.replay_fidelity < 1.03


def test_nccl_flight_recorder_dump_is_read_by_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hang.json"
    assert run_cli("hang", GPU / "nccl_flight", "--json", out) == 0
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "healthy"
    assert doc["ranks"]["0"]["num_entries"] == 63  # the NCCL recorder's entries, not the empty gloo one's
    raw = pickle.loads((GPU / "nccl_flight" / "flight-rank0.pkl").read_bytes())  # noqa: S301 - our test data
    assert {e["profiling_name"] for e in raw["entries"]} >= {"nccl:all_reduce"}


class _FakeC10d:
    """torch._C._distributed_c10d of a CUDA build: a generic recorder and NCCL's own."""

    def __init__(self, fr: list[dict], nccl: list[dict] | None) -> None:
        self.fr, self.nccl = fr, nccl

    def _dump_fr_trace(self, includeStackTraces: bool = True) -> bytes:  # noqa: N803 - torch's keyword
        return pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": self.fr})

    def _dump_nccl_trace(self, includeStackTraces: bool = True) -> bytes:  # noqa: N803
        return pickle.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "ranks": "[0, 1]"}},
                             "pg_status": {"0": {"last_completed_collective": 2}}, "entries": self.nccl,
                             "comm_lib_version": "2.28.9"})


def test_flight_dump_reads_both_recorders() -> None:
    from laggard.tracer.flight import read_buffers

    def entry(name: str, t: int) -> dict:
        return {"profiling_name": name, "time_created_ns": t}

    class Plain(_FakeC10d):  # a CPU build: no NCCL recorder
        _dump_nccl_trace = None

    plain = Plain([entry("gloo:all_reduce", 1)], None)
    assert [e["profiling_name"] for e in read_buffers(plain, False)["entries"]] == ["gloo:all_reduce"]
    only_nccl = read_buffers(_FakeC10d([], [entry("nccl:all_reduce", 5)]), False)
    assert [e["profiling_name"] for e in only_nccl["entries"]] == ["nccl:all_reduce"]
    assert only_nccl["pg_config"]["0"]["ranks"] == "[0, 1]"
    both = read_buffers(_FakeC10d([entry("gloo:barrier", 3)], [entry("nccl:all_reduce", 1), entry("nccl:send", 9)]),
                        False)
    assert [e["profiling_name"] for e in both["entries"]] == ["nccl:all_reduce", "gloo:barrier", "nccl:send"]
    assert both["comm_lib_version"] == "2.28.9"


def test_arrow_to_numpy_never_goes_through_pandas() -> None:
    """``DataType.to_pandas_dtype`` imports pandas in pyarrow <= 25 and raised under the CLI (which
    hides pandas) on the GPU machine's pyarrow 25.0.1: every `laggard analyze` failed there."""
    src = Path(__file__).parents[2] / "src" / "laggard"
    bad = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py")
           for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.to_pandas(_dtype)?\(", line)]
    assert bad == []
    import numpy as np
    import pyarrow as pa

    from laggard.optable.ops import numpy_dtype

    for t in (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64(), pa.float16(),
              pa.float32(), pa.float64()):
        assert numpy_dtype(t) == np.array(pa.array([1], type=t)).dtype
    with pytest.raises(TypeError):
        numpy_dtype(pa.string())


def test_analyze_cli_on_gpu_profiler_trace_in_a_fresh_process() -> None:
    """The CLI's own process (pandas hidden, as on any machine without it)."""
    p = subprocess.run([sys.executable, "-m", "laggard.cli.base", "analyze", str(GPU / "gloo_cuda_kineto"),
                        "--json", "-"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert [w["rank"] for f in doc["findings"] if f["cause"] == "worker" for w in f["workers"]] == [SLOW]
