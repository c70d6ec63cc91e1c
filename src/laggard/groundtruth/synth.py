"""Synthetic 1F1B training jobs with realistic jitter, written as native op tables.

The schedule of one pipeline instance (every stage of one DP rank in one step) is built from
the 1F1B rules, replicated to every (step, DP rank), given jittered durations and replayed with
the same engine the analysis uses, so the trace is exactly consistent with its dependency model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from laggard.errors import LaggardError, check_job_size, check_seed
from laggard.groundtruth.inject import Injection
from laggard.optable.ops import Job, JobMeta, make_table
from laggard.optable.template import Template, template_columns

# op type -> (kind, stream, mean duration in ms at the default scale)
OP_COSTS_MS: dict[str, tuple[str, str, float]] = {
    "params-all-gather": ("collective", "dp-comm", 4.0),
    "forward-compute": ("compute", "compute", 10.0),
    "backward-compute": ("compute", "compute", 20.0),
    "forward-send": ("p2p_send", "pp-forward-send", 0.4),
    "forward-recv": ("p2p_recv", "pp-forward-recv", 0.4),
    "backward-send": ("p2p_send", "pp-backward-send", 0.4),
    "backward-recv": ("p2p_recv", "pp-backward-recv", 0.4),
    "gc": ("other", "compute", 0.0),
    "layernorm-grads-all-reduce": ("collective", "mp-comm", 0.1),
    "embedding-grads-all-reduce": ("collective", "mp-comm", 1.0),
    "grads-reduce-scatter": ("collective", "dp-comm", 8.0),
    "optimizer-clip-main-grad": ("collective", "mp-comm", 0.3),
    "optimizer": ("compute", "compute", 3.0),
}


@dataclass(kw_only=True, slots=True)
class SynthConfig:
    dp: int = 2
    pp: int = 4
    vpp: int = 1
    microbatches: int = 8
    steps: int = 10
    tp: int = 1
    seed: int = 0
    jitter: float = 0.03  # lognormal sigma of per-op noise
    name: str = "synthetic"
    costs_ms: dict[str, float] = field(default_factory=dict)  # overrides of OP_COSTS_MS means
    # A generated op table is ~100 bytes per op in memory (and again while written): 40 M ops is
    # ~4 GB, room for 16,384 workers (dp 2048 x pp 8, 16 microbatches, 20 steps: 34.7 M ops; the
    # scale benchmark's largest job); larger sizes are typos (--steps 1e9), not jobs.
    max_ops: int = 40_000_000

    def __post_init__(self) -> None:
        for k in ("dp", "pp", "vpp", "microbatches", "steps", "tp"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise LaggardError(f"--{k}: must be a positive integer, got {v!r}")
        if not self.jitter >= 0 or not np.isfinite(self.jitter):
            raise LaggardError(f"--jitter: must be a finite number >= 0, got {self.jitter!r}")
        check_seed(self.seed)
        # per worker and step: forward, backward and four p2p ops per microbatch and chunk, and the tail
        per_worker_step = 6 * self.microbatches * self.vpp + 10
        check_job_size(self.dp * self.pp * self.steps * per_worker_step, self.max_ops,
                       f"--dp {self.dp} x --pp {self.pp} x --steps {self.steps} x --microbatches {self.microbatches}"
                       + (f" x --vpp {self.vpp}" if self.vpp > 1 else ""))


def schedule_1f1b(stage: int, num_stages: int, num_mb: int, num_chunks: int = 1) -> list[tuple[str, int, int]]:
    """Compute order of one stage as (F|B, microbatch, model chunk): warm-up forwards,
    one-forward-one-backward, cool-down backwards. With ``num_chunks`` > 1 this is the interleaved
    (virtual pipeline) schedule: microbatches go through the chunks in groups of ``num_stages``."""
    total = num_mb * num_chunks
    if num_chunks == 1:
        warmup = min(num_stages - stage - 1, num_mb)
    else:
        warmup = min((num_stages - stage - 1) * 2 + (num_chunks - 1) * num_stages, total)

    def unit(k: int, forward: bool) -> tuple[int, int]:
        group = num_stages * num_chunks
        chunk = (k % group) // num_stages
        if not forward:
            chunk = num_chunks - 1 - chunk
        return (k // group) * num_stages + k % num_stages, chunk

    order: list[tuple[str, int, int]] = [("F", *unit(k, True)) for k in range(warmup)]
    for i in range(total - warmup):
        order.append(("F", *unit(warmup + i, True)))
        order.append(("B", *unit(i, False)))
    order += [("B", *unit(k, False)) for k in range(total - warmup, total)]
    return order


def build_1f1b_template(num_stages: int, num_mb: int, num_chunks: int = 1) -> Template:
    """Dependency model of one DP rank's pipeline for one step (the same rules as Megatron traces).

    Virtual stage ``v = chunk * P + stage``; forward data flows v -> v+1 and gradients v+1 -> v,
    so the last stage's chunk c feeds stage 0's chunk c+1.
    """
    if num_chunks > 1 and num_mb % num_stages:
        raise LaggardError(f"--microbatches {num_mb}: the interleaved schedule needs a multiple of --pp {num_stages}")
    stage, name, mb, chunk_of, deps, scope, label, gseq, peer = [], [], [], [], [], [], [], [], []
    num_v = num_stages * num_chunks

    def add(s: int, n: str, m: int, c: int, d: list[int], sc=None, lab=None, gs=-1, ps=-1) -> int:
        for lst, val in ((stage, s), (name, n), (mb, m), (chunk_of, c), (deps, d), (scope, sc), (label, lab),
                         (gseq, gs), (peer, ps)):
            lst.append(val)
        return len(stage) - 1

    for s in range(num_stages):
        ags = [add(s, "params-all-gather", -1, c, [], "dp", f"dp:pp{s}:params-all-gather", c)
               for c in range(num_chunks)]
        for a_prev, a_next in zip(ags, ags[1:], strict=False):
            deps[a_next].append(a_prev)
        prev: int | None = None
        last: dict[str, int | None] = {k: None
                                       for k in ("forward-send", "forward-recv", "backward-send", "backward-recv")}
        started: set[int] = set()
        for kind, m, c in schedule_1f1b(s, num_stages, num_mb, num_chunks):
            fwd = kind == "F"
            d = "forward" if fwd else "backward"
            v = c * num_stages + s
            has_recv = (v > 0) if fwd else (v < num_v - 1)
            has_send = (v < num_v - 1) if fwd else (v > 0)
            cdeps = [] if prev is None else [prev]
            if has_recv:
                src = (s - 1) % num_stages if fwd else (s + 1) % num_stages
                rname = f"{d}-recv"
                prev_r = last[rname]
                rdeps = ([] if prev is None else [prev]) + ([prev_r] if prev_r is not None else [])
                r = add(s, rname, m, c, rdeps, "local", f"p2p-{d}:pp{src}>pp{s}",
                        (v - (1 if fwd else -1)) * num_mb + m, src)
                last[rname] = r
                cdeps.append(r)
            if fwd and c not in started:
                cdeps.append(ags[c])
                started.add(c)
            comp = add(s, f"{d}-compute", m, c, cdeps)
            if has_send:
                dst = (s + 1) % num_stages if fwd else (s - 1) % num_stages
                sname = f"{d}-send"
                prev_s = last[sname]
                sdeps = [comp] + ([prev_s] if prev_s is not None else [])
                last[sname] = add(s, sname, m, c, sdeps, "local", f"p2p-{d}:pp{s}>pp{dst}", v * num_mb + m, dst)
            prev = comp
        g = add(s, "gc", -1, -1, [prev])
        chain = add(s, "layernorm-grads-all-reduce", -1, -1, [g])
        if s in (0, num_stages - 1):
            chain = add(s, "embedding-grads-all-reduce", -1, -1, [chain], "local", "embedding", 0)
        for c in reversed(range(num_chunks)):
            chain = add(s, "grads-reduce-scatter", -1, c, [chain, ags[-1]], "dp", f"dp:pp{s}:grads-reduce-scatter", c)
        chain = add(s, "optimizer-clip-main-grad", -1, -1, [chain], "world", "world:optimizer-clip-main-grad", 0)
        add(s, "optimizer", -1, -1, [chain])
    return Template(
        stage=np.array(stage, dtype=np.int64),
        name=name,
        kind=[OP_COSTS_MS[n][0] for n in name],
        stream=[OP_COSTS_MS[n][1] for n in name],
        microbatch=np.array(mb, dtype=np.int64),
        vchunk=np.array(chunk_of, dtype=np.int64),
        deps=[sorted(set(d)) for d in deps],
        scope=scope,
        label=label,
        gseq=gseq,
        peer_stage=peer,
    )


DOCS_PER_MICROBATCH = 4
MEAN_DOC_TOKENS = 512
# share of a microbatch's compute that grows with the square of document lengths (attention)
ATTENTION_SHARE = 0.7


@dataclass(kw_only=True, slots=True)
class Synthetic:
    job: Job
    truth: dict


def synthesize(cfg: SynthConfig, injections: list[Injection] | None = None) -> Job:
    """A synthetic job with the given straggler causes injected (see ``laggard.groundtruth.inject``)."""
    return synthesize_with_truth(cfg, injections).job


@dataclass(kw_only=True, slots=True)
class _OpMasks:
    """Per op of a synthetic job: what the injections select on."""

    is_fwd: np.ndarray
    is_comp: np.ndarray
    rank: np.ndarray
    pp: np.ndarray
    peer: np.ndarray
    kind: np.ndarray
    step: np.ndarray
    first_fwd: np.ndarray  # a stage's first forward of a step (microbatch 0, chunk 0)


def _documents(num_slots: int, sigma: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document lengths per microbatch slot, tokens per slot, each slot's relative compute cost)."""
    docs = np.full((num_slots, DOCS_PER_MICROBATCH), float(MEAN_DOC_TOKENS))
    if sigma > 0:
        docs = MEAN_DOC_TOKENS * rng.lognormal(-0.5 * sigma**2, sigma, size=docs.shape)
    docs = np.maximum(np.round(docs), 1)
    sq, lin = (docs**2).sum(axis=1), docs.sum(axis=1)
    cost = ATTENTION_SHARE * sq / (DOCS_PER_MICROBATCH * MEAN_DOC_TOKENS**2) + (1 - ATTENTION_SHARE) * lin / (
        DOCS_PER_MICROBATCH * MEAN_DOC_TOKENS
    )
    return docs, lin, cost / cost.mean()  # imbalance moves work between microbatches; the total stays the same


