"""The tracer's CUDA path on a real GPU, checked against CUPTI; and what only a GPU machine can run.

    python benchmarks/gpu_check.py OUT [PART ...]     # parts: timing overhead job nccl act actbench autotrace
                                                      # (default: all)
    python benchmarks/gpu_check.py --record DEVICE LABEL=gpu_check.json ...   # -> benchmarks/results_gpu.json

Run on a machine with a CUDA GPU (the lent device machine). Each part prints one result line
and writes OUT/gpu_check.json; no part reads laggard's analysis to decide what is right:

* **timing**: one process times a chain of matrix products per op with ``Tracer(timing="cuda")``
  while ``torch.profiler`` (CUPTI) records the same ops as ``record_function`` ranges. Ground
  truth is CUPTI's GPU-side range of each op (``gpu_user_annotation``) and the sum of its
  kernels; the check is the tracer's ``dur_ns`` against them, per op.
* **overhead**: host time per traced op on the CUDA path (two events per op, resolved at step
  ends) against the same loop untraced, in the same run.
* **job**: a real 2-process job on the one GPU (gloo carries the gradients through host copies:
  NCCL refuses two ranks on one device), rank 1 doing 1.5x the matrix work; traced with the
  Tracer (CUDA events) and torch.profiler (GPU kineto traces); ``laggard analyze --json`` runs
  on both from the CLI. Ground truth: the injected rank.
* **nccl**: a 1-rank NCCL job with the Flight Recorder on; the tracer's dump read by
  ``laggard hang --json`` (real NCCL records: CUDA-event durations, states).
* **autotrace**: ``laggard run`` (zero-code capture, CUDA events) of a 2-rank DDP script on the one
  GPU that never imports laggard, rank 1 doing 1.5x the work; step time against torchrun untraced,
  alternated. Ground truth: the injected rank.
* **act**: ``laggard demo --act --dp 4 --pp 1 --inject slow-worker:rank=2,factor=1.6`` on this
  machine's cores (one core per rank, as a GPU job has), and the step times before/after the
  controller's first action from OUT/act/actions.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CLI = [sys.executable, "-m", "laggard.cli.base"]
STEPS = 30
OPS = (("forward-compute", 3), ("backward-compute", 6), ("optimizer", 1))  # name, matmuls per op
N = 2048  # matrix side: ~0.02-0.1 ms per product on a Hopper GPU in fp32
# a dry run of the script's own logic on a machine without a GPU: GPU_CHECK_DEVICE=cpu (CPU ranges
# stand in for CUPTI's, host clocks for events; proves nothing about the CUDA path)
DRY = os.environ.get("GPU_CHECK_DEVICE") == "cpu"
if DRY:
    N = 256
TIMING = "cpu" if DRY else "cuda"


def _dev() -> Any:
    import torch

    return torch.device("cpu") if DRY else torch.device("cuda", 0)


def _sync() -> None:
    import torch

    if not DRY:
        torch.cuda.synchronize()


def _chain(x: Any, w: Any, k: int) -> Any:
    for _ in range(k):
        x = (x @ w).tanh_()
    return x


def part_timing(out: Path) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from laggard.io import load_job
    from laggard.tracer import Tracer

    dev = _dev()
    x = torch.randn(N, N, device=dev) / N ** 0.5
    w = torch.randn(N, N, device=dev) / N ** 0.5
    _chain(x, w, 4)
    _sync()
    trace = out / "timing" / "trace"
    with Tracer(trace, name="gpu-timing", timing=TIMING, rank=0, world_size=1) as t, \
            profile(activities=[ProfilerActivity.CPU] + ([] if DRY else [ProfilerActivity.CUDA])) as prof:
        for step in range(STEPS):
            with t.step(step):
                for name, k in OPS:
                    kk = k * (1 + step % 3)  # op lengths vary from step to step
                    with record_function(f"chk/{step}/{name}"), t.op(name):
                        _chain(x, w, kk)
        _sync()
    kin = out / "timing" / "kineto.json"
    prof.export_chrome_trace(str(kin))
    ann, kern = _cupti_ranges(json.loads(kin.read_text()))
    job = load_job(trace)
    tab = job.table.to_pydict()
    rows = []
    for step, name, dur in zip(tab["step"], tab["name"], tab["dur_ns"], strict=True):
        key = f"chk/{step}/{name}"
        if key in ann:
            rows.append((dur / 1e3, ann[key], kern.get(key, float("nan"))))
    a = np.array(rows)
    err_ann = np.abs(a[:, 0] - a[:, 1])
    rel = err_ann / a[:, 1]
    res = {"ops_compared": len(rows), "ops_expected": STEPS * len(OPS),
           "op_us_median": float(np.median(a[:, 1])),
           "abs_err_us_median": float(np.median(err_ann)), "abs_err_us_p99": float(np.quantile(err_ann, 0.99)),
           "rel_err_median": float(np.median(rel)), "rel_err_max": float(rel.max()),
           "tracer_minus_kernel_sum_us_median": float(np.nanmedian(a[:, 0] - a[:, 2])),
           }
    res["ok"] = res["ops_compared"] == res["ops_expected"] and res["rel_err_median"] < 0.02
    return res


def _cupti_ranges(doc: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """CUPTI's GPU-side range of each ``chk/...`` annotation (us) and the summed kernel time in it."""
    ev = doc.get("traceEvents", [])
    ann: dict[str, tuple[float, float]] = {}
    for e in ev:
        if (e.get("cat") == ("user_annotation" if DRY else "gpu_user_annotation")
                and str(e.get("name", "")).startswith("chk/")):
            ts, d = float(e["ts"]), float(e["dur"])
            lo, hi = ann.get(e["name"], (ts, ts + d))
            ann[e["name"]] = (min(lo, ts), max(hi, ts + d))
    kern = [(float(e["ts"]), float(e["dur"])) for e in ev if e.get("cat") == "kernel"]
    kern.sort()
    starts = np.array([k[0] for k in kern])
    ksum: dict[str, float] = {}
    for name, (lo, hi) in ann.items():
        i, j = np.searchsorted(starts, lo - 0.5), np.searchsorted(starts, hi + 0.5)
        ksum[name] = float(sum(d for _, d in kern[i:j]))
    return {k: hi - lo for k, (lo, hi) in ann.items()}, ksum


