"""A dp 2 x pp 2 pipeline over posted isend/irecv (1F1B), profiled with torch.profiler on gloo: the
program is benchmarks/families/pp_async_profiler.py, run for real with torchrun.

Stage 0 posts its next forward's send before the previous backward's receive; stage 1 posts them the
other way round. Chained in posting order on each rank's transfer thread, the two made a cycle and
the job could not be analyzed; and the per-stage gradient all-reduces, which gloo's events name no
process group for, were matched across the stages. The truth is the program's own injection: rank 3
runs its emulated device 1.8x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laggard.collectives.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "benchmarks" / "families" / "pp_async_profiler.py"

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pp-async") / "trace"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(PROGRAM), "--steps", "8", "--seed", "1", "--inject", "device",
           "--factor", "1.8", "--rank", "3", "--capture", "profiler", "--out", str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_posted_transfers_make_no_cycle_and_the_slow_rank_is_named(trace: Path, tmp_path: Path) -> None:
    from laggard.cli.base import main

    assert main(["analyze", str(trace), "--json", str(tmp_path / "a.json"), "-q"]) == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    assert (doc["meta"]["dp"], doc["meta"]["pp"]) == (2, 2)
    named = [[w["rank"] for w in f["workers"]] for f in doc["findings"] if f["workers"]]
    assert named and named[0] == [3], doc["findings"]


def test_unnamed_all_reduces_are_matched_within_their_stage(trace: Path) -> None:
    import warnings

    from laggard.io import load_job

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job = load_job(trace)
    rows = [r for r in job.table.select(["rank", "pp_rank", "kind", "group"]).to_pylist() if r["kind"] == "collective"]
    assert rows
    by_group: dict[str, set[int]] = {}
    for r in rows:
        by_group.setdefault(r["group"], set()).add(r["pp_rank"])
    assert all(len(stages) == 1 for stages in by_group.values()), by_group
