"""A small GPT trained for real on CPU processes, data x pipeline parallel, traced by laggard.

`laggard demo` runs it (one spawned process per rank, gloo on 127.0.0.1); you can also run it
yourself:  python examples/demo_job.py --dp 2 --pp 2 --steps 20 --out out/demo-trace

Layout: rank = dp_rank * pp + pp_rank. Pipeline stage s holds a slice of the transformer blocks
(stage 0 also the embeddings, the last stage the LM head and the loss). A step runs the 1F1B
schedule over the microbatches with blocking send/recv between neighbouring stages, all-reduces
the gradients across the data-parallel replicas of each stage, and steps AdamW.

Pure pipelines (--dp 1) and pure data parallelism (--pp 1) are layouts like any other.

Data: byte-level tokens of the Python standard library's own source files (every machine has
them), packed into fixed-length rows, or, with seqlen-imbalance, cut into microbatches of
variable length. Injected stragglers (--inject, see laggard/groundtruth/inject.py) are real effects
(laggard/demo/stragglers.py).

Mitigations (laggard.mitigate), each acting on the effect it fixes:
* planned_gc: PlannedGC on every rank, automatic GC off, all ranks collect at the same step;
* balance_sequences: with seqlen-imbalance, each step's sequences are dealt over the microbatches by
  cost (laggard.mitigate.balance) and packed, attention running per sequence, instead of in order;
* layers_per_stage: an explicit (uneven) split of the transformer blocks over the pipeline stages.
* act: laggard.mitigate.Controller decides at run time (one all_gather every few steps): a slow DP
  rank gets fewer of the global batch's rows (the same rows, split differently; each rank's loss is
  weighted by its share and the gradients summed, so the update is the same), and the collector's
  GC / sequence findings turn on planned GC / balanced packing. Actions go to cfg.actions_path.
"""

from __future__ import annotations

import gc
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from laggard.demo.stragglers import Stragglers
from laggard.tracer import Tracer

VOCAB = 256  # bytes


# ---------------------------------------------------------------- data


