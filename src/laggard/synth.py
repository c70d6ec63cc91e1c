"""Synthetic 1F1B training jobs with realistic jitter, written as native op tables.

The schedule of one pipeline instance (every stage of one DP rank in one step) is built from
the 1F1B rules, replicated to every (step, DP rank), given jittered durations and replayed with
the same engine the analysis uses, so the trace is exactly consistent with its dependency model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from laggard.io.template import Template, template_columns
from laggard.ops import Job, JobMeta, LaggardError, make_table

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
    microbatches: int = 8
    steps: int = 10
    tp: int = 1
    seed: int = 0
    jitter: float = 0.03  # lognormal sigma of per-op noise
    name: str = "synthetic"
    costs_ms: dict[str, float] = field(default_factory=dict)  # overrides of OP_COSTS_MS means

    def __post_init__(self) -> None:
        for k in ("dp", "pp", "microbatches", "steps", "tp"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise LaggardError(f"--{k}: must be a positive integer, got {v!r}")
        if self.jitter < 0:
            raise LaggardError("jitter must be >= 0")


def schedule_1f1b(stage: int, num_stages: int, num_mb: int) -> list[tuple[str, int]]:
    """The compute order of one stage: warm-up forwards, one-forward-one-backward, cool-down."""
    warmup = min(num_stages - stage - 1, num_mb)
    order = [("F", m) for m in range(warmup)]
    for i in range(num_mb - warmup):
        order.append(("F", warmup + i))
        order.append(("B", i))
    order += [("B", m) for m in range(num_mb - warmup, num_mb)]
    return order


def build_1f1b_template(num_stages: int, num_mb: int) -> Template:
    """Dependency model of one DP rank's pipeline for one step (the same rules as Megatron traces)."""
    stage, name, mb, deps, scope, label, gseq, peer = [], [], [], [], [], [], [], []

    def add(s: int, n: str, m: int, d: list[int], sc=None, lab=None, gs=-1, ps=-1) -> int:
        stage.append(s)
        name.append(n)
        mb.append(m)
        deps.append(d)
        scope.append(sc)
        label.append(lab)
        gseq.append(gs)
        peer.append(ps)
        return len(stage) - 1

    for s in range(num_stages):
        ag = add(s, "params-all-gather", -1, [], "dp", f"dp:pp{s}:params-all-gather", 0)
        prev: int | None = None
        last = {"forward-send": None, "forward-recv": None, "backward-send": None, "backward-recv": None}
        first_fwd = True
        for kind, m in schedule_1f1b(s, num_stages, num_mb):
            fwd = kind == "F"
            d = "forward" if fwd else "backward"
            has_recv = (s > 0) if fwd else (s < num_stages - 1)
            has_send = (s < num_stages - 1) if fwd else (s > 0)
            cdeps = [] if prev is None else [prev]
            if has_recv:
                src = s - 1 if fwd else s + 1
                rname = f"{d}-recv"
                rdeps = ([] if prev is None else [prev]) + ([last[rname]] if last[rname] is not None else [])
                r = add(s, rname, m, rdeps, "local", f"p2p-{d}:pp{src}>pp{s}", m, src)
                last[rname] = r
                cdeps.append(r)
            if fwd and first_fwd:
                cdeps.append(ag)
                first_fwd = False
            c = add(s, f"{d}-compute", m, cdeps)
            if has_send:
                dst = s + 1 if fwd else s - 1
                sname = f"{d}-send"
                sdeps = [c] + ([last[sname]] if last[sname] is not None else [])
                last[sname] = add(s, sname, m, sdeps, "local", f"p2p-{d}:pp{s}>pp{dst}", m, dst)
            prev = c
        g = add(s, "gc", -1, [prev])
        chain = add(s, "layernorm-grads-all-reduce", -1, [g])
        if s in (0, num_stages - 1):
            chain = add(s, "embedding-grads-all-reduce", -1, [chain], "local", "embedding", 0)
        chain = add(s, "grads-reduce-scatter", -1, [chain, ag], "dp", f"dp:pp{s}:grads-reduce-scatter", 0)
        chain = add(s, "optimizer-clip-main-grad", -1, [chain], "world", "world:optimizer-clip-main-grad", 0)
        add(s, "optimizer", -1, [chain])
    return Template(
        stage=np.array(stage, dtype=np.int64),
        name=name,
        kind=[OP_COSTS_MS[n][0] for n in name],
        stream=[OP_COSTS_MS[n][1] for n in name],
        microbatch=np.array(mb, dtype=np.int64),
        vchunk=np.zeros(len(stage), dtype=np.int64),
        deps=[sorted(set(d)) for d in deps],
        scope=scope,
        label=label,
        gseq=gseq,
        peer_stage=peer,
    )


def synthesize(cfg: SynthConfig, *, scale: np.ndarray | None = None) -> Job:
    """A synthetic job. ``scale`` (optional, per op) multiplies the jittered durations."""
    from laggard.graph import build_graph
    from laggard.replay import op_starts, replay

    tpl = build_1f1b_template(cfg.pp, cfg.microbatches)
    num_t = len(tpl)
    inst_step = np.repeat(np.arange(cfg.steps, dtype=np.int64), cfg.dp)
    worker_rank = (np.arange(cfg.dp * cfg.pp) // cfg.pp * cfg.pp + np.arange(cfg.dp * cfg.pp) % cfg.pp) * cfg.tp
    cols = template_columns(tpl, inst_step, cfg.dp, worker_rank)
    n = len(inst_step) * num_t
    rng = np.random.default_rng(cfg.seed)
    mean_ms = np.array([cfg.costs_ms.get(nm, OP_COSTS_MS[nm][2]) for nm in tpl.name])
    w = np.tile(mean_ms, len(inst_step)) * 1e-3
    if cfg.jitter > 0:
        w = w * rng.lognormal(-0.5 * cfg.jitter**2, cfg.jitter, size=n)
    if scale is not None:
        w = w * scale
    cols["start_ns"] = np.zeros(n, dtype=np.int64)
    cols["dur_ns"] = np.zeros(n, dtype=np.int64)
    job = Job(table=make_table(cols, num_rows=n), meta=_meta(cfg))
    graph = build_graph(job)
    ends, st = replay(graph, w)
    starts = op_starts(graph, ends)
    # steps run back to back on one clock
    offset = np.concatenate([[0.0], np.cumsum(st)[:-1]])[graph.op_step]
    cols["start_ns"] = np.round((starts + offset) * 1e9).astype(np.int64)
    cols["dur_ns"] = np.round((ends - starts) * 1e9).astype(np.int64)
    return Job(table=make_table(cols, num_rows=n), meta=_meta(cfg))


def _meta(cfg: SynthConfig) -> JobMeta:
    return JobMeta(
        name=cfg.name,
        world_size=cfg.dp * cfg.pp * cfg.tp,
        dp_size=cfg.dp,
        pp_size=cfg.pp,
        tp_size=cfg.tp,
        gpus_per_worker=cfg.tp,
        source="synthetic",
        extra={"microbatches": cfg.microbatches, "seed": cfg.seed, "jitter": cfg.jitter},
    )
