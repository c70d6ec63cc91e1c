"""The simulated job as laggard's op table (native format) and as PyTorch-profiler JSON per rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from laggard.groundtruth.dessim.engine import SimOps
from laggard.optable.ops import Job, JobMeta


def to_job(sim: SimOps) -> Job:
    """The op table a tracer on every rank would have written (times on each rank's clock)."""
    import pyarrow as pa

    from laggard.optable.ops import make_table

    c = sim.cols
    start = np.array(c["start_s"])
    t0 = float(start.min()) if len(start) else 0.0
    start_ns = np.round((start - t0) * 1e9).astype(np.int64)
    dur_ns = np.maximum(np.round((np.array(c["end_s"]) - start) * 1e9).astype(np.int64), 0)
    cols: dict[str, Any] = {k: np.asarray(c[k]) for k in ("rank", "dp_rank", "pp_rank", "vchunk", "step", "microbatch",
                                                          "seq", "peer")}
    cols.update(name=c["name"], kind=c["kind"], stream=c["stream"], start_ns=start_ns, dur_ns=dur_ns, group=c["group"],
                num_tokens=pa.array(c["num_tokens"], type=pa.int64()),
                seq_lens=pa.array(sim.seq_lens, type=pa.list_(pa.int32())),
                deps=pa.array(c["deps"], type=pa.list_(pa.int64())))
    table = make_table(cols, num_rows=len(start))
    cfg = sim.cfg
    meta = JobMeta(name=cfg.name, world_size=cfg.num_ranks, dp_size=cfg.dp, pp_size=cfg.pp, tp_size=1, vpp_size=cfg.vpp,
                   source="dessim", extra={"microbatches": cfg.microbatches, "seed": cfg.seed,
                                           "causes": [x.spec() for x in sim.causes]})
    return Job(table=table, meta=meta)


_NCCL_NAME = {"collective": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "p2p_send": "ncclDevKernel_SendRecv",
              "p2p_recv": "ncclDevKernel_SendRecv"}
_COLL_NAME = {"params-all-gather": "_allgather_base", "grads-reduce-scatter": "_reduce_scatter_base",
              "embedding-grads-all-reduce": "allreduce", "optimizer-clip-main-grad": "allreduce"}
_STREAM_TID = {"compute": 7, "p2p-send": 20, "p2p-recv": 21, "dp-comm": 24}
# compute kernels as a profiler shows them: the kernel's name says nothing of the phase, the CPU op
# that launched it does (forward on the main thread, backward on autograd's thread, the optimizer step)
_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
_LAUNCHER = {"forward-compute": ("cpu_op", "aten::linear", 1),
             "backward-compute": ("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 2),
             "optimizer": ("user_annotation", "Optimizer.step#FusedAdam.step", 1)}


def write_kineto(sim: SimOps, out_dir: str | Path) -> list[Path]:
    """One ``rank<N>.json`` per rank in the PyTorch profiler's trace format: ``ProfilerStep#N``
    spans, a ``cudaLaunchKernel`` per GPU op linked by correlation id, GPU kernels per stream, and
    NCCL kernels carrying their process group, sequence number and (p2p) source/destination."""
    import orjson

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    c, cfg = sim.cols, sim.cfg
    rank = np.asarray(c["rank"])
    start_us = np.array(c["start_s"]) * 1e6
    end_us = np.array(c["end_s"]) * 1e6
    step = np.asarray(c["step"])
    groups = sorted({g for g in c["group"] if g is not None and not g.startswith("p2p:")})
    pg_ranks = {g: _group_ranks(g, cfg.dp, cfg.pp) for g in groups}
    pg_config = [{"pg_name": g, "pg_desc": g, "backend_config": "cuda:nccl", "ranks": pg_ranks[g]} for g in groups]
    paths = []
    for r in range(cfg.num_ranks):
        rows = np.flatnonzero(rank == r)
        ev: list[dict[str, Any]] = []
        corr = 0
        for s in range(cfg.steps):
            in_step = rows[step[rows] == s]
            if not len(in_step):
                continue
            lo = float(start_us[in_step].min()) - 50.0
            hi = float(end_us[in_step].max()) + 5.0
            ev.append({"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                       "ts": lo, "dur": hi - lo})
            for i in in_step.tolist():
                corr += 1
                kind, name = c["kind"][i], c["name"][i]
                # the launch sits at the op's start on a host thread (inside its step window)
                tid = 1
                if kind == "compute":
                    cat, op, tid = _LAUNCHER.get(name, ("cpu_op", "aten::mm", 1))
                    ev.append({"ph": "X", "cat": cat, "name": op, "pid": 1, "tid": tid, "ts": float(start_us[i]) - 3.0,
                               "dur": 2.5})
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                           "ts": float(start_us[i]) - 2.0, "dur": 1.0, "args": {"correlation": corr}})
                args: dict[str, Any] = {"correlation": corr, "stream": _STREAM_TID[c["stream"][i]], "device": 0}
                if kind == "compute":
                    kname = _KERNEL
                else:
                    kname = _NCCL_NAME[kind]
                    g = c["group"][i]
                    args["Seq"] = int(c["seq"][i])
                    if kind == "collective":
                        args.update({"Collective name": _COLL_NAME[name], "Process Group Name": g,
                                     "Process Group Ranks": pg_ranks[g], "Group size": len(pg_ranks[g]),
                                     "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "BFloat16"})
                    else:
                        src, dst = (r, int(c["peer"][i])) if kind == "p2p_send" else (int(c["peer"][i]), r)
                        args.update({"Collective name": "send" if kind == "p2p_send" else "recv",
                                     "Process Group Name": f"p2p:{src}>{dst}", "Src Rank": src, "Dst Rank": dst,
                                     "In msg nelems": 1 << 18, "dtype": "BFloat16"})
                ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": _STREAM_TID[c["stream"][i]],
                           "ts": float(start_us[i]), "dur": float(end_us[i] - start_us[i]), "args": args})
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": cfg.num_ranks,
                                                       "pg_count": len(pg_config), "pg_config": pg_config},
               "deviceProperties": [{"id": 0, "name": "simulated GPU"}], "baseTimeNanoseconds": 0,
               "host_name": f"sim-node{r}", "traceEvents": ev}
        p = out / f"rank{r}.json"
        p.write_bytes(orjson.dumps(doc))
        paths.append(p)
    return paths


def _group_ranks(group: str, dp: int, pp: int) -> list[int]:
    if group == "world":
        return list(range(dp * pp))
    if group.startswith("dp:pp"):
        s = int(group[5:].split(":")[0])
        return [d * pp + s for d in range(dp)]
    if group.startswith("emb:dp"):
        d = int(group[6:])
        return [d * pp, d * pp + pp - 1]
    raise AssertionError(group)