def load_corpus(num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes of stdlib source files (sorted, so every rank reads the same) and where each file starts."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    chunks, starts, total = [], [], 0
    for f in files * (1 + num_tokens // 4_000_000):  # repeat the corpus if a long run needs more
        b = np.frombuffer(f.read_bytes(), dtype=np.uint8)
        starts.append(total)
        chunks.append(b)
        total += len(b)
        if total >= num_tokens:
            break
    return np.concatenate(chunks), np.array(starts, dtype=np.int64)


class Batches:
    """Microbatch (step, dp_rank, mb) -> tokens, targets and document lengths, the same on every rank."""

    def __init__(self, cfg, sigma: float | None) -> None:
        self.cfg, self.sigma = cfg, sigma
        self.balanced = bool(getattr(cfg, "balance_sequences", False)) and sigma is not None
        self._plans: dict[int, list[list[tuple[int, int]]]] = {}
        self.counts: list[int] | None = None  # act: rows of the global batch per DP rank (None: even)
        per_step = cfg.dp * cfg.microbatches * cfg.batch_size * (4 * cfg.seq_len + 1)
        self.tokens, self.doc_starts = load_corpus(min(per_step * (cfg.steps + cfg.warmup_steps), 8_000_000))

    def seq_len(self, step: int, dp: int, mb: int) -> int:
        if self.sigma is None:  # packed: every microbatch has the same shape
            return self.cfg.seq_len
        # variable length: lognormal around seq_len (mean preserved), attention cost ~ length^2
        rng = np.random.default_rng([self.cfg.seed, step, dp, mb])
        z = rng.lognormal(-0.5 * self.sigma**2, self.sigma)
        return int(np.clip(round(self.cfg.seq_len * z), 8, 4 * self.cfg.seq_len))

    def plan(self, step: int) -> list[list[tuple[int, int]]]:
        """balance_sequences: the step's dp x M x B sequences (the very ones, lengths and tokens, that
        microbatch order would give: B of length seq_len(step, dp, mb) per microbatch) dealt over the
        dp x M microbatches by Karmarkar-Karp on their cost; the same on every rank. Microbatch
        dp * M + mb gets a list of (corpus start, length)."""
        if step not in self._plans:
            from laggard.mitigate import balance

            cfg = self.cfg
            B, M = cfg.batch_size, cfg.microbatches
            seqs = []
            for d in range(cfg.dp):
                for m in range(M):
                    L = self.seq_len(step, d, m)
                    start = ((step * cfg.dp + d) * M + m) * B * (L + 1)
                    seqs += [(start + r * (L + 1), L) for r in range(B)]
            # cost per sequence per block: attention ~ 2 L^2 d, the linear layers ~ 12 L d^2 (over d)
            plan = balance([L for _, L in seqs], cfg.dp * M, method="kk",
                           cost=lambda n: 2.0 * n * n + 12.0 * cfg.d_model * n)
            bins = [sorted(seqs[i] for i in b) for b in plan.bins]
            if not all(bins):
                raise RuntimeError(f"balance_sequences: an empty microbatch at step {step}")
            self._plans = {step: bins}  # keep only the current step
        return self._plans[step]

    def rows(self, dp: int, mb: int) -> tuple[int, int]:
        """(first row in the step's global batch, rows) of a microbatch; a DP rank's rows (all of them,
        counts[dp], from the ranks before it on) are dealt evenly over its microbatches."""
        M, B = self.cfg.microbatches, self.cfg.batch_size
        if self.counts is None or self.sigma is not None:
            return (dp * M + mb) * B, B
        base, extra = divmod(self.counts[dp], M)
        return sum(self.counts[:dp]) + mb * base + min(mb, extra), base + (mb < extra)

    def shape(self, step: int, dp: int, mb: int) -> tuple[int, int]:
        """(rows, tokens per row) of a microbatch: every rank knows it without being told."""
        if self.balanced:
            return 1, sum(L for _, L in self.plan(step)[dp * self.cfg.microbatches + mb])
        return self.rows(dp, mb)[1], self.seq_len(step, dp, mb)

    def get(self, step: int, dp: int, mb: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        if self.balanced:  # one packed row; seq_lens are the sequences the model attends within
            seqs = self.plan(step)[dp * self.cfg.microbatches + mb]
            rows = [torch.from_numpy(self.tokens[(s + np.arange(L + 1)) % (len(self.tokens) - 1)].astype(np.int64))
                    for s, L in seqs]
            x = torch.cat([r[:-1] for r in rows]).view(1, -1)
            y = torch.cat([r[1:] for r in rows]).view(1, -1)
            return x, y, [L for _, L in seqs]
        (first, B), L = self.rows(dp, mb), self.seq_len(step, dp, mb)
        start = (step * self.cfg.dp * self.cfg.microbatches * self.cfg.batch_size + first) * (L + 1)
        idx = (start + np.arange(B * (L + 1))) % (len(self.tokens) - 1)
        rows = torch.from_numpy(self.tokens[idx].astype(np.int64)).view(B, L + 1)
        # document (file) pieces in each row: what sequence packing hides
        cuts = np.searchsorted(self.doc_starts, idx.reshape(B, L + 1)[:, 0], side="right")
        ends = np.minimum(self.doc_starts[np.minimum(cuts, len(self.doc_starts) - 1)] - idx.reshape(B, L + 1)[:, 0], L)
        seq_lens = [int(x) for e in ends for x in ((e, L - e) if 0 < e < L else (L,))]
        return rows[:, :-1], rows[:, 1:], seq_lens


# ---------------------------------------------------------------- model


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, seq_lens: list[int] | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=2))
        if seq_lens is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # packed sequences (balance_sequences): attention within each, as varlen kernels do
            y = torch.cat([F.scaled_dot_product_attention(a, b, c, is_causal=True) for a, b, c in
                           zip(q.split(seq_lens, dim=2), k.split(seq_lens, dim=2), v.split(seq_lens, dim=2),
                               strict=True)], dim=2)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Stage(nn.Module):
    """The blocks of one pipeline stage; the first also embeds tokens, the last also predicts them."""

    def __init__(self, cfg, stage: int, extra_vocab: int = 0) -> None:
        super().__init__()
        self.first, self.last = stage == 0, stage == cfg.pp - 1
        if getattr(cfg, "layers_per_stage", None):  # an explicit split (e.g. from partition_stages)
            lo = sum(cfg.layers_per_stage[:stage])
            hi = lo + cfg.layers_per_stage[stage]
        else:
            per = cfg.num_layers / cfg.pp
            lo, hi = round(stage * per), round((stage + 1) * per)
        if self.first:
            self.tok, self.pos = nn.Embedding(VOCAB, cfg.d_model), nn.Embedding(4 * cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.num_heads) for _ in range(lo, hi))
        if self.last:
            # heavy-last-stage pads the vocabulary, as the huge vocabularies of real LLMs do
            self.ln_f, self.head = nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, VOCAB + extra_vocab, bias=False)

    def forward(self, x: torch.Tensor, seq_lens: list[int] | None = None) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.shape[1]) if seq_lens is None else torch.cat([torch.arange(n) for n in seq_lens])
            x = self.tok(x) + self.pos(pos)
        for b in self.blocks:
            x = b(x, seq_lens)
        return self.head(self.ln_f(x)) if self.last else x


