"""Diagnosis against an independent simulator (laggard.groundtruth.dessim): a mixture sweep of jobs with 0-4
simultaneous causes (baseline in the same run: the single-cause diagnosis on the same jobs); the same
sweep with the noise of real jobs (``NOISE["real"]``, calibrated on the real corpus's clean jobs:
``CALIBRATION``), whose figures stand beside the real corpus's (benchmarks/real_corpus.py); and the
single-cause sweep on the simulator beside the one on `laggard synth` (bench_diagnose)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor

from laggard.groundtruth.evaluate_mixed import (
    CALIBRATION,
    FLOORS,
    by_kind,
    mixed_scenarios,
    run_mixed,
    summary,
)

NUM_JOBS = int(os.environ.get("LAGGARD_BENCH_MIX_JOBS", "200"))
PROCS = int(os.environ.get("LAGGARD_BENCH_PROCS", str(min(os.cpu_count() or 1, 4))))


def _run_all(scenarios: list) -> list:
    """Jobs in a process pool (each simulates its own truth: 2-10 SimPy runs, the slow part);
    the largest first, so that the pool does not end waiting on one of them."""
    order = sorted(range(len(scenarios)), key=lambda i: -scenarios[i].cfg.num_ranks)
    with ProcessPoolExecutor(PROCS) as ex:
        done = dict(zip(order, ex.map(run_mixed, [scenarios[i] for i in order], chunksize=1), strict=True))
    return [done[i] for i in range(len(scenarios))]


def _rows(tag: str, outcomes: list, elapsed: float) -> list[dict]:
    full, single = summary(outcomes, "full"), summary(outcomes, "single")
    n = full["num_jobs"]
    return [
        {"name": f"{tag}: precision of named causes (cause + workers/stage/link), {n} jobs", "value": full["precision"],
         "baseline": "single-cause diagnosis (top finding only), same jobs", "baseline_value": single["precision"],
         "target": ">= 0.95", "ok": full["precision"] >= 0.95,
         "detail": {"floors": FLOORS, "seconds": elapsed, "causes_below_floor": full["below_floor"],
                    "by_kind": by_kind(outcomes, "full"), "baseline_by_kind": by_kind(outcomes, "single")}},
        {"name": f"{tag}: recall of named causes, {full['num_causes']} causes", "value": full["recall"],
         "baseline": "single-cause diagnosis", "baseline_value": single["recall"], "target": ">= 0.95",
         "ok": full["recall"] >= 0.95},
        {"name": f"{tag}: predicted gain vs simulated speed-up without the cause, median |error|",
         "value": 100 * full["gain_err_median"], "unit": "%", "target": "<= 10%", "ok": full["gain_err_median"] <= 0.10,
         "detail": {"p90_pct": 100 * full["gain_err_p90"], "baseline_median_pct": 100 * single["gain_err_median"]}},
        {"name": f"{tag}: clean jobs called healthy", "value": 100 * full["clean_healthy"], "unit": "%",
         "target": "100%", "ok": full["clean_healthy"] == 1.0},
    ]


def run() -> list[dict]:
    t0 = time.perf_counter()
    mixed = _run_all(mixed_scenarios(NUM_JOBS, seed=2026))
    rows = _rows("mixture (1-4 causes)", mixed, time.perf_counter() - t0)
    t0 = time.perf_counter()
    real = _run_all(mixed_scenarios(max(NUM_JOBS // 2, 8), seed=2026, noise="real"))
    real_rows = _rows("mixture, real-job noise (1-4 causes)", real, time.perf_counter() - t0)
    real_rows[0]["detail"]["noise"] = CALIBRATION
    rows += real_rows
    t0 = time.perf_counter()
    single = _run_all(mixed_scenarios(max(NUM_JOBS // 4, 8), seed=7, max_causes=1))
    return rows + _rows("single cause on the simulator", single, time.perf_counter() - t0)
