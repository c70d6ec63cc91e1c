"""A real torch.profiler trace of attention passes over sequences of known lengths (one CPU process).

Each step runs four microbatches (gradient accumulation), each a batch of ``BATCH`` sequences of
one length from ``LENGTHS``, through a causal ``scaled_dot_product_attention``, forward then
backward, and writes ``rank0.json``. Two untraced warm-up steps run first (the schedule's wait and
warm-up), with the first step's lengths. ``make_traces`` runs it twice, with and without recorded
shapes (``OUT/shapes``, ``OUT/no-shapes``), in one interpreter.

    python tests/kineto_attention.py OUT_DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

BATCH = 3
LENGTHS = [[16, 40, 24, 56], [48, 8, 32, 64], [24, 24, 72, 16]]  # per traced step, per microbatch


def make_trace(out: str | Path, *, record_shapes: bool = True) -> Path:
    import torch
    import torch.nn.functional as F

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    heads, dim = 2, 16
    qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)
    opt = torch.optim.SGD(qkv.parameters(), lr=0.01)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=len(LENGTHS), repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=record_shapes,
                                schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(out / "rank0.json"))) as prof:
        for lengths in [LENGTHS[0], LENGTHS[0], *LENGTHS]:
            for n in lengths:
                x = torch.randn(BATCH, n, heads * dim)
                q, k, v = qkv(x).view(BATCH, n, 3, heads, dim).permute(2, 0, 3, 1, 4)
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return out


def make_traces(out: str | Path) -> Path:
    out = Path(out)
    make_trace(out / "shapes")
    make_trace(out / "no-shapes", record_shapes=False)
    return out


def make_traces_in_subprocess(out: str | Path, *, timeout_s: float = 180) -> Path:
    """``make_traces`` in a fresh interpreter (the test process keeps no torch state)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, __file__, str(out)], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the traced attention job failed: {proc.stderr[-2000:]}")
    return Path(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    make_traces(ap.parse_args().out)