# ---------------------------------------------------------------- injected stragglers: laggard.demo.stragglers


# ---------------------------------------------------------------- training


def train(rank: int, world_size: int, cfg, report=None) -> dict:
    """One rank's training loop; returns its step times (wall and CPU, s) and last loss."""
    P = cfg.pp
    dp, s = divmod(rank, P)
    last = s == P - 1
    torch.manual_seed(cfg.seed + s)  # replicas of a stage start identical
    inj = Stragglers(cfg.injections, rank, cfg)
    data = Batches(cfg, inj.sigma)
    model = Stage(cfg, s, inj.extra_vocab(cfg.d_model) if last else 0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    # one gradient all-reduce group per stage: the DP replicas of that stage (every rank creates all)
    groups = [dist.new_group([d * P + st for d in range(cfg.dp)]) for st in range(P)]
    inj.prepare_gc()
    planned = None
    if getattr(cfg, "planned_gc", None) is not None:  # mitigation: every rank collects at the same step
        from laggard.mitigate import PlannedGC

        adaptive = cfg.planned_gc == "adaptive"
        # the tracer records the planned collections itself (gc.callbacks): no on_collect here
        planned = PlannedGC(interval_steps=None if adaptive else int(cfg.planned_gc), adaptive=adaptive).start()
    try:
        return _train_loop(rank, cfg, report, model, opt, groups[s], data, inj, dp, s, planned)
    finally:
        if planned is not None:
            planned.stop()


def _train_loop(rank, cfg, report, model, opt, dp_group, data, inj, dp, s, planned) -> dict:
    M = cfg.microbatches
    # warm-up steps run untraced (a disabled tracer does nothing): first-call costs are not stragglers
    off = Tracer(None, enabled=False)
    for step in range(cfg.warmup_steps):
        train_step(step, cfg, off, model, opt, dp_group, data, inj, dp, s)
        if planned is not None:
            planned.step()
    if getattr(cfg, "freeze_gc", False) and not inj.gc_prob:  # (gc-pauses froze them before building its heap)
        gc.collect()
        gc.freeze()
    # the tracer aligns the ranks' clocks and gathers their layout: every rank creates it
    tracer = Tracer(cfg.trace_dir, name="demo-gpt", dp_rank=dp, pp_rank=s, flush_interval_s=cfg.flush_interval_s,
                    meta_extra={"injections": [i.to_json() for i in cfg.injections], "microbatches": M,
                                **_mitigation_meta(cfg)},
                    enabled=cfg.trace_dir is not None, record_every=cfg.record_every,
                    monitor_url=cfg.monitor_url, token=cfg.monitor_token, monitor_job=cfg.monitor_job)
    step_s, cpu_s, compute_s, loss_value, losses = [], [], [], None, []
    prof = _profiler(cfg, rank)
    ctl = _controller(cfg, dp, data)  # None unless cfg.act
    with tracer, prof:  # closes (flushes) the trace however the loop ends
        for step in range(cfg.warmup_steps, cfg.warmup_steps + cfg.steps):
            t0, c0 = time.perf_counter(), time.thread_time()
            inj.compute_s = 0.0
            with tracer.step(step):
                loss_value = train_step(step, cfg, tracer, model, opt, dp_group, data, inj, dp, s)
                if planned is not None:
                    planned.step()  # inside the step: the tracer puts the collection in it
            if cfg.profiler_dir is not None:
                prof.step()  # ends ProfilerStep#N: the profiler's step annotation
            step_s.append(time.perf_counter() - t0)
            cpu_s.append(time.thread_time() - c0)  # this thread's CPU time: what tracing would add to
            compute_s.append(inj.compute_s)  # its forward and backward passes' CPU time, burn included
            if ctl is not None:  # the decision is the same on every rank; it applies from the next step
                planned = _act(ctl, step - cfg.warmup_steps, step_s[-1], inj, data, planned)
            losses.append(loss_value)
            if report is not None:
                report(step - cfg.warmup_steps, loss_value)
    out = {"rank": rank, "step_s": step_s, "step_cpu_s": cpu_s, "compute_cpu_s": compute_s, "loss": loss_value,
           "num_blocks": len(model.blocks), "losses": losses}
    if ctl is not None:
        ctl.close()
        out["actions"] = [a.to_json() for a in ctl.actions]
        out["counts"] = list(ctl.counts)
    if planned is not None:
        out["planned_gc"] = planned.summary()
    return out


def _controller(cfg, dp: int, data: Batches):
    """act: the runtime controller (packed rows are shifted between DP ranks; with variable-length
    sequences it only acts on the collector's findings)."""
    if not getattr(cfg, "act", False):
        return None
    from laggard.mitigate import ActConfig, Controller

    act_cfg = ActConfig(**{"rebalance": data.sigma is None, **(getattr(cfg, "act_config", None) or {})})
    return Controller(global_batch=cfg.dp * cfg.microbatches * cfg.batch_size, dp_rank=dp, dp_size=cfg.dp,
                      min_samples=cfg.microbatches, config=act_cfg, actions_path=cfg.actions_path,
                      collector_url=cfg.monitor_url, job_id=cfg.monitor_job, token=cfg.monitor_token,
                      webhook_url=cfg.act_webhook)


def _act(ctl, k: int, step_s: float, inj: Stragglers, data: Batches, planned):
    """Feed the controller this step's compute and apply what it decided (rows, GC, packing)."""
    ctl.record(inj.compute_s)
    ctl.step(k, step_s)
    if data.sigma is None:
        data.counts = list(ctl.counts)
    data.balanced = data.balanced or (ctl.balanced_packing and data.sigma is not None)
    if ctl.planned_gc and planned is None:
        from laggard.mitigate import PlannedGC

        planned = PlannedGC(interval_steps=None, adaptive=True).start()
    return planned


def _profiler(cfg, rank: int):
    """--profiler DIR: the traced steps also run under torch.profiler (CPU activity, shapes recorded,
    as a user profiling a gloo job would), written to DIR/rank{R}.json; else a no-op context."""
    import contextlib

    if cfg.profiler_dir is None:
        return contextlib.nullcontext()
    out = Path(cfg.profiler_dir)
    out.mkdir(parents=True, exist_ok=True)

    def save(prof) -> None:
        prof.export_chrome_trace(str(out / f"rank{rank}.json"))

    # a schedule makes the profiler annotate each step (ProfilerStep#N); no warm-up of its own:
    # the job's warm-up steps ran before it started
    schedule = torch.profiler.schedule(wait=0, warmup=0, active=cfg.steps, repeat=1)
    gc_info = {}
    if cfg.profiler_gc:  # each collection as a "Python GC" event (needs the stacks)
        gc_info = {"with_stack": True,
                   "experimental_config": torch.profiler._ExperimentalConfig(record_python_gc_info=True)}
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                  schedule=schedule, on_trace_ready=save, **gc_info)


