"""`laggard fleet` end to end on a fleet of synthetic jobs with known causes (truth.json from the
generator), broken jobs with known faults, the published ST trace and a real profiler job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA, ND, run_cli
from tests.fleet_data import make_broken, make_synthetic

NUM_SYNTHETIC = 56
REAL_CAUSES = ("stage-imbalance", "worker")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> tuple[Path, dict[str, str], dict[str, str]]:
    root = tmp_path_factory.mktemp("fleet") / "jobs"
    truth = make_synthetic(root, NUM_SYNTHETIC, seed=17)
    broken = make_broken(root, ND, DATA / "kineto" / "ddp_gloo")
    return root, truth, broken


@pytest.fixture(scope="module")
def local_run(fleet, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out-local")
    assert run_cli("fleet", fleet[0], "--out", out, "--workers", "2", "--quiet") == 0
    return out


def _rows(out: Path) -> list[dict]:
    return pq.read_table(out / "fleet.parquet").to_pylist()


def test_every_job_once_with_its_cause_or_reason(fleet, local_run):
    _, truth, broken = fleet
    rows = {r["job"]: r for r in _rows(local_run)}
    assert len(rows) == len(_rows(local_run)) == len(truth) + len(broken)
    assert set(rows) == set(truth) | set(broken)
    wrong = [(job, expected, rows[job]["top_cause"], rows[job]["slowdown"]) for job, expected in truth.items()
             if (rows[job]["top_cause"] or "healthy") != expected]
    assert not wrong
    for job, expected in truth.items():
        r = rows[job]
        assert r["status"] == "ok", (job, r["error"])
        assert (r["verdict"] == "healthy") == (expected == "healthy")
        assert r["num_gpus"] >= 4 and 4 <= r["num_steps"] <= 6 and r["wall_s"] > 0
        assert 0.9 <= r["replay_fidelity"] <= 2.0
        assert (local_run / r["json"]).exists()
    for job, expected in broken.items():
        status, _, word = expected.partition(":")
        assert rows[job]["status"] == status, (job, rows[job]["error"])
        assert word in (rows[job]["error"] or ""), (job, rows[job]["error"])
        if status != "ok":
            assert rows[job]["error"]
    # the published ST trace: the fleet row has the paper's published slowdown
    st = next(r for j, r in rows.items() if j.endswith("trace-ST.parquet"))
    published = json.loads((ND / "expected-ST.json").read_text())["slowdown"]
    assert st["slowdown"] == pytest.approx(published, rel=1e-3)
    # S_t of compute vs communication: a slow link is communication, a slow worker compute
    for job, expected in truth.items():
        r = rows[job]
        if expected == "worker":
            assert r["s_compute"] > r["s_comm"]
        if expected == "comm":
            assert r["s_comm"] > r["s_compute"]


def test_job_json_is_the_analyze_document(fleet, local_run, tmp_path):
    job = sorted(fleet[1])[5]
    row = next(r for r in _rows(local_run) if r["job"] == job)
    assert run_cli("analyze", job, "--json", tmp_path / "a.json", "--quiet") == 0
    assert json.loads((local_run / row["json"]).read_text()) == json.loads((tmp_path / "a.json").read_text())


def test_report_and_summary(fleet, local_run):
    _, truth, broken = fleet
    summary = json.loads((local_run / "fleet-summary.json").read_text())
    counts: dict[str, int] = {}
    for c in truth.values():
        counts[c] = counts.get(c, 0) + 1
    # the real jobs' causes are known from outside: the published ST trace has a slow last stage
    # (the paper), the profiler job's rank 2 was slowed by extra matrix products
    for cause in REAL_CAUSES:
        counts[cause] = counts.get(cause, 0) + 1
    assert summary["top_cause_counts"] == counts
    ok_real = len(REAL_CAUSES)
    assert summary["by_status"] == {"ok": len(truth) + ok_real,
                                    "error": sum(1 for e in broken.values() if e.startswith("error")),
                                    "rejected": sum(1 for e in broken.values() if e.startswith("rejected"))}
    assert summary["gpu_hours_wasted"] == pytest.approx(sum(summary["wasted_by_cause"].values()))
    assert summary["gpu_hours_wasted"] == pytest.approx(sum(summary["wasted_by_kind"].values()))
    html = (local_run / "fleet.html").read_text()
    for text in ("GPU-hours wasted by cause", "by op kind", "Slowdown against job size", "Coverage",
                 "Top 20 jobs by GPU-hours wasted", "too few steps", "not a readable Parquet file", "<svg"):
        assert text in html, text
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org", "")


def test_ray_gives_identical_rows(fleet, local_run, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'laggard[ray]')")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # noqa: BLE001 - any failure to start means: no Ray here
        pytest.skip(f"cannot start a local Ray: {e}")
    try:
        from laggard.fleet import run_fleet

        run = run_fleet([fleet[0]], tmp_path, engine="ray")
        assert run.engine == "ray" and run.num_analyzed == len(fleet[1]) + len(fleet[2])
    finally:
        ray.shutdown()

    def key(rows: list[dict]) -> list[dict]:
        return sorted(({k: v for k, v in r.items() if k != "wall_s"} for r in rows), key=lambda r: r["job"])

    assert key(_rows(tmp_path)) == key(_rows(local_run))


def test_kill_then_resume_each_job_once(fleet, tmp_path):
    root, truth, broken = fleet
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "laggard.cli.base", "fleet", str(root), "--out", str(out),
                             "--workers", "1", "--quiet"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    parts = out / ".fleet-parts"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if parts.exists() and len(list(parts.glob("part-*.parquet"))) >= 2:
            break
        time.sleep(0.005)
    assert proc.poll() is None, proc.stderr.read().decode()  # still running: killed halfway
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*.parquet"))
    assert 0 < before < len(truth) + len(broken)
    assert not (out / "fleet.parquet").exists()
    assert run_cli("fleet", root, "--out", out, "--resume", "--workers", "2", "--quiet") == 0
    jobs = [r["job"] for r in _rows(out)]
    assert sorted(jobs) == sorted(set(truth) | set(broken))
    summary = json.loads((out / "fleet-summary.json").read_text())
    assert summary["run"]["num_skipped"] == before
    # a second resume finds everything done and changes nothing
    assert run_cli("fleet", root, "--out", out, "--resume", "--quiet") == 0
    assert sorted(r["job"] for r in _rows(out)) == sorted(jobs)


def test_rows_sorted_by_job(local_run):
    jobs = [r["job"] for r in _rows(local_run)]
    assert jobs == sorted(jobs)


def test_finalize_merges_interleaved_results_in_job_order(tmp_path):
    """An earlier fleet.parquet (resume) interleaves with new parts, one job is in both (a crash
    between the rename and the clean-up), and a part from an older laggard is not in job order."""
    from laggard.fleet.rows import empty_row, to_table
    from laggard.fleet.writer import PARTS, RowWriter, write_part

    def rows(*jobs: str, status: str = "ok") -> list[dict]:
        return [{**empty_row(j, "native", 1), "status": status} for j in jobs]

    out = tmp_path / "out"
    w = RowWriter(out, resume=False)
    write_part(out / PARTS, rows("a", "c", "e", "g"))
    w.finalize()
    w = RowWriter(out, resume=True)
    assert w.done_jobs() == {"a", "c", "e", "g"}
    write_part(out / PARTS, rows("e", "b", "d", status="error"))  # sorted when written
    write_part(out / PARTS, rows("f", "h"))
    old = out / PARTS / "part-0-old.parquet"  # an older laggard's part, in completion order
    pq.write_table(to_table(rows("j", "i")), old)
    w.finalize()
    got = [(r["job"], r["status"]) for r in _rows(out)]
    assert [j for j, _ in got] == list("abcdefghij")
    assert dict(got)["e"] == "ok"  # one row per job, fleet.parquet's first
    assert not (out / PARTS).exists()


def test_ray_cluster_workers_get_laggard_shipped():
    import laggard
    from laggard.fleet.engines import ray_runtime_env

    assert ray_runtime_env(None, True) is None  # a Ray started here runs workers in this environment
    assert ray_runtime_env("ray://head:10001", False) is None
    env = ray_runtime_env("ray://head:10001", True)
    (pkg,) = env["py_modules"]
    assert Path(pkg) == Path(laggard.__file__).parent and (Path(pkg) / "fleet" / "task.py").is_file()


def test_rows_keep_the_hosts_of_the_analysis():
    from laggard.fleet.rows import analysis_row, empty_row, to_table

    doc = {"slowdown": 1.2, "waste": 0.17, "num_workers": 2, "num_gpus": 2, "num_steps": 5, "num_ops": 10,
           "gpu_hours": 1.0, "gpu_hours_wasted": 0.17, "by_opkind": {"compute": 1.1, "comm": 1.0},
           "replay_fidelity": 1.0, "meta": {"hosts": [{"rank": 0, "host": "n1", "gpu_uuid": "GPU-a"},
                                                        {"rank": 1, "host": "n2"}]}}
    row = analysis_row(empty_row("j", "native", 1), doc, replay_error=0.0)
    got = to_table([row]).column("hosts").to_pylist()[0]
    assert got == [{"rank": 0, "host": "n1", "gpu_uuid": "GPU-a", "pci_bus_id": None},
                   {"rank": 1, "host": "n2", "gpu_uuid": None, "pci_bus_id": None}]
    assert to_table([empty_row("k", "native", 1)]).column("hosts").to_pylist() == [[]]


def test_results_written_before_the_hosts_column_still_resume(tmp_path):
    import pyarrow.parquet as pq

    from laggard.fleet.rows import SCHEMA, empty_row, to_table
    from laggard.fleet.writer import _read

    old = to_table([empty_row("j", "native", 1)]).drop_columns(["hosts"])
    pq.write_table(old, tmp_path / "fleet.parquet")
    (batch,) = list(_read(tmp_path / "fleet.parquet"))
    assert batch.schema.equals(SCHEMA) and batch.column(SCHEMA.get_field_index("hosts")).to_pylist() == [None]
