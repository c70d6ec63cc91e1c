"""Tracer overhead: per recorded op (vs a bare loop, same process) and % of step time on the demo job.

Per op: ``with tracer.op("forward-compute", microbatch=m): pass`` against the same loop without it,
interleaved rounds, best of each (the machine is shared and noisy). For scale, the cheapest
possible instrumentation (a context manager reading the clock twice) is measured beside it, and so
is op()'s Python path where the compiled one (laggard/tracer/_fastop.c) is built.

Per op with streaming on: the same ops in steps of 100, every page written as a Parquet shard and
streamed to a real collector (``laggard monitor serve`` on 127.0.0.1, another process), from the
first op to ``close()`` (pages handed off, written, posted). CPU time, interleaved with a bare loop
of the same shape, median of the rounds: the training thread's (what each op adds to a step) and the
whole process's (with the writer's Parquet and the stream's encoding and HTTP, on other cores). Wall
time is not reported: close() waits for the collector, another process on the same shared cores.

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
STREAM_OPS = int(os.environ.get("LAGGARD_BENCH_TRACER_STREAM_OPS", 100_000))
STREAM_ROUNDS = int(os.environ.get("LAGGARD_BENCH_TRACER_STREAM_ROUNDS", 5))
OPS_PER_STEP = 100
TOKEN = "test-token-0123456789abcdef"  # tests/monitor_helpers.TOKEN: its Server helper sends it


def _per_op(*, pure_python: bool = False) -> dict[str, float]:
    """Best per-op times of the loops below; ``pure_python``: with op()'s Python path (the one taken
    where the compiled fast path, laggard/tracer/_fastop.c, was not built)."""
    from laggard.tracer import Tracer
    from laggard.tracer.core import PURE_PYTHON_ENV

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
        before = os.environ.get(PURE_PYTHON_ENV)
        os.environ[PURE_PYTHON_ENV] = "1" if pure_python else ""
        try:
            t = Tracer(Path(d) / "trace", record_gc=False, page_ops=N_OPS * ROUNDS * 2 + 16)
        finally:
            if before is None:
                del os.environ[PURE_PYTHON_ENV]
            else:
                os.environ[PURE_PYTHON_ENV] = before
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


def tracer_cost(url: str | None, out_dir: Path, n_ops: int, *, job: str = "tracercost") -> dict[str, float]:
    """One traced loop (steps of OPS_PER_STEP ops) streaming to ``url`` (None: shards only), first op to
    ``close()``: CPU ns per op of the training thread and of the process, and wall ns per op."""
    from laggard.tracer import Tracer

    tr = Tracer(out_dir, monitor_url=url, token=TOKEN, monitor_job=job, handle_signals=False, record_gc=False,
                num_pages=64)  # room for every op: none dropped
    step, op = tr.step, tr.op
    w0, c0, t0 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
    for s in range(n_ops // OPS_PER_STEP):
        with step(s):
            for j in range(OPS_PER_STEP):
                with op("forward-compute", microbatch=j):
                    pass
    tr.close()
    t1, c1, w1 = time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns()
    if tr.num_ops_dropped:
        raise RuntimeError(f"the tracer dropped {tr.num_ops_dropped} ops")
    if url is not None and not tr._stream.num_sent:  # noqa: SLF001
        raise RuntimeError("nothing reached the collector")
    return {"thread_ns": (t1 - t0) / n_ops, "process_ns": (c1 - c0) / n_ops, "wall_ns": (w1 - w0) / n_ops}


def _bare_cost(n_ops: int) -> dict[str, float]:
    """The same loop shape without the tracer (the baseline, per iteration)."""
    w0, c0, t0 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
    for _s in range(n_ops // OPS_PER_STEP):
        for _j in range(OPS_PER_STEP):
            pass
    t1, c1, w1 = time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns()
    return {"thread_ns": (t1 - t0) / n_ops, "process_ns": (c1 - c0) / n_ops, "wall_ns": (w1 - w0) / n_ops}


def _streaming() -> dict[str, float]:
    """Streaming on: bare and traced rounds interleaved (a fresh tracer and job each), medians."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.monitor_helpers import Server  # noqa: PLC0415 (the collector process the tests use)

    with tempfile.TemporaryDirectory() as d:
        srv = Server(str(Path(d) / "collector.db"), Path(d), token=TOKEN).start()
        try:
            tracer_cost(srv.url, Path(d) / "warm", 2 * OPS_PER_STEP, job="warm")  # first-use imports, connection
            bare, on = [], []
            for r in range(STREAM_ROUNDS):
                bare.append(_bare_cost(STREAM_OPS))
                on.append(tracer_cost(srv.url, Path(d) / f"r{r}", STREAM_OPS, job=f"r{r}"))
        finally:
            srv.stop()
    med = {f"{k}_{key}": statistics.median(x[key] for x in runs) for k, runs in (("bare", bare), ("on", on))
           for key in ("thread_ns", "process_ns", "wall_ns")}
    return {**med, "thread_ns": med["on_thread_ns"] - med["bare_thread_ns"],
            "process_ns": med["on_process_ns"] - med["bare_process_ns"]}


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

    steps = int(os.environ.get("LAGGARD_BENCH_TRACER_STEPS", 160))
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
    from laggard.tracer.core import compiled_op_path

    b = _per_op()
    per_op = b["traced"] - b["bare"]
    path = "compiled (laggard/tracer/_fastop.c)" if compiled_op_path() else "Python (the compiled path is not built)"
    py = _per_op(pure_python=True) if compiled_op_path() else b
    print("  per-op cost with streaming on (a collector on 127.0.0.1) ...", file=sys.stderr, flush=True)
    st = _streaming()
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
                "op_path": path,
                "python_path_per_op_ns": py["traced"] - py["bare"],
                "minimal_context_manager_with_two_clock_reads_ns": b["reference"] - b["bare"],
                "p2p_op_ns": b["comm"] - b["bare"],
                "note": "this interpreter is built without PGO/LTO: creating an empty object takes ~250 ns, "
                        "3-4x a distribution build; the machine is shared, figures vary by 2x between runs",
            },
        },
        {
            "name": "tracer per-op cost with streaming on (training thread CPU)",
            "value": st["thread_ns"],
            "unit": "ns",
            "baseline": "bare loop iteration, same shape, same run (CPU)",
            "baseline_value": st["bare_thread_ns"],
            "target": "< 1000 ns",
            "ok": st["thread_ns"] < 1000,
            "detail": {
                "op_path": path,
                "process_cpu_per_op_ns": st["process_ns"],
                "traced_thread_cpu_per_op_ns": st["on_thread_ns"],
                "ops_per_round": STREAM_OPS, "ops_per_step": OPS_PER_STEP, "rounds": STREAM_ROUNDS,
                "note": "first op to close(): steps, page hand-offs and the final flush included; process CPU adds "
                        "the writer thread (page to Arrow, Parquet zstd) and the stream thread (Arrow IPC, HTTP "
                        "posts), which run beside training on other cores; the collector is another process",
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
                       "note": "2 x 2 ranks on 2 shared cores: the median of ~320 pairs (~80 until 2026-11-29, "
                               "which moved by ~2 % run to run)"},
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
                       "wall_step_s": s["wall_step_s"],
                       "of_cpu_time_pct": est_pct * s["wall_step_s"] / s["cpu_step_s"]},
        },
    ]


if __name__ == "__main__":
    for f in run():
        print(f)
