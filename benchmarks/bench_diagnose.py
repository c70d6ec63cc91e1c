"""Diagnosis accuracy on random synthetic scenarios: confusion matrix and gain error."""

from __future__ import annotations

import time

import numpy as np

from laggard.groundtruth.evaluate import FLOORS, confusion, scenarios
from laggard.groundtruth.evaluate import run as run_scenario

NUM_SCENARIOS = 140


def run() -> list[dict]:
    t0 = time.perf_counter()
    outcomes = [run_scenario(sc) for sc in scenarios(NUM_SCENARIOS, seed=2026)]
    elapsed = time.perf_counter() - t0
    m = confusion(outcomes)
    acc = sum(o.correct for o in outcomes) / len(outcomes)
    clean = m["healthy"]
    clean_ok = clean.get("healthy", 0) / max(sum(clean.values()), 1)
    errs = [abs(o.actual_gain / o.predicted_gain - 1) for o in outcomes if o.predicted_gain]
    return [
        {
            "name": f"top finding = injected cause ({NUM_SCENARIOS} random scenarios, 8-1,024 workers)",
            "value": 100 * acc,
            "unit": "%",
            "baseline": "majority guess (always the most common label)",
            "baseline_value": 100 * max(sum(r.values()) for r in m.values()) / len(outcomes),
            "target": ">= 95%",
            "ok": acc >= 0.95,
            "detail": {"confusion": m, "floors": FLOORS, "seconds": elapsed},
        },
        {"name": "clean jobs called healthy", "value": 100 * clean_ok, "unit": "%", "target": "100%",
         "ok": clean_ok == 1.0},
        {
            "name": "predicted gain vs regenerated-without-cause speed-up, max relative error",
            "value": 100 * max(errs),
            "unit": "%",
            "target": "<= 10%",
            "ok": max(errs) <= 0.10,
            "detail": {"median_error_pct": 100 * float(np.median(errs)), "num_checked": len(errs)},
        },
    ]


