"""Tracer overhead: per recorded op (vs a bare loop, same process) and % of step time on the demo job.

Per op: ``with tracer.op("forward-compute", microbatch=m): pass`` against the same loop without it,
interleaved rounds, best of each (the machine is shared and noisy). For scale, the cheapest
possible instrumentation (a context manager reading the clock twice) is measured beside it.

Step time: the quick demo job (2 x 2 gloo ranks on CPU) run untraced and traced, alternately, in
the same processes; each rank times its own steps. The measured difference is noisy on a shared
two-core machine (far noisier than the overhead itself), so the estimate from the op count and the
per-op cost is reported too.
"""

from __future__ import annotations

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


def _step_overhead() -> dict[str, object]:
    from laggard.tracer.launch import JobConfig, run_jobs

    steps, pairs = 12, 4
    with tempfile.TemporaryDirectory() as d:
        cfgs, traced_flags = [], []
        for i in range(pairs):  # U T, T U, U T, T U: neither is always first
            for traced in ((False, True) if i % 2 == 0 else (True, False)):
                cfgs.append(JobConfig.quick(steps=steps, trace_dir=str(Path(d) / f"t{i}") if traced else None))
                traced_flags.append(traced)
        results = run_jobs(cfgs)
        if not all(r.ok for r in results):
            raise RuntimeError(f"demo job failed: {[r.failures for r in results if not r.ok]}")
        from laggard.io import load_job

        ops_per_rank_step = load_job(Path(d) / "t0").num_ops / (4 * steps)

    def steps_of(r) -> list[float]:  # noqa: ANN001
        return [s for rank in r.ranks.values() for s in rank["step_s"]]

    untraced = [s for r, t in zip(results, traced_flags, strict=True) if not t for s in steps_of(r)]
    traced = [s for r, t in zip(results, traced_flags, strict=True) if t for s in steps_of(r)]
    per_pair = [statistics.median(steps_of(results[2 * i + (1 if i % 2 == 0 else 0)]))
                / statistics.median(steps_of(results[2 * i + (0 if i % 2 == 0 else 1)])) - 1 for i in range(pairs)]
    return {
        "untraced_s": statistics.median(untraced),
        "traced_s": statistics.median(traced),
        "overhead_pct": 100 * (statistics.median(traced) / statistics.median(untraced) - 1),
        "pair_overheads_pct": [round(100 * x, 2) for x in per_pair],
        "ops_per_rank_step": ops_per_rank_step,
    }


def run() -> list[dict]:
    print("  per-op overhead ...", file=sys.stderr, flush=True)
    b = _per_op()
    per_op = b["traced"] - b["bare"]
    print("  demo job, untraced vs traced ...", file=sys.stderr, flush=True)
    s = _step_overhead()
    est_pct = 100 * s["ops_per_rank_step"] * per_op * 1e-9 / s["untraced_s"]
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
                        "3-4x a distribution build",
            },
        },
        {
            "name": "tracing overhead on the demo job step (measured)",
            "value": s["overhead_pct"],
            "unit": "%",
            "baseline": "the same job untraced (median step)",
            "baseline_value": 100.0,
            "target": "< 1 %",
            "ok": s["overhead_pct"] < 1.0,
            "detail": {"untraced_step_s": s["untraced_s"], "traced_step_s": s["traced_s"],
                       "pairs_pct": s["pair_overheads_pct"],
                       "note": "2 x 2 ranks on 2 shared cores: step-time noise is several %"},
        },
        {
            "name": "tracing overhead on the demo job step (ops x per-op cost)",
            "value": est_pct,
            "unit": "%",
            "baseline": "the same job untraced (median step)",
            "baseline_value": 100.0,
            "target": "< 1 %",
            "ok": est_pct < 1.0,
            "detail": {"ops_per_rank_step": s["ops_per_rank_step"], "per_op_ns": per_op,
                       "untraced_step_s": s["untraced_s"]},
        },
    ]


if __name__ == "__main__":
    for f in run():
        print(f)
