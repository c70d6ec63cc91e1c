"""Fleet throughput: 500 small synthetic jobs through `laggard fleet` (local pool, Ray) against the
floor, a plain multiprocessing pool doing what `laggard analyze JOB --json OUT` does once per job
(no batching, no rows, no resume); peak RSS of the whole process tree and the time to the first row.

Each side runs in its own Python process set up as the `laggard` command sets itself up
(laggard.startup), timed from the pool's start to its end; floor and fleet alternate
LAGGARD_BENCH_FLEET_REPEATS times (the machine is shared) and the figures are medians."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
NUM_JOBS = int(os.environ.get("LAGGARD_BENCH_FLEET_JOBS", "500"))
REPEATS = int(os.environ.get("LAGGARD_BENCH_FLEET_REPEATS", "3"))
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


# the floor: a forkserver pool, one job per task, through `laggard analyze`'s CLI entry ("cli") or
# the same calls as library functions ("lib", the strongest floor)
_FLOOR = f"""
import json, multiprocessing as mp, sys, time
from laggard.startup import lean_process
lean_process()
from laggard.cli.base import main
from fleet_floor import analyze_to_json, init
mode, jobs_file, out = sys.argv[1:4]
jobs = open(jobs_file).read().split()
if __name__ == "__main__":
    t0 = time.perf_counter()
    with mp.get_context("forkserver").Pool({WORKERS}, initializer=init) as pool:
        if mode == "cli":
            # --no-cache: each job read from its files, as the fleet reads it
            argv = [["--no-cache", "analyze", j, "--json", f"{{out}}/{{i}}.json", "--quiet"]
                    for i, j in enumerate(jobs)]
            assert not any(pool.map(main, argv, chunksize=1))
        else:
            pool.map(analyze_to_json, [(j, f"{{out}}/{{i}}.json") for i, j in enumerate(jobs)], chunksize=1)
    print(json.dumps({{"wall_s": time.perf_counter() - t0, "rows": len(jobs)}}))
"""

_DRIVER = """
import json, sys, time
from laggard.startup import lean_process
lean_process()
from laggard.fleet import run_fleet
engine, root, out = sys.argv[1:4]
if __name__ == "__main__":
    run = run_fleet([root], out, engine=engine)
    print(json.dumps({"wall_s": run.wall_s, "first_row_s": run.first_row_s, "rows": run.num_analyzed}))
"""


def _sub(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter; its JSON line plus the peak RSS of its process tree."""
    sys.path.insert(0, str(HERE))
    from proctree import PeakRSS

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE)])}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        p = subprocess.Popen([sys.executable, f.name, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
        with PeakRSS(p.pid) as mem:
            out, err = p.communicate()
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        raise RuntimeError(err[-2000:])
    res = json.loads(out.strip().splitlines()[-1])
    res.update(rss_tree_mb=mem.peak_mb, rss_largest_mb=mem.largest_mb, num_procs=mem.max_procs)
    return res


def _rate(r: dict) -> float:
    return r["rows"] / r["wall_s"]


def run() -> list[dict]:
    root = _fleet()
    jobs = sorted(p.parent for p in root.rglob("job.json"))
    floors, locals_ = [], []
    with tempfile.TemporaryDirectory() as tmp:
        jobs_file = Path(tmp) / "jobs.txt"
        jobs_file.write_text("\n".join(map(str, jobs)))
        for i in range(REPEATS):  # alternate, so that a busy spell on the shared machine hits both
            (Path(tmp) / f"floor{i}").mkdir()
            floors.append(_sub(_FLOOR, "lib", str(jobs_file), str(Path(tmp) / f"floor{i}")))
            locals_.append(_sub(_DRIVER, "local", str(root), str(Path(tmp) / f"local{i}")))
        (Path(tmp) / "cli").mkdir()
        cli_floor = _sub(_FLOOR, "cli", str(jobs_file), str(Path(tmp) / "cli"))
        try:
            import ray  # noqa: F401

            ray_res: dict | None = _sub(_DRIVER, "ray", str(root), str(Path(tmp) / "ray"))
        except (ImportError, RuntimeError) as e:
            print(f"  ray skipped: {e}", file=sys.stderr)
            ray_res = None
    floor_rate = statistics.median(map(_rate, floors))
    local_rate = statistics.median(map(_rate, locals_))
    ratios = [_rate(a) / _rate(b) for a, b in zip(locals_, floors, strict=True)]
    local = min(locals_, key=lambda r: abs(_rate(r) - local_rate))
    figures = [
        {"name": f"fleet --engine local: jobs/s ({len(jobs)} synthetic jobs, {WORKERS} workers, median of {REPEATS})",
         "value": local_rate, "unit": "jobs/s",
         "baseline": "multiprocessing pool over analyze's calls (load_job, analyze, write_json; one job per task)",
         "baseline_value": floor_rate, "target": ">= 0.9x the floor", "ok": statistics.median(ratios) >= 0.9,
         "detail": {"ratio_per_pair": ratios, "local_runs": locals_, "floor_runs": floors,
                    "cli_floor_jobs_per_s": _rate(cli_floor)}},
        {"name": "fleet --engine local: time to the first row", "value": local["first_row_s"], "unit": "s"},
        {"name": "fleet --engine local: peak RSS, whole process tree (driver, forkserver, workers)",
         "value": local["rss_tree_mb"], "unit": "MB", "baseline": "the floor's process tree",
         "baseline_value": min(f["rss_tree_mb"] for f in floors),
         "detail": {"largest process MB": local["rss_largest_mb"], "processes": local["num_procs"]}},
    ]
    if ray_res is not None:
        figures.append({"name": "fleet --engine ray (local Ray): jobs/s, Ray start-up included",
                        "value": _rate(ray_res), "unit": "jobs/s",
                        "baseline": "the same multiprocessing floor", "baseline_value": floor_rate,
                        "detail": ray_res})
        figures.append({"name": "fleet --engine ray: time to the first row (incl. Ray start-up)",
                        "value": ray_res["first_row_s"], "unit": "s"})
    return figures