def _mitigation_meta(cfg) -> dict:
    """What the trace says about the model split and the mitigations that were on."""
    P, n = cfg.pp, cfg.num_layers
    split = getattr(cfg, "layers_per_stage", None) or [round((s + 1) * n / P) - round(s * n / P) for s in range(P)]
    return {"num_layers": n, "layers_per_stage": list(split), "planned_gc": getattr(cfg, "planned_gc", None),
            "balance_sequences": bool(getattr(cfg, "balance_sequences", False)),
            "freeze_gc": bool(getattr(cfg, "freeze_gc", False))}


def train_step(step, cfg, tracer, model, opt, dp_group, data, inj, dp, s) -> float | None:
    P, M, d = cfg.pp, cfg.microbatches, cfg.d_model
    first, last = s == 0, s == P - 1
    # act: a microbatch's loss weighs its rows' share of the global batch and gradients are summed over
    # DP ranks (however the rows are split, the update is the global batch's mean); else 1/M and averaged
    weighted = bool(getattr(cfg, "act", False))
    global_rows = cfg.dp * M * cfg.batch_size
    prev_rank, next_rank = dp * P + s - 1, dp * P + s + 1
    inputs, outputs, losses = {}, {}, []
    meta = {}  # microbatch -> (tokens, targets, seq_lens)

    def shape(m):
        return (*data.shape(step, dp, m), d)

    def batch(m):
        if m not in meta:
            with tracer.op("data-wait", kind="other", microbatch=m):  # "loading" = slicing the corpus
                meta[m] = data.get(step, dp, m)
        return meta[m]

    def recv_forward(m):
        if not first:
            inputs[m] = torch.empty(shape(m))
            tracer.recv(inputs[m], prev_rank, name="forward-recv", microbatch=m)
            inputs[m].requires_grad_()

    def send(t, dst, name, m):
        with tracer.p2p(name, peer=dst, send=True, size_bytes=t.numel() * 4, microbatch=m):
            if dst in inj.link_delay_s:
                time.sleep(inj.link_delay_s[dst])  # slow-link: this transfer is late
            dist.send(t.contiguous(), dst)

    def forward(m):
        x, y, seq_lens = batch(m)
        if m == 0:
            inj.host_stall(step)
        inj.launch_delay()
        with tracer.op("forward-compute", microbatch=m, num_tokens=x.numel(), seq_lens=seq_lens):
            t0, c0 = time.perf_counter(), time.thread_time()
            out = model(x if first else inputs[m], seq_lens if data.balanced else None)
            out = inj.slow_backward(out, m, time.perf_counter() - t0)
            if last:  # the loss is part of the last stage's forward
                w = (x.shape[0] / global_rows if weighted and not data.balanced
                     else 1 / (M * (cfg.dp if weighted else 1)))
                out = F.cross_entropy(out.flatten(0, 1), y.flatten()) * w
                losses.append(out.item())
            inj.burn(time.perf_counter() - t0, c0)
            inj.maybe_collect()
        outputs[m] = out
        if not last:
            send(out.detach(), next_rank, "forward-send", m)

    def backward(m):
        grad = None
        if not last:
            grad = torch.empty(shape(m))
            tracer.recv(grad, next_rank, name="backward-recv", microbatch=m)
        x, _, seq_lens = batch(m)
        inj.launch_delay()
        with tracer.op("backward-compute", microbatch=m, num_tokens=x.numel(), seq_lens=seq_lens):
            inj.backward(outputs.pop(m), grad, m)

    def send_backward(m):
        if not first:
            send(inputs.pop(m).grad, prev_rank, "backward-send", m)

    # 1F1B: warm-up forwards, then one forward one backward, then the remaining backwards. With
    # blocking (rendezvous) transfers the lower stage of each pair sends before it receives and the
    # upper one receives before it sends, so neighbours never wait on each other in a cycle.
    warmup = min(P - s - 1, M)
    for m in range(warmup):
        recv_forward(m)
        forward(m)
    steady = M - warmup
    if steady:
        recv_forward(warmup)
    for i in range(steady):
        forward(warmup + i)  # sends the activation, if there is a next stage
        backward(i)  # receives the gradient, if there is a next stage
        if i < steady - 1:
            recv_forward(warmup + i + 1)
        send_backward(i)
    for m in range(steady, M):
        backward(m)
        send_backward(m)

    # data parallel: average this stage's gradients over its replicas, in one flat buffer
    params = [p for p in model.parameters() if p.grad is not None]
    flat = None
    if cfg.dp > 1:
        with tracer.collective("grads-all-reduce", group=dp_group, size_bytes=4 * sum(p.numel() for p in params)):
            flat = torch.cat([p.grad.flatten() for p in params])  # traced too: untraced work hides in gaps
            dist.all_reduce(flat, group=dp_group)
    # clip by the norm of the whole model's gradient: a world-wide all-reduce, as Megatron does,
    # which also lines all ranks up for the next step
    # (the same all-reduce sums the global batch's mean loss: every rank reports it)
    div = 1 if weighted else cfg.dp
    with tracer.collective("optimizer-clip-main-grad", size_bytes=16):
        sq = (flat / div).square().sum() if flat is not None else sum(p.grad.square().sum() for p in params)
        loss = sum(losses) / (1 if weighted else cfg.dp) if last else 0.0
        sq = torch.stack([sq.reshape(()) / cfg.dp, torch.tensor(float(loss))])  # each stage once per DP replica
        dist.all_reduce(sq)
    inj.launch_delay()
    with tracer.op("optimizer"):
        scale = min(1.0, 1.0 / (float(sq[0].sqrt()) + 1e-6))  # max gradient norm 1.0
        offset = 0
        for p in params:
            if flat is not None:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            p.grad.mul_(scale / (div if flat is not None else 1))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return float(sq[1]) if last else None


