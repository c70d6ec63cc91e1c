"""Fleet throughput: 500 small synthetic jobs through `laggard fleet` (local pool, Ray) against the
floor, a plain multiprocessing pool calling `laggard analyze JOB --json OUT` once per job (no
batching, no rows, no resume); peak RSS and the time to the first row."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUM_JOBS = int(os.environ.get("LAGGARD_BENCH_FLEET_JOBS", "500"))
WORKERS = os.cpu_count() or 1
CACHE = Path(tempfile.gettempdir()) / f"laggard-bench-fleet-{NUM_JOBS}"


def _fleet() -> Path:
    if not (CACHE / "done").exists():
        sys.path.insert(0, str(ROOT))
        from tests.fleet_data import make_synthetic

        shutil.rmtree(CACHE, ignore_errors=True)
        make_synthetic(CACHE / "jobs", NUM_JOBS, seed=2026)
        (CACHE / "done").write_text("ok")
    return CACHE / "jobs"


def _floor(jobs: list[Path], out: Path, *, cli: bool) -> float:
    """A forkserver pool, one job per task: `laggard analyze` through its CLI entry (``cli``), or
    the same calls as library functions (the strongest floor)."""
    from laggard.cli import main

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fleet_floor import analyze_to_json

    t0 = time.perf_counter()
    ctx = mp.get_context("forkserver")
    with ctx.Pool(WORKERS) as pool:
        if cli:
            argv = [["analyze", str(j), "--json", str(out / f"{i}.json"), "--quiet"] for i, j in enumerate(jobs)]
            assert not any(pool.map(main, argv, chunksize=1))
        else:
            pool.map(analyze_to_json, [(str(j), str(out / f"{i}.json")) for i, j in enumerate(jobs)], chunksize=1)
    return time.perf_counter() - t0


_DRIVER = """
import json, resource, sys, time
t0 = time.perf_counter()
from laggard.fleet import run_fleet
engine, root, out = sys.argv[1:4]
run = run_fleet([root], out, engine=engine)
print(json.dumps({"wall_s": run.wall_s, "first_row_s": run.first_row_s, "rows": run.num_analysed,
                  "total_s": time.perf_counter() - t0,
                  "rss_driver_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _fleet_run(engine: str, root: Path, out: Path) -> dict:
    import json

    res = subprocess.run([sys.executable, "-c", _DRIVER, engine, str(root), str(out)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def run() -> list[dict]:
    root = _fleet()
    jobs = sorted(p.parent for p in root.rglob("job.json"))
    with tempfile.TemporaryDirectory() as tmp:
        floor_s = _floor(jobs, Path(tmp), cli=False)
        cli_floor_s = _floor(jobs, Path(tmp), cli=True)
        local = _fleet_run("local", root, Path(tmp) / "local")
        try:
            import ray  # noqa: F401

            ray_res: dict | None = _fleet_run("ray", root, Path(tmp) / "ray")
        except (ImportError, RuntimeError) as e:
            print(f"  ray skipped: {e}", file=sys.stderr)
            ray_res = None
    floor_rate = len(jobs) / floor_s
    local_rate = local["rows"] / local["wall_s"]
    figures = [
        {"name": f"fleet --engine local: jobs/s ({len(jobs)} synthetic jobs, {WORKERS} workers)", "value": local_rate,
         "unit": "jobs/s", "baseline": "multiprocessing pool over analyze's calls (load_job, analyze, write_json; one job per task)",
         "baseline_value": floor_rate, "target": ">= 0.9x the floor", "ok": local_rate >= 0.9 * floor_rate,
         "detail": {"local": local, "floor_s": floor_s, "cli_floor_s": cli_floor_s,
                    "cli_floor_jobs_per_s": len(jobs) / cli_floor_s}},
        {"name": "fleet --engine local: time to the first row", "value": local["first_row_s"], "unit": "s"},
        {"name": "fleet --engine local: peak RSS, driver", "value": local["rss_driver_mb"], "unit": "MB",
         "detail": {"largest worker MB": local["rss_worker_mb"]}},
    ]
    if ray_res is not None:
        figures.append({"name": "fleet --engine ray (local Ray): jobs/s, Ray start-up included",
                        "value": ray_res["rows"] / ray_res["wall_s"], "unit": "jobs/s",
                        "baseline": "the same multiprocessing floor", "baseline_value": floor_rate,
                        "detail": ray_res})
        figures.append({"name": "fleet --engine ray: time to the first row (incl. Ray start-up)",
                        "value": ray_res["first_row_s"], "unit": "s"})
    return figures