def _worker_rank(inj: Injection, cfg: SynthConfig, worker_rank: np.ndarray) -> int:
    """The global rank an injection names, one that some worker has (a one-line error otherwise)."""
    r = int(inj["rank"])
    if r not in worker_rank:
        raise LaggardError(f"--inject {inj.spec()}: no worker has global rank {r} (ranks: "
                           f"0..{worker_rank[-1]} step {cfg.tp})")
    return r


def _inject(inj: Injection, cfg: SynthConfig, ops: _OpMasks, worker_rank: np.ndarray, w: np.ndarray,
            launch_gap: np.ndarray, cost: np.ndarray, rng: np.random.Generator
            ) -> tuple[np.ndarray, np.ndarray, dict]:
    """One cause applied to the op durations ``w`` (s) and launch gaps; returns them and its truth."""
    rec = inj.to_json()
    if inj.cause == "slow-worker":
        r = _worker_rank(inj, cfg, worker_rank)
        w = np.where(ops.is_comp & (ops.rank == r), w * inj["factor"], w)
        wi = int(np.flatnonzero(worker_rank == r)[0])
        rec["workers"] = [{"rank": r, "dp_rank": wi // cfg.pp, "stage": wi % cfg.pp}]
    elif inj.cause in ("heavy-last-stage", "heavy-stage"):
        stage = cfg.pp - 1 if inj.cause == "heavy-last-stage" else int(inj["stage"])
        if stage >= cfg.pp:
            raise LaggardError(f"--inject {inj.spec()}: the job has {cfg.pp} pipeline stages (0..{cfg.pp - 1})")
        w = np.where(ops.is_comp & (ops.pp == stage), w * inj["factor"], w)
        rec["stages"] = [stage]
    elif inj.cause == "host-stall":
        r, every = _worker_rank(inj, cfg, worker_rank), int(inj["every"])
        hit = ops.first_fwd & (ops.rank == r) & (ops.step % every == 0)
        launch_gap = np.where(hit, launch_gap + inj["ms"] * 1e-3, launch_gap)
        rec["ranks"], rec["steps"] = [r], sorted({int(x) for x in ops.step[hit]})
    elif inj.cause == "seqlen-imbalance":
        rec["imbalance"] = float(cost.reshape(-1, cfg.microbatches).max(axis=1).mean() / cost.mean())
    elif inj.cause == "gc-pauses":
        hit = ops.is_fwd & (rng.random(len(w)) < inj["prob"])
        w = np.where(hit, w + inj["pause_ms"] * 1e-3, w)
        rec["num_pauses"] = int(hit.sum())
        rec["ranks"] = sorted({int(x) for x in ops.rank[hit]})
    elif inj.cause == "slow-link":
        src, dst = int(inj["src"]), int(inj["dst"])
        link = (((ops.kind == "p2p_send") & (ops.rank == src) & (ops.peer == dst))
                | ((ops.kind == "p2p_recv") & (ops.rank == dst) & (ops.peer == src)))
        if not link.any():
            raise LaggardError(f"--inject {inj.spec()}: ranks {src} and {dst} exchange no p2p data "
                               "(not adjacent stages of one DP rank)")
        w = np.where(link, w + inj["delay_ms"] * 1e-3, w)
        rec["link"] = [src, dst]
    elif inj.cause == "launch-delay":
        on = ops.is_comp
        if "rank" in inj.params:
            r = _worker_rank(inj, cfg, worker_rank)
            on = on & (ops.rank == r)
            rec["ranks"] = [r]
        launch_gap = launch_gap + np.where(on, inj["ms"] * 1e-3, 0.0)
    return w, launch_gap, rec


def synthesize_with_truth(cfg: SynthConfig, injections: list[Injection] | None = None) -> Synthetic:
    """The job and its ground truth: which causes were injected where, and how strongly."""
    import pyarrow as pa

    from laggard.engine.graph import build_graph
    from laggard.engine.replay import op_starts, replay

    injections = injections or []
    tpl = build_1f1b_template(cfg.pp, cfg.microbatches, cfg.vpp)
    num_t = len(tpl)
    inst_step = np.repeat(np.arange(cfg.steps, dtype=np.int64), cfg.dp)
    num_workers = cfg.dp * cfg.pp
    worker_rank = np.arange(num_workers, dtype=np.int64) * cfg.tp
    cols = template_columns(tpl, inst_step, cfg.dp, worker_rank)
    n = len(inst_step) * num_t
    rng = np.random.default_rng(cfg.seed)
    mean_ms = np.array([cfg.costs_ms.get(nm, OP_COSTS_MS[nm][2]) for nm in tpl.name])
    w = np.tile(mean_ms, len(inst_step)) * 1e-3
    if cfg.jitter > 0:
        w = w * rng.lognormal(-0.5 * cfg.jitter**2, cfg.jitter, size=n)

    name_t = np.array(tpl.name)
    is_fwd = np.tile(name_t == "forward-compute", len(inst_step))
    is_comp = is_fwd | np.tile(name_t == "backward-compute", len(inst_step))
    mb = cols["microbatch"]
    inst = np.repeat(np.arange(len(inst_step)), num_t)
    truth: dict = {"config": {k: getattr(cfg, k)
                              for k in ("dp", "pp", "vpp", "tp", "microbatches", "steps", "seed", "jitter")},
                   "injections": []}

    # document lengths per (instance, microbatch): constant unless seqlen-imbalance
    num_mb_slots = len(inst_step) * cfg.microbatches
    sigma = next((i["sigma"] for i in injections if i.cause == "seqlen-imbalance"), 0.0)
    docs, lin, cost = _documents(num_mb_slots, sigma, rng)
    slot = np.where(is_comp, inst * cfg.microbatches + np.maximum(mb, 0), 0)
    w = np.where(is_comp, w * cost[slot], w)
    launch_gap = np.zeros(n)
    ops = _OpMasks(is_fwd=is_fwd, is_comp=is_comp, rank=cols["rank"], pp=cols["pp_rank"], peer=cols["peer"],
                   kind=np.tile(np.array(tpl.kind), len(inst_step)), step=cols["step"],
                   first_fwd=is_fwd & (mb == 0) & (cols["vchunk"] == 0))
    for inj in injections:
        w, launch_gap, rec = _inject(inj, cfg, ops, worker_rank, w, launch_gap, cost, rng)
        truth["injections"].append(rec)

    cols["num_tokens"] = np.where(is_comp, lin[slot], 0).astype(np.int64)
    cols["start_ns"] = np.zeros(n, dtype=np.int64)
    cols["dur_ns"] = np.zeros(n, dtype=np.int64)
    table = make_table(cols, num_rows=n)
    seq_lens = pa.ListArray.from_arrays(
        pa.array(np.arange(num_mb_slots + 1, dtype=np.int32) * DOCS_PER_MICROBATCH),
        pa.array(docs.ravel().astype(np.int32)),
    ).take(pa.array(slot))
    mask = pa.array(~is_comp)
    seq_lens = pa.ListArray.from_arrays(seq_lens.offsets, seq_lens.values, mask=mask) if (~is_comp).any() else seq_lens
    table = table.set_column(table.schema.get_field_index("seq_lens"), "seq_lens", seq_lens)
    job = Job(table=table, meta=_meta(cfg))
    graph = build_graph(job)
    # a launch gap delays an op after its dependencies end; it is not part of its duration
    ends, st = replay(graph, w + launch_gap)
    starts = op_starts(graph, ends) + launch_gap
    offset = np.concatenate([[0.0], np.cumsum(st)[:-1]])[graph.op_step]
    table = table.set_column(table.schema.get_field_index("start_ns"), "start_ns",
                             pa.array(np.round((starts + offset) * 1e9).astype(np.int64)))
    table = table.set_column(table.schema.get_field_index("dur_ns"), "dur_ns",
                             pa.array(np.round((ends - starts) * 1e9).astype(np.int64)))
    job = Job(table=table, meta=_meta(cfg))
    job.meta.extra["injections"] = [i.spec() for i in injections]
    return Synthetic(job=job, truth=truth)


def _meta(cfg: SynthConfig) -> JobMeta:
    return JobMeta(
        name=cfg.name,
        world_size=cfg.dp * cfg.pp * cfg.tp,
        dp_size=cfg.dp,
        pp_size=cfg.pp,
        tp_size=cfg.tp,
        vpp_size=cfg.vpp,
        gpus_per_worker=cfg.tp,
        source="synthetic",
        extra={"microbatches": cfg.microbatches, "seed": cfg.seed, "jitter": cfg.jitter},
    )