def part_overhead(out: Path) -> dict[str, Any]:
    import torch

    from laggard.tracer import Tracer

    y = torch.zeros(256, device=_dev())
    n_steps, per_step = 200, 100

    def loop(t: Any) -> float:
        _sync()
        t0 = time.perf_counter_ns()
        for s in range(n_steps):
            with t.step(s):
                for _ in range(per_step):
                    with t.op("tiny"):
                        y.add_(1.0)
        _sync()
        return (time.perf_counter_ns() - t0) / (n_steps * per_step)

    class Bare:
        def step(self, s: int) -> Any:
            return _Null()

        def op(self, name: str) -> Any:
            return _Null()

    bare, traced = [], []
    for i in range(5):  # alternated: the machine's state drifts
        bare.append(loop(Bare()))
        with Tracer(out / "overhead" / f"trace{i}", name="gpu-overhead", timing=TIMING, rank=0,
                    world_size=1) as t:
            traced.append(loop(t))
    res = {"bare_ns_per_op": float(np.median(bare)), "traced_ns_per_op": float(np.median(traced)),
           "added_us_per_op": float((np.median(traced) - np.median(bare)) / 1e3)}
    if not DRY:
        res.update(_cuda_breakdown(out, loop, y))
    res["ok"] = True  # measured, reported; the CPU target of issue 27 is on the CPU path
    return res


