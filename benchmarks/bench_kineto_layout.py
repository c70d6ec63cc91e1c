"""Stage attribution read from PyTorch-profiler traces of pipeline jobs, beside an independent record
of the same run.

CPU: the demo job (dp 2 x pp 2, gloo, heavy last stage x4) runs under torch.profiler and laggard's
own tracer at once, ``RUNS`` times; each run's profiler traces and tracer pages are analyzed and
the last stage's S_stage and the job's S compared (issue 13: within 5%).
GPU: the discrete-event simulator's kineto export (kernel names carry no phase; the launching CPU
op does) against the simulator's own op table of the same run, for pp 2 and pp 4.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import warnings
from pathlib import Path

RUNS = 3
SIM_CASES = ((2, "heavy-stage:stage=1,factor=2"), (4, "heavy-stage:stage=3,factor=1.5"),
             (4, "slow-worker:rank=5,factor=1.5"))


def _analyze(path: Path):  # noqa: ANN202
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(load_job(path), diagnose=False)


def _cpu_runs() -> list[dict]:
    from laggard.demo.launch import JobConfig, run_job
    from laggard.groundtruth.inject import parse_injections

    rows = []
    for i in range(RUNS):
        with tempfile.TemporaryDirectory(prefix="laggard-bench-pp-") as d:
            base = Path(d)
            cfg = JobConfig.quick(steps=6, injections=parse_injections(["heavy-last-stage:factor=4"]),
                                  trace_dir=str(base / "trace"), profiler_dir=str(base / "prof"))
            res = run_job(cfg)
            if not res.ok:
                raise RuntimeError(f"the pipeline job failed: {res.failures}")
            p, t = _analyze(base / "prof"), _analyze(base / "trace")
        last = max(t.by_stage)
        row = {"profiler_S_stage": p.by_stage[last], "tracer_S_stage": t.by_stage[last],
               "profiler_S": p.slowdown, "tracer_S": t.slowdown}
        rows.append(row)
        print(f"  [kineto_layout] run {i + 1}/{RUNS}: S_stage {row['profiler_S_stage']:.4f} (profiler) vs "
              f"{row['tracer_S_stage']:.4f} (tracer); S {row['profiler_S']:.4f} vs {row['tracer_S']:.4f}",
              file=sys.stderr, flush=True)
    return rows


def _sim_cases() -> list[dict]:
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.dessim import SimConfig, parse_cause, simulate, to_job, write_kineto
    from laggard.io import load_job

    rows = []
    for pp, cause in SIM_CASES:
        sim = simulate(SimConfig(dp=2, pp=pp, microbatches=8, steps=3), [parse_cause(cause)])
        truth = analyze(to_job(sim), diagnose=False)
        with tempfile.TemporaryDirectory(prefix="laggard-bench-sim-") as d:
            write_kineto(sim, d)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = analyze(load_job(d), diagnose=False)
        err = max(abs(res.by_stage[s] / truth.by_stage[s] - 1) for s in truth.by_stage)
        rows.append({"pp": pp, "cause": cause, "max_stage_err": err, "S": res.slowdown, "truth_S": truth.slowdown})
        print(f"  [kineto_layout] simulator pp {pp} {cause}: worst S_stage error {100 * err:.2f}%, "
              f"S {res.slowdown:.4f} vs {truth.slowdown:.4f}", file=sys.stderr, flush=True)
    return rows


def run() -> list[dict]:
    cpu = _cpu_runs()
    sim = _sim_cases()
    rel = [abs(r["profiler_S_stage"] / r["tracer_S_stage"] - 1) for r in cpu]
    rel_s = [abs(r["profiler_S"] / r["tracer_S"] - 1) for r in cpu]
    sim_err = max(r["max_stage_err"] for r in sim)
    sim_s = max(abs(r["S"] / r["truth_S"] - 1) for r in sim)
    return [
        {"name": "profiler vs tracer, last stage's S_stage (dp2 x pp2 CPU job, worst of runs)", "value": 100 * max(rel),
         "unit": "%", "baseline": "laggard's tracer on the same run (S_stage, median)",
         "baseline_value": statistics.median(r["tracer_S_stage"] for r in cpu), "target": "< 5%",
         "ok": max(rel) < 0.05, "detail": {"runs": cpu, "median_pct": 100 * statistics.median(rel)}},
        {"name": "profiler vs tracer, job slowdown S (worst of runs)", "value": 100 * max(rel_s), "unit": "%",
         "baseline": "laggard's tracer on the same run (S, median)",
         "baseline_value": statistics.median(r["tracer_S"] for r in cpu)},
        {"name": "GPU pipeline profiler traces vs the simulator's op table, worst S_stage error",
         "value": 100 * sim_err,
         "unit": "%", "baseline": "the simulator's own op table (same run)", "target": "< 3%", "ok": sim_err < 0.03,
         "detail": {"cases": sim, "worst_S_error_pct": 100 * sim_s}},
    ]
