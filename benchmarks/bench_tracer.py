"""Tracer overhead: per recorded op (vs a bare loop, same process) and % of step time on the demo job.

Per op: ``with tracer.op("forward-compute", microbatch=m): pass`` against the same loop without it,
interleaved rounds, best of each (the machine is shared and noisy). For scale, the cheapest
possible instrumentation (a context manager reading the clock twice) is measured beside it.

Step time: the quick demo job (2 x 2 gloo ranks on CPU) with every other step traced; each rank
times its own steps and each traced step is compared with the untraced one after it. Still noisy
on a shared two-core machine, so the estimate from the op count and the per-op cost is reported
too.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

N_OPS = 100_000
ROUNDS = 7


def _per_op() -> dict[str, float]:
    from laggard.tracer import Tracer

    pc = time.perf_counter_ns

    class Minimal:
        __slots__ = ("t",)

        def __enter__(self) -> Minimal:
            self.t = pc()
            return self

        def __exit__(self, *exc: object) -> bool:
            pc()
            return False

    def minimal(microbatch: int) -> Minimal:
        return Minimal()

    with tempfile.TemporaryDirectory() as d:
        t = Tracer(Path(d) / "trace", record_gc=False, page_ops=N_OPS * ROUNDS * 2 + 16)
        op, p2p = t.op, t.p2p

        def bare() -> int:
            t0 = pc()
            for _m in range(N_OPS):
                pass
            return pc() - t0

        def traced() -> int:
            t0 = pc()
            for m in range(N_OPS):
                with op("forward-compute", microbatch=m):
                    pass
            return pc() - t0

        def comm() -> int:
            t0 = pc()
            for m in range(N_OPS // 10):
                with p2p("forward-send", peer=1, send=True, size_bytes=1024, microbatch=m):
                    pass
            return (pc() - t0) * 10

        def reference() -> int:
            t0 = pc()
            for m in range(N_OPS):
                with minimal(microbatch=m):
                    pass
            return pc() - t0

        best = {"bare": float("inf"), "traced": float("inf"), "comm": float("inf"), "reference": float("inf")}
        with t.step(0):
            for _ in range(ROUNDS):
                for name, fn in (("bare", bare), ("traced", traced), ("comm", comm), ("reference", reference)):
                    best[name] = min(best[name], fn() / N_OPS)
        t.close()
    return best


def _paired(cfg, res, key: str) -> list[float]:  # noqa: ANN001
    """Each traced step (even) against the untraced step after it, on the same rank."""
    out = []
    for rank in res.ranks.values():
        times = rank[key]  # step warmup_steps + i
        for i in range(len(times) - 1):
            if (cfg.warmup_steps + i) % 2 == 0:
                out.append(times[i] / times[i + 1] - 1)
    return out


def _step_overhead() -> dict[str, object]:
    """Every other step traced (``record_every=2``), compared with the untraced step after it on the
    same rank, on the rank's own CPU time (other processes' load bursts hit wall time far more).
    An A/A run (nothing traced, same pairing) in the same processes gives the noise floor."""
    from laggard.demo.launch import JobConfig, run_jobs

    steps = int(os.environ.get("LAGGARD_BENCH_TRACER_STEPS", 40))
    with tempfile.TemporaryDirectory() as d:
        shape = {"dp": int(os.environ.get("LAGGARD_BENCH_TRACER_DP", 2)), "pp": 2}
        control = JobConfig.quick(steps=steps, trace_dir=None, **shape)
        cfg = JobConfig.quick(steps=steps, trace_dir=str(Path(d) / "t"), record_every=2, **shape)
        res_aa, res = run_jobs([control, cfg])
        if not (res.ok and res_aa.ok):
            raise RuntimeError(f"demo job failed: {res.failures or res_aa.failures}")
        from laggard.io import load_job

        ops_per_rank_step = load_job(Path(d) / "t").num_ops / (cfg.world_size * steps / 2)
    ab, aa = _paired(cfg, res, "step_cpu_s"), _paired(control, res_aa, "step_cpu_s")
    ab_wall = _paired(cfg, res, "step_s")
    return {
        "cpu_step_s": statistics.median(x for r in res_aa.ranks.values() for x in r["step_cpu_s"]),
        "wall_step_s": statistics.median(x for r in res_aa.ranks.values() for x in r["step_s"]),
        "ab_pct": 100 * statistics.median(ab),
        "aa_pct": 100 * statistics.median(aa),
        "ab_wall_pct": 100 * statistics.median(ab_wall),
        "num_pairs": len(ab),
        "ab_quartiles_pct": [round(100 * q, 1) for q in statistics.quantiles(ab, n=4)],
        "ops_per_rank_step": ops_per_rank_step,
    }


def run() -> list[dict]:
    print("  per-op overhead ...", file=sys.stderr, flush=True)
    b = _per_op()
    per_op = b["traced"] - b["bare"]
    print("  demo job, untraced vs traced ...", file=sys.stderr, flush=True)
    s = _step_overhead()
    est_pct = 100 * s["ops_per_rank_step"] * per_op * 1e-9 / s["wall_step_s"]
    measured = s["ab_pct"] - s["aa_pct"]
    return [
        {
            "name": "tracer per-op overhead (CPU)",
            "value": per_op,
            "unit": "ns",
            "baseline": "bare loop iteration",
            "baseline_value": b["bare"],
            "target": "< 2000 ns",
            "ok": per_op < 2000,
            "detail": {
                "minimal_context_manager_with_two_clock_reads_ns": b["reference"] - b["bare"],
                "p2p_op_ns": b["comm"] - b["bare"],
                "note": "this interpreter is built without PGO/LTO: creating an empty object takes ~250 ns, "
                        "3-4x a distribution build; the machine is shared, figures vary by 2x between runs",
            },
        },
        {
            "name": "tracing overhead on the demo job step, CPU time (measured, minus A/A control)",
            "value": measured,
            "unit": "%",
            "baseline": "the untraced step after each traced one; A/A: same pairing, nothing traced",
            "baseline_value": s["aa_pct"],
            "target": "< 1 %",
            "ok": measured < 1.0,
            "detail": {"traced_vs_untraced_cpu_pct": s["ab_pct"], "a_a_control_pct": s["aa_pct"],
                       "traced_vs_untraced_wall_pct": s["ab_wall_pct"], "num_pairs": s["num_pairs"],
                       "pair_quartiles_pct": s["ab_quartiles_pct"], "cpu_step_s": s["cpu_step_s"],
                       "note": "2 x 2 ranks on 2 shared cores: the median of ~80 pairs moves by ~2 % run to run"},
        },
        {
            "name": "tracing overhead on the demo job step (ops x per-op cost)",
            "value": est_pct,
            "unit": "%",
            "baseline": "untraced step time",
            "baseline_value": 100.0,
            "target": "< 1 %",
            "ok": est_pct < 1.0,
            "detail": {"ops_per_rank_step": s["ops_per_rank_step"], "per_op_ns": per_op,
                       "wall_step_s": s["wall_step_s"], "of_cpu_time_pct": est_pct * s["wall_step_s"] / s["cpu_step_s"]},
        },
    ]


if __name__ == "__main__":
    for f in run():
        print(f)