if __name__ == "__main__":
    import argparse

    from laggard.demo.launch import JobConfig, run_job
    from laggard.groundtruth.inject import parse_injections

    ap = argparse.ArgumentParser(description="Train the demo GPT on dp x pp CPU processes, traced.")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--inject", action="append", default=[])
    ap.add_argument("--out", default="out/demo-trace")
    ap.add_argument("--planned-gc", default=None, help="mitigation: collect on all ranks every N steps, or 'adaptive'")
    ap.add_argument("--balance-sequences", action="store_true", help="mitigation: balance microbatches by cost")
    ap.add_argument("--layers-per-stage", default=None, help="mitigation: blocks per stage, e.g. 3,1")
    ap.add_argument("--num-layers", type=int, default=None,
                    help="transformer blocks (default: 4, or the next multiple of --pp, so stages split evenly)")
    ap.add_argument("--profiler", default=None, metavar="DIR",
                    help="also run the traced steps under torch.profiler, writing DIR/rank{R}.json")
    ap.add_argument("--profiler-gc", action="store_true",
                    help="with --profiler: record Python's garbage collections too (and so the Python stacks)")
    a = ap.parse_args()
    gc_plan = None if a.planned_gc is None else a.planned_gc if a.planned_gc == "adaptive" else int(a.planned_gc)
    split = None if a.layers_per_stage is None else [int(x) for x in a.layers_per_stage.split(",")]
    res = run_job(JobConfig(dp=a.dp, pp=a.pp, steps=a.steps, injections=parse_injections(a.inject), trace_dir=a.out,
                            planned_gc=gc_plan, balance_sequences=a.balance_sequences, layers_per_stage=split,
                            num_layers=sum(split) if split else a.num_layers or -(-4 // a.pp) * a.pp,
                            profiler_dir=a.profiler, profiler_gc=a.profiler_gc),
                  on_progress=lambda k, n, loss: print(f"step {k}/{n} loss {loss:.3f}" if loss else f"step {k}/{n}"))
    print(f"{'ok' if res.ok else 'failed: ' + str(res.failures)} in {res.wall_s:.1f} s; trace in {a.out}")
