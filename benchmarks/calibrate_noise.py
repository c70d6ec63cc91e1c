"""The noise of real jobs on this machine, measured from Tracer traces, for the simulator sweeps.

    python benchmarks/calibrate_noise.py TRACE_DIR [TRACE_DIR ...] [--json OUT]

Reads the native trace directories (job.json + ops-rank*.parquet) with pyarrow alone: it shares no
code with laggard's analysis, so what it measures does not agree with the analysis by construction.
For each compute op recorded at the same place in every step (rank, op name, microbatch), the log of
its duration over its median across steps is a residual:
- ``jitter``: the robust sigma of the residuals (1.4826 x their median absolute deviation): the
  lognormal sigma the simulator's ``SimConfig.jitter`` stands for;
- ``tail_prob``: the share of ops over 4 sigma above their median (a descheduled process, a cache
  flush: what a lognormal never draws); ``tail_scale`` the smallest of their stretch (duration /
  median - 1) and ``tail_alpha`` its Pareto shape above it (Hill estimator): ``SimConfig.tail_*``;
- ``step_cv``: the step-to-step coefficient of variation of each rank's compute per step (median
  over ranks): the noise a detector of slow workers has to stand above.
Give clean jobs (no injected cause): a slow worker's extra work is not noise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

TAIL_SIGMAS = 4.0  # an op this many robust sigmas above its median is in the tail, not the jitter


def compute_ops(trace: Path) -> dict[str, np.ndarray]:
    """rank, step, name code, microbatch and duration (ns) of every compute op of a Tracer trace."""
    shards = sorted(trace.glob("ops-rank*.parquet")) or sorted(trace.glob("*.parquet"))
    if not shards:
        raise SystemExit(f"{trace}: no ops-rank*.parquet shards")
    t = pq.read_table(shards, columns=["rank", "step", "name", "kind", "microbatch", "dur_ns"])
    t = t.filter(pc.equal(t.column("kind").cast("string"), "compute"))
    names = t.column("name").cast("string").to_numpy(zero_copy_only=False)
    _, code = np.unique(names, return_inverse=True)
    return {"rank": t.column("rank").to_numpy().astype(np.int64), "step": t.column("step").to_numpy().astype(np.int64),
            "name": code.astype(np.int64), "mb": t.column("microbatch").to_numpy().astype(np.int64),
            "dur": t.column("dur_ns").to_numpy().astype(np.float64)}


def residuals(ops: dict[str, np.ndarray]) -> np.ndarray:
    """log(duration / the median duration of the same (rank, name, microbatch) over the steps)."""
    keys = np.stack([ops["rank"], ops["name"], ops["mb"]], axis=1)
    _, group = np.unique(keys, axis=0, return_inverse=True)
    group = group.ravel()
    logd = np.log(np.maximum(ops["dur"], 1.0))
    order = np.lexsort((logd, group))
    g, v = group[order], logd[order]
    bounds = np.flatnonzero(np.diff(g)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(g)]])
    med = np.empty(len(starts))
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        med[i] = np.median(v[a:b])
    counts = ends - starts
    keep = counts[np.searchsorted(starts, np.arange(len(g)), side="right") - 1] >= 3
    r = v - np.repeat(med, counts)
    return r[keep]


def step_cv(ops: dict[str, np.ndarray]) -> float:
    """Median over ranks of the coefficient of variation of the rank's compute per step."""
    cvs = []
    for rank in np.unique(ops["rank"]):
        m = ops["rank"] == rank
        steps, inv = np.unique(ops["step"][m], return_inverse=True)
        per = np.bincount(inv, weights=ops["dur"][m])
        if len(per) >= 3:
            cvs.append(float(np.std(per) / np.mean(per)))
    return float(np.median(cvs)) if cvs else float("nan")


def calibrate(traces: list[Path]) -> dict[str, float]:
    res, cvs, n = [], [], 0
    for trace in traces:
        ops = compute_ops(trace)
        res.append(residuals(ops))
        cvs.append(step_cv(ops))
        n += len(ops["dur"])
    r = np.concatenate(res)
    sigma = float(1.4826 * np.median(np.abs(r - np.median(r))))
    tail = r[r > TAIL_SIGMAS * sigma]
    stretch = np.expm1(tail)
    alpha = float("nan")
    if len(stretch) >= 5:
        lo = np.min(stretch)
        alpha = float(1.0 / np.mean(np.log(stretch / lo))) if np.any(stretch > lo) else float("nan")
    return {"jitter": sigma, "tail_prob": float(len(tail) / max(len(r), 1)), "tail_alpha": alpha,
            "tail_scale": float(np.min(stretch)) if len(stretch) else 0.0,
            "tail_stretch_median": float(np.median(stretch)) if len(stretch) else 0.0,
            "step_cv": float(np.median(cvs)), "num_ops": n, "num_traces": len(traces)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    out = calibrate(a.traces)
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
