"""The frameworks on real 2-rank CPU DDP jobs over gloo (tests/framework_jobs.py): pytorch-lightning and
transformers.Trainer traced with no code change (``laggard run``) and through their callbacks
(laggard.integrations), a loop of accelerate's through its ``autotrace``; the slowed rank named by the
analysis of what was captured, a clean run naming none. Each test skips when its framework is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from laggard.collectives.launch import free_port
from tests.rank_procs import finish_ranks, first_failure

pytest.importorskip("torch", reason="the framework jobs need torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

JOB = Path(__file__).resolve().parents[1] / "framework_jobs.py"
SRC = Path(__file__).resolve().parents[2] / "src"
LAGGARD = Path(sys.executable).with_name("laggard")
STEPS = 15
SLOW = {"SLOW_RANK": "1", "SLOW_MS": "30"}


@pytest.fixture
def lightning() -> None:
    pytest.importorskip("pytorch_lightning", reason="needs pytorch-lightning (pip install laggard[lightning])")


@pytest.fixture
def hf() -> None:
    pytest.importorskip("transformers", reason="needs transformers (pip install laggard[hf])")
    pytest.importorskip("accelerate", reason="needs accelerate (pip install laggard[hf])")


def _env(tmp: Path, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAGGARD_") or k.startswith("LAGGARD_CACHE")}
    return {**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SRC), "STEPS": str(STEPS), "HF_OUT": str(tmp / "hf"),
            "TOKENIZERS_PARALLELISM": "false", **env}


def run_workers(mode: str, tmp: Path, *, world: int = 2, timeout: float = 240, rc: int = 0, **env: str) -> None:
    """The ranks started as torchrun starts them (its environment: Lightning takes TORCHELASTIC_RUN_ID to
    mean the launcher made every rank), with no laggard in between."""
    port = free_port()
    procs = []
    for rank in range(world):
        e = _env(tmp, RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", WORLD_SIZE=str(world),
                 LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 TORCHELASTIC_RUN_ID="framework-test", **env)
        procs.append(subprocess.Popen([sys.executable, str(JOB), mode], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    bad = first_failure(finish_ranks(procs, timeout), rc)
    assert bad is None, bad


def laggard_run(mode: str, tmp: Path, **env: str) -> Path:
    """``laggard run --nproc-per-node 2`` on the job: the trace's directory."""
    out = tmp / "trace"
    p = subprocess.run([str(LAGGARD), "run", "--nproc-per-node", "2", "--out", str(out), "-q", "--no-analyze",
                        str(JOB), mode], cwd=tmp, env=_env(tmp, **env), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def ops(trace: Path) -> list[dict]:
    files = sorted(trace.glob("ops-rank*.parquet"))
    assert files, f"no shards in {trace}"
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()


def findings(trace: Path, tmp: Path) -> list[dict]:
    from laggard.cli.base import main

    out = tmp / "analysis.json"
    assert main(["analyze", str(trace), "--json", str(out), "-q"]) == 0
    return json.loads(out.read_text())["findings"]


def _ranks(workers: list) -> list[int]:
    return [int(w["rank"]) if isinstance(w, dict) else int(w) for w in workers]


def assert_names_rank(trace: Path, tmp: Path, rank: int) -> None:
    first = findings(trace, tmp)[0]
    assert first["cause"] == "worker" and _ranks(first["workers"]) == [rank], first


def assert_traced(trace: Path, name: str) -> list[dict]:
    """One step per optimizer step on both ranks, each with its forward, backward, optimizer step and DDP
    gradient all-reduce; every collective has both ranks (its (step, group, seq) matches)."""
    meta = json.loads((trace / "job.json").read_text())
    assert meta["world_size"] == 2 and meta["name"] == name and meta["extra"]["capture"] == "autotrace", meta
    rows = ops(trace)
    per = defaultdict(Counter)
    for r in rows:
        per[(r["rank"], r["step"])][r["name"]] += 1
    assert set(per) == {(rank, s) for rank in (0, 1) for s in range(STEPS)}, sorted(per)
    for key, names in per.items():
        for phase in ("forward-compute", "backward-compute", "optimizer", "grads-all-reduce"):
            assert names[phase] >= 1, (key, names)
    members = defaultdict(set)
    for r in rows:
        if r["kind"] == "collective":
            members[(r["step"], r["group"], r["seq"])].add(r["rank"])
    assert members and all(m == {0, 1} for m in members.values()), members
    return rows


def test_lightning_zero_code_names_the_slow_rank(lightning, tmp_path: Path) -> None:
    trace = laggard_run("lightning", tmp_path, **SLOW)
    assert_traced(trace, "framework_jobs")
    assert_names_rank(trace, tmp_path, 1)


def test_lightning_callback_names_the_slow_rank(lightning, tmp_path: Path) -> None:
    run_workers("lightning", tmp_path, TRACE_OUT=str(tmp_path / "trace"), **SLOW)
    assert_traced(tmp_path / "trace", "lightning-explicit")
    state = json.loads((tmp_path / "trace" / "rank1.state.json").read_text())
    assert state["status"] == "closed", state
    assert_names_rank(tmp_path / "trace", tmp_path, 1)


def test_lightning_callback_closes_a_failed_fit_as_failed(lightning, tmp_path: Path) -> None:
    run_workers("lightning", tmp_path, rc=1, TRACE_OUT=str(tmp_path / "trace"), FAIL_AT="5")
    for rank in (0, 1):
        state = json.loads((tmp_path / "trace" / f"rank{rank}.state.json").read_text())
        assert state["status"] == "failed: RuntimeError", state
    assert {r["step"] for r in ops(tmp_path / "trace")} == set(range(6))  # the failed step's forward too


def test_lightning_clean_run_names_no_rank_and_the_callback_leaves_laggard_run_its_session(
        lightning, tmp_path: Path) -> None:
    """No rank is slowed: no finding names one. The script has the callback too: under ``laggard run`` it
    starts no second session (nothing in its own directory; the run's trace is whole)."""
    trace = laggard_run("lightning", tmp_path, TRACE_OUT=str(tmp_path / "callback-trace"))
    assert not (tmp_path / "callback-trace").exists()
    assert_traced(trace, "framework_jobs")
    named = [f for f in findings(trace, tmp_path) if f.get("workers")]
    if named:
        # a known false alarm of the diagnosis (healthy ranks named within the job's noise on 2 shared
        # cores, a communication tail most often); the capture's part above has passed
        pytest.xfail(f"issue 60: clean run, findings name ranks: {[(f['cause'], f['workers']) for f in named]}")


def test_hf_trainer_zero_code_names_the_slow_rank(hf, tmp_path: Path) -> None:
    trace = laggard_run("hf", tmp_path, **SLOW)
    assert_traced(trace, "framework_jobs")
    assert_names_rank(trace, tmp_path, 1)


def test_hf_trainer_callback_traces_every_step(hf, tmp_path: Path) -> None:
    run_workers("hf", tmp_path, TRACE_OUT=str(tmp_path / "trace"))
    rows = assert_traced(tmp_path / "trace", "hf-explicit")
    # one optimizer step each: the one inside accelerate's AcceleratedOptimizer ends the step
    assert Counter(r["name"] for r in rows if r["rank"] == 0)["optimizer"] == STEPS
    grads = [r for r in rows if r["name"] == "grads-all-reduce"]
    assert all(r["kind"] == "collective" and r["size_bytes"] > 0 for r in grads), grads[:3]


def test_accelerate_autotrace_names_the_slow_rank(hf, tmp_path: Path) -> None:
    run_workers("accelerate", tmp_path, TRACE_OUT=str(tmp_path / "trace"), **SLOW)
    assert_traced(tmp_path / "trace", "accelerate-explicit")
    assert_names_rank(tmp_path / "trace", tmp_path, 1)


def test_importing_the_integrations_imports_no_framework() -> None:
    code = ("import sys, laggard.integrations as i; i.__all__; "
            "print(sorted(m for m in ('pytorch_lightning', 'lightning', 'transformers', 'accelerate', 'torch') "
            "if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(SRC)},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "[]", (p.stdout, p.stderr)