def _cuda_breakdown(out: Path, loop: Any, y: Any) -> dict[str, float]:
    """Where a traced op's host time goes: the CUDA calls one op makes, and the tracer's step boundary
    (a new anchor) and resolution (``query`` + two ``elapsed_time`` per op), timed inside a traced loop."""
    import torch

    from laggard.tracer import Tracer

    n = 20_000
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(2 * n)]
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for e in evs:
        e.record()
    t1 = time.perf_counter_ns()
    torch.cuda.synchronize()
    for e in evs[:n]:
        e.query()
    t2 = time.perf_counter_ns()
    for a, b in zip(evs[:n], evs[n:], strict=True):
        a.elapsed_time(b)
    t3 = time.perf_counter_ns()
    for _ in range(n):
        y.add_(1.0)
    t4 = time.perf_counter_ns()
    torch.cuda.synchronize()
    spent = {"boundary": 0, "resolve": 0, "steps": 0}
    with Tracer(out / "overhead" / "trace-breakdown", name="gpu-overhead", timing="cuda", rank=0,
                world_size=1) as t:
        cuda, resolve = t._cuda, t._resolve_cuda  # noqa: SLF001 - timing the tracer's own parts

        def boundary() -> None:
            c0 = time.perf_counter_ns()
            type(cuda).step_boundary(cuda)
            spent["boundary"] += time.perf_counter_ns() - c0
            spent["steps"] += 1

        def timed_resolve() -> None:
            c0 = time.perf_counter_ns()
            resolve()
            spent["resolve"] += time.perf_counter_ns() - c0

        cuda.step_boundary, t._resolve_cuda = boundary, timed_resolve
        per_op = loop(t)
    steps = max(spent["steps"], 1)
    return {"event_record_us": (t1 - t0) / 2e3 / n, "event_query_us": (t2 - t1) / 1e3 / n,
            "event_elapsed_time_us": (t3 - t2) / 1e3 / n, "kernel_launch_us": (t4 - t3) / 1e3 / n,
            "breakdown_traced_us_per_op": per_op / 1e3,
            "step_boundary_us_per_step": spent["boundary"] / 1e3 / steps,
            "resolve_us_per_step": spent["resolve"] / 1e3 / steps,
            "anchors": cuda.num_anchors, "stale_steps": cuda.num_stale_steps,
            "max_anchor_error_us": cuda.max_anchor_error_ns / 1e3}


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _job_rank(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    from laggard.tracer import Tracer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dev = _dev()
    g = torch.Generator(device=dev).manual_seed(rank)
    x = torch.randn(N, N, device=dev, generator=g) / N ** 0.5
    w = torch.randn(N, N, device=dev, generator=g) / N ** 0.5
    grad = torch.zeros(1 << 20, device=dev)
    extra = 1.5 if rank == 1 else 1.0  # the injected slow worker: 1.5x the matrix work
    _chain(x, w, 4)
    _sync()
    sched = schedule(wait=0, warmup=2, active=8, repeat=1)
    kdir = Path(out) / "job" / "kineto"
    kdir.mkdir(parents=True, exist_ok=True)

    def on_ready(p: Any) -> None:
        p.export_chrome_trace(str(kdir / f"rank{rank}.json"))

    with Tracer(Path(out) / "job" / "trace", name="gpu-job", timing=TIMING) as t, \
            profile(activities=[ProfilerActivity.CPU] + ([] if DRY else [ProfilerActivity.CUDA]), schedule=sched,
                    on_trace_ready=on_ready) as prof:
        for step in range(STEPS):
            with t.step(step):
                for name, k in OPS[:2]:
                    with t.op(name):
                        _chain(x, w, round(k * 4 * extra))
                with t.collective("grads-all-reduce", size_bytes=grad.numel() * 4):
                    host = grad.cpu()  # waits for the GPU: the collective starts when compute is done
                    dist.all_reduce(host)
                    grad.copy_(host, non_blocking=False)
                with t.op("optimizer"):
                    _chain(x, w, 1)
            prof.step()
    dist.destroy_process_group()


def part_job(out: Path) -> dict[str, Any]:
    import socket

    import torch.multiprocessing as mp

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(_job_rank, args=(2, port, str(out)), nprocs=2, join=True)
    res: dict[str, Any] = {}
    for label, path in (("tracer", out / "job" / "trace"), ("profiler", out / "job" / "kineto")):
        p = subprocess.run([*CLI, "analyze", str(path), "--json", "-"], capture_output=True, text=True, timeout=300)
        (out / "job" / f"analyze-{label}.json").write_text(p.stdout)
        (out / "job" / f"analyze-{label}.err").write_text(p.stderr)
        if p.returncode != 0:
            res[label] = {"rc": p.returncode, "stderr": p.stderr.strip().splitlines()[-1:]}
            continue
        doc = json.loads(p.stdout)
        res[label] = _summary(doc)
    res["ok"] = all(1 in (res.get(k, {}).get("worker_ranks") or []) for k in ("tracer",))
    return res


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Verdict, S and the named (cause, ranks) of an analyze --json document."""
    finds = doc.get("findings") or []
    named = [(f.get("cause"), sorted(w["rank"] for w in f.get("workers") or []), f.get("consistency"))
             for f in finds]
    workers = sorted({r for c, rs, _ in named if c == "worker" for r in rs})
    return {"verdict": doc.get("verdict"), "S": doc.get("slowdown"), "findings": named[:6], "worker_ranks": workers,
            "timing": (doc.get("meta") or {}).get("timing"), "replay_fidelity": doc.get("replay_fidelity")}


def part_nccl(out: Path) -> dict[str, Any]:
    import socket

    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "256")
    import torch
    import torch.distributed as dist

    from laggard.tracer import Tracer
    from laggard.tracer.flight import FlightDumper

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    grad = torch.ones(1 << 20, device="cuda")
    trace = out / "nccl" / "trace"
    kin = out / "nccl" / "kineto"
    kin.mkdir(parents=True, exist_ok=True)
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(N, N, device="cuda") / N ** 0.5
    with Tracer(trace, name="gpu-nccl", timing="cuda") as t, \
            profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for step in range(10):
            with t.step(step), torch.profiler.record_function(f"ProfilerStep#{step}"):
                with t.op("forward-compute"):
                    _chain(x, x, 4)
                with t.collective("grads-all-reduce", size_bytes=grad.numel() * 4):
                    dist.all_reduce(grad)
        torch.cuda.synchronize()
        path = FlightDumper(trace, tracer=t, rank=0, world_size=1).dump("gpu-check")
    prof.export_chrome_trace(str(kin / "rank0.json"))
    c10d = torch._C._distributed_c10d  # noqa: SLF001
    import pickle

    counts = {fn: len(pickle.loads(getattr(c10d, fn)()).get("entries", []))  # noqa: S301
              for fn in ("_dump_fr_trace", "_dump_nccl_trace") if hasattr(c10d, fn)}
    dist.destroy_process_group()
    p = subprocess.run([*CLI, "hang", str(trace), "--json", "-"], capture_output=True, text=True, timeout=120)
    (out / "nccl" / "hang.json").write_text(p.stdout + p.stderr)
    res: dict[str, Any] = {"dump": str(path) if path else None, "hang_rc": p.returncode, "recorder_entries": counts}
    try:
        doc = json.loads(p.stdout)
        res.update({"verdict": doc.get("verdict"),
                    "entries_read": {r: v.get("num_entries") for r, v in (doc.get("ranks") or {}).items()}})
    except json.JSONDecodeError:
        res["hang_tail"] = (p.stdout + p.stderr).strip().splitlines()[-2:]
    k = subprocess.run([*CLI, "analyze", str(kin), "--json", "-"], capture_output=True, text=True, timeout=120)
    (out / "nccl" / "analyze-kineto.txt").write_text(k.stdout[-4000:] + k.stderr[-4000:])
    res["kineto_analyze_rc"] = k.returncode
    if k.returncode == 0:
        d = json.loads(k.stdout)
        res["kineto_ops"] = d.get("num_ops")
        res["kineto_by_opkind"] = d.get("by_opkind")
    res["ok"] = path is not None and p.returncode in (0, 1) and any(counts.values())
    return res


def part_act(out: Path) -> dict[str, Any]:
    d = out / "act"
    cmd = [*CLI, "demo", "--act", "--dp", "4", "--pp", "1", "--inject", "slow-worker:rank=2,factor=1.6",
           "--steps", "60", "--out", str(d), "--no-screenshot"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    (out / "act-stdout.txt").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
    res: dict[str, Any] = {"rc": p.returncode, "wall_s": round(time.perf_counter() - t0, 1), "cores": os.cpu_count()}
    try:
        acts = json.loads((d / "actions.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        return {**res, "ok": False, "error": str(e)}
    items = acts if isinstance(acts, list) else acts.get("actions", [])
    res["actions"] = [{k: a.get(k) for k in ("step", "kind", "ranks", "counts", "step_s_before", "step_s_after")}
                      for a in items][:6]
    first = next((a for a in items if a.get("kind") == "rebalance"), None)
    if first and first.get("step_s_before") and first.get("step_s_after"):  # the windows around it
        res["before_over_after"] = first["step_s_before"] / first["step_s_after"]
    m = re.search(r"after the first shift \(step \d+\), steps \d+-\d+ ran x([\d.]+) faster", p.stdout)
    if m:  # the demo's own figure: every step before the shift against every step after it
        res["steps_after_over_before"] = float(m.group(1))
    res["ok"] = p.returncode == 0 and first is not None and first.get("step", 99) < 3 + 30
    return res


def part_actbench(out: Path) -> dict[str, Any]:
    """bench_act's acceptance (dp 4, rank 2 x1.6): 3 without/with pairs, interleaved, one launch."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_act

    d = bench_act._pairs(4, 1.6, bench_act.ACCEPT_SPEC, bench_act.ACCEPT_REPEATS)
    (out / "actbench.json").write_text(json.dumps(d, indent=1, default=str))
    keep = ("first_shift_steps", "in_run_after_before", "recovered", "cpu_critical", "ideal_injected",
            "loss_max_abs_diff", "load_avg_1m_after")
    return {**{k: d[k] for k in keep}, "cores": os.cpu_count(), "ok": d["in_run_after_before"] >= 1.25}


def part_autotrace(out: Path) -> dict[str, Any]:
    """Zero-code capture on the GPU: ``laggard run`` of a DDP script that never imports laggard (rank 1
    does 1.5x the work), against the same script under torchrun, alternated; the analysis of the
    captured trace must name rank 1, its ops CUDA-timed."""
    job = Path(__file__).parent / "gpu" / "autotrace_job.py"
    base = out / "autotrace"
    plain, traced = [], []
    res: dict[str, Any] = {}
    for i in range(1 if DRY else 3):
        for mode in ("plain", "traced"):
            times = base / f"{mode}{i}"
            env = {**os.environ, "STEP_TIMES": str(times)}
            if mode == "plain":
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(job)]
            else:
                cmd = [*CLI, "run", "--nproc-per-node", "2", "--out", str(base / f"trace{i}"), "--no-analyze",
                       str(job)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            if p.returncode != 0:
                return {"ok": False, "mode": mode, "rc": p.returncode, "stderr": p.stderr.strip().splitlines()[-5:]}
            step_ms = max(float((times / f"rank{r}.txt").read_text()) for r in range(2))
            (plain if mode == "plain" else traced).append(step_ms)
    p = subprocess.run([*CLI, "analyze", str(base / "trace0"), "--json", "-"], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        return {"ok": False, "analyze_rc": p.returncode, "stderr": p.stderr.strip().splitlines()[-3:]}
    res.update(_summary(json.loads(p.stdout)))
    res.update(plain_step_ms=float(np.median(plain)), traced_step_ms=float(np.median(traced)),
               overhead_pct=float(100 * (np.median(traced) / np.median(plain) - 1)))
    res["ok"] = 1 in res["worker_ranks"] and (DRY or res["timing"] == "cuda-events")
    return res


PARTS = {"timing": part_timing, "overhead": part_overhead, "job": part_job, "nccl": part_nccl, "act": part_act,
         "actbench": part_actbench, "autotrace": part_autotrace}


def record(device: str, runs: list[str]) -> Path:
    """Write the gpu_check.json files fetched from device runs (``LABEL=PATH`` each, in run order) to
    benchmarks/results_gpu.json: figures a CPU-only machine cannot remeasure, kept apart from
    results.json (which `make bench` rewrites)."""
    out_runs = []
    for run in runs:
        label, _, path = run.partition("=")
        parts = json.loads(Path(path).read_text())
        out_runs.append({"run": label, "parts": {k: {kk: vv for kk, vv in v.items() if kk != "tb"}
                                                 for k, v in parts.items()}})
    out = Path(__file__).parent / "results_gpu.json"
    out.write_text(json.dumps({"device": device, "recorded": time.strftime("%Y-%m-%d"), "runs": out_runs},
                              indent=1, default=str) + "\n")
    return out


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--record":
        print(f"wrote {record(argv[1], argv[2:])}")
        return 0
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    names = argv[1:] or list(PARTS)
    results: dict[str, Any] = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            results[name] = PARTS[name](out)
        except Exception as e:  # noqa: BLE001 - a device check reports every part it can
            import traceback

            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-2000:]}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        (out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str))
        print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'tb'}, default=str)}", flush=True)
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
