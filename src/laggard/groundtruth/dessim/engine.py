"""A discrete-event simulation (SimPy) of a DP x PP (x vpp) 1F1B training job.

Every worker has a host process and three device streams (compute, p2p, collectives):

* the **host** walks the stage's 1F1B order; it blocks on each p2p receive (Megatron synchronises
  after its batched p2p calls), spends ``launch_s`` (plus any injected launch delay) launching each
  compute op into a bounded **launch queue** (``queue_depth``; the host blocks when it is full),
  loads data at the start of a step (rare **data stalls**) and waits for the optimizer at its end;
* a **GC pause** stops the host half-way through launching a forward pass: the device runs the
  first half and then idles until the host resumes;
* the **compute stream** runs launched ops in order once their inputs are there;
* **p2p transfers** are rendezvous of a send and a receive: the transfer starts when both ends are
  posted and takes the link's own latency; sends leave from their own stream, so they never block
  the host;
* **collectives** are rendezvous of all their participants: they end together, the link time
  after the last one arrives;
* each rank writes timestamps on its own clock (a constant **skew** per rank).

Random draws come from per-purpose streams indexed by (step, rank, item), so a job simulated again
without one cause keeps every other draw: that is how the truth (the real speed-up of fixing a
cause) is measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from laggard.errors import LaggardError, check_job_size, check_seed
from laggard.groundtruth.dessim.causes import Cause
from laggard.groundtruth.dessim.schedule import Item, stage_order

# op name -> (kind, stream, mean cost in ms at vpp=1); compute costs are per microbatch and stage
COSTS_MS: dict[str, tuple[str, str, float]] = {
    "params-all-gather": ("collective", "dp-comm", 4.0),
    "forward-compute": ("compute", "compute", 10.0),
    "backward-compute": ("compute", "compute", 20.0),
    "forward-send": ("p2p_send", "p2p-send", 0.4),
    "forward-recv": ("p2p_recv", "p2p-recv", 0.4),
    "backward-send": ("p2p_send", "p2p-send", 0.4),
    "backward-recv": ("p2p_recv", "p2p-recv", 0.4),
    "embedding-grads-all-reduce": ("collective", "dp-comm", 1.0),
    "grads-reduce-scatter": ("collective", "dp-comm", 8.0),
    "optimizer-clip-main-grad": ("collective", "dp-comm", 0.3),
    "optimizer": ("compute", "compute", 3.0),
}
DOCS_PER_MICROBATCH = 4
MEAN_DOC_TOKENS = 512
ATTENTION_SHARE = 0.7  # share of a microbatch's compute that grows with squared document lengths


@dataclass(kw_only=True, slots=True)
class SimConfig:
    dp: int = 2
    pp: int = 4
    vpp: int = 1
    microbatches: int = 8
    steps: int = 4
    seed: int = 0
    jitter: float = 0.03  # lognormal sigma of every duration
    launch_s: float = 20e-6  # host time to launch one compute op
    queue_depth: int = 4  # ops the host may run ahead of the device
    skew_s: float = 20e-6  # std of the per-rank clock offset (PTP-level alignment)
    data_stall_prob: float = 0.0  # chance a step's data load stalls (first stage)
    data_stall_s: float = 0.0
    # heavy-tailed noise: with this chance a compute op is stretched by a Pareto(tail_alpha) share of its
    # duration of at least tail_scale (a descheduled process, a noisy neighbour: what a lognormal jitter
    # alone never gives); 0 keeps every draw of the jitter-only model
    tail_prob: float = 0.0
    tail_alpha: float = 2.5
    tail_scale: float = 1.0
    name: str = "dessim"
    # Each op is a few SimPy events (~20 us each in Python): 2 M ops is about a minute per run,
    # and --truth runs the job len(causes) + 2 times; larger sizes are typos, not experiments.
    max_ops: int = 2_000_000

    def __post_init__(self) -> None:
        for k in ("dp", "pp", "vpp", "microbatches", "steps", "queue_depth"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise LaggardError(f"--{k.replace('_', '-')}: must be a positive integer, got {v!r}")
        check_seed(self.seed)
        # per rank and step: forward, backward and their p2p ops per microbatch and chunk, and the tail
        check_job_size(self.dp * self.pp * self.steps * (6 * self.microbatches * self.vpp + 10), self.max_ops,
                       f"--dp {self.dp} x --pp {self.pp} x --steps {self.steps} x --microbatches {self.microbatches}"
                       + (f" x --vpp {self.vpp}" if self.vpp > 1 else ""))
        if self.vpp > 1 and self.microbatches % self.pp:
            raise LaggardError(f"--microbatches {self.microbatches}: the interleaved schedule needs a multiple "
                               f"of --pp {self.pp}")
        if not 0.0 <= self.tail_prob <= 1.0 or not self.tail_alpha > 0 or not self.tail_scale > 0:
            raise LaggardError(f"tail_prob must be in [0, 1] and tail_alpha > 0 (got {self.tail_prob}, "
                               f"{self.tail_alpha})")
        for k in ("jitter", "launch_s", "skew_s", "data_stall_prob", "data_stall_s"):
            if not getattr(self, k) >= 0:
                raise LaggardError(f"{k} must be >= 0")

    @property
    def num_ranks(self) -> int:
        return self.dp * self.pp


@dataclass(kw_only=True, slots=True)
class SimOps:
    """What the simulated job did: one entry per op (times in seconds on the rank's own clock)."""

    cfg: SimConfig
    causes: list[Cause]
    cols: dict[str, list[Any]]
    step_time_s: np.ndarray  # per step: the job's wall time from first start to last end (true clock)
    seq_lens: list[list[int] | None] = field(default_factory=list)

    @property
    def mean_step_s(self) -> float:
        return float(np.mean(self.step_time_s))


class _Draws:
    """Pre-drawn random numbers, one stream per purpose, indexed so that causes never shift them."""

    def __init__(self, cfg: SimConfig) -> None:
        ss = np.random.SeedSequence(cfg.seed)
        g = [np.random.default_rng(s) for s in ss.spawn(8)]  # the first 7 are those of the jitter-only model
        n_items = 2 * cfg.microbatches * cfg.vpp
        shape = (cfg.steps, cfg.num_ranks, n_items)
        sig = cfg.jitter
        self.compute = g[0].lognormal(-0.5 * sig**2, sig, size=shape)
        self.send = g[1].lognormal(-0.5 * sig**2, sig, size=shape)
        self.coll = g[2].lognormal(-0.5 * sig**2, sig, size=(cfg.steps, cfg.num_ranks, 8))
        self.gc = g[3].random(size=shape)
        self.docs_z = g[4].standard_normal(size=(cfg.steps, cfg.dp, cfg.microbatches, DOCS_PER_MICROBATCH))
        self.stall = g[5].random(size=(cfg.steps, cfg.num_ranks))
        self.skew = g[6].normal(0.0, cfg.skew_s, size=cfg.num_ranks) if cfg.skew_s > 0 else np.zeros(cfg.num_ranks)
        if cfg.tail_prob > 0:  # drawn from its own stream: the other draws stay as they were
            hit = g[7].random(size=shape) < cfg.tail_prob
            stretch = cfg.tail_scale * (1.0 + g[7].pareto(cfg.tail_alpha, size=shape))  # Pareto I from tail_scale
            self.compute = self.compute * (1.0 + np.where(hit, stretch, 0.0))


class _Rendezvous:
    """All participants arrive; the transfer starts with the last one and ends ``dur_s`` later."""

    __slots__ = ("env", "left", "dur_s", "done")

    def __init__(self, env: simpy.Environment, size: int, dur_s: float) -> None:
        self.env, self.left, self.dur_s = env, size, dur_s
        self.done = env.event()

    def arrive(self) -> simpy.Event:
        self.left -= 1
        if self.left == 0:
            self.env.process(self._finish())
        return self.done

    def _finish(self):  # noqa: ANN202 (a SimPy process)
        yield self.env.timeout(self.dur_s)
        self.done.succeed()


class _Op:
    __slots__ = ("id", "parts", "deps", "done", "rdv", "rdv_key")

    def __init__(self, env: simpy.Environment, op_id: int) -> None:
        self.id = op_id
        self.parts: list[tuple[simpy.Event | None, float]] = []
        self.deps: list[_Op] = []
        self.done = env.event()
        self.rdv: _Rendezvous | None = None


class _Sim:
    def __init__(self, cfg: SimConfig, causes: list[Cause]) -> None:
        self.cfg = cfg
        self.env = simpy.Environment()
        self.d = _Draws(cfg)
        self.rdv: dict[tuple, _Rendezvous] = {}
        self.cols: dict[str, list[Any]] = {k: [] for k in (
            "rank", "dp_rank", "pp_rank", "vchunk", "step", "microbatch", "name", "kind", "stream",
            "start_s", "end_s", "group", "seq", "peer", "num_tokens", "deps")}
        self.seq_lens: list[list[int] | None] = []
        self._apply_causes(causes)

    # -- causes ---------------------------------------------------------------------------------
    def _apply_causes(self, causes: list[Cause]) -> None:
        cfg = self.cfg
        self.rank_factor = np.ones(cfg.num_ranks)
        self.stage_factor = np.ones(cfg.pp)
        self.link_delay: dict[tuple[int, int], float] = {}
        self.gc_prob, self.gc_pause_s, self.launch_extra_s, sigma = 0.0, 0.0, 0.0, 0.0
        for c in causes:
            if c.kind == "slow-worker":
                bad = [r for r in c.ranks if r >= cfg.num_ranks]
                if bad:
                    raise LaggardError(f"--inject {c.spec()}: no rank {bad[0]} (ranks 0..{cfg.num_ranks - 1})")
                self.rank_factor[c.ranks] *= c["factor"]
            elif c.kind == "heavy-stage":
                s = int(c["stage"]) % cfg.pp
                self.stage_factor[s] *= c["factor"]
            elif c.kind == "seq-imbalance":
                sigma = c["sigma"]
            elif c.kind == "gc":
                self.gc_prob, self.gc_pause_s = c["prob"], c["pause_ms"] * 1e-3
            elif c.kind == "slow-link":
                src, dst = int(c["src"]), int(c["dst"])
                if (src >= cfg.num_ranks or dst >= cfg.num_ranks or src // cfg.pp != dst // cfg.pp
                        or not self._adjacent(src, dst)):
                    raise LaggardError(f"--inject {c.spec()}: ranks {src} and {dst} are not neighbouring "
                                       "stages of one DP rank")
                self.link_delay[(src, dst)] = self.link_delay.get((src, dst), 0.0) + c["delay_ms"] * 1e-3
            elif c.kind == "launch-delay":
                self.launch_extra_s += c["ms"] * 1e-3
        docs = MEAN_DOC_TOKENS * np.exp(sigma * self.d.docs_z - 0.5 * sigma**2)
        self.docs = np.maximum(np.round(docs), 1).astype(np.int64)
        sq = (self.docs.astype(float) ** 2).sum(axis=-1) / (DOCS_PER_MICROBATCH * MEAN_DOC_TOKENS**2)
        lin = self.docs.sum(axis=-1) / (DOCS_PER_MICROBATCH * MEAN_DOC_TOKENS)
        cost = ATTENTION_SHARE * sq + (1 - ATTENTION_SHARE) * lin
        self.mb_cost = cost / cost.mean()  # (step, dp, microbatch): the work moves, the total stays

    def _adjacent(self, a: int, b: int) -> bool:
        pp = self.cfg.pp
        sa, sb = a % pp, b % pp
        return (sb - sa) % pp in (1, pp - 1) if pp > 2 else sa != sb

    # -- recording ------------------------------------------------------------------------------
    def _record(self, rank: int, step: int, name: str, *, mb: int = -1, chunk: int = -1, group: str | None = None,
                seq: int = -1, peer: int = -1, deps: list[int] | None = None) -> int:
        cfg, c = self.cfg, self.cols
        kind, stream, _ = COSTS_MS[name]
        op_id = len(c["rank"])
        for k, v in (("rank", rank), ("dp_rank", rank // cfg.pp), ("pp_rank", rank % cfg.pp), ("vchunk", chunk),
                     ("step", step), ("microbatch", mb), ("name", name), ("kind", kind), ("stream", stream),
                     ("start_s", np.nan), ("end_s", np.nan), ("group", group), ("seq", seq), ("peer", peer),
                     ("num_tokens", None), ("deps", deps or [])):
            c[k].append(v)
        self.seq_lens.append(None)
        return op_id

    def _stamp(self, op_id: int, start_s: float, end_s: float) -> None:
        self.cols["start_s"][op_id] = start_s
        self.cols["end_s"][op_id] = end_s

    def _rendezvous(self, key: tuple, size: int, dur_s: float) -> _Rendezvous:
        r = self.rdv.get(key)
        if r is None:
            r = self.rdv[key] = _Rendezvous(self.env, size, dur_s)
        return r

    # -- streams ----------------------------------------------------------------------------------
    def _compute_stream(self, queue: simpy.Store):  # noqa: ANN202
        env = self.env
        while True:
            op: _Op = yield queue.get()
            for d in op.deps:
                if not d.done.triggered:
                    yield d.done
            start = env.now
            for launched, dur in op.parts:
                if launched is not None and not launched.triggered:
                    yield launched
                yield env.timeout(dur)
            self._stamp(op.id, start, env.now)
            op.done.succeed()

    def _comm_stream(self, queue: simpy.Store):  # noqa: ANN202
        env = self.env
        while True:
            op: _Op = yield queue.get()
            for d in op.deps:
                if not d.done.triggered:
                    yield d.done
            start = env.now
            assert op.rdv is not None
            yield op.rdv.arrive()
            self._stamp(op.id, start, env.now)
            op.done.succeed()

    # -- one worker ---------------------------------------------------------------------------------
    def _worker(self, rank: int, step_done: list[simpy.Event], queues: dict[str, simpy.Store]):  # noqa: ANN202
        cfg, env, d = self.cfg, self.env, self.d
        dp, stage = divmod(rank, cfg.pp)
        order = stage_order(stage, cfg.pp, cfg.microbatches, cfg.vpp)
        num_v = cfg.pp * cfg.vpp
        for step in range(cfg.steps):
            # data loading on the first stage (rare stalls)
            if stage == 0 and cfg.data_stall_s > 0 and d.stall[step, rank] < cfg.data_stall_prob:
                yield env.timeout(cfg.data_stall_s)
            ag: list[_Op] = []
            for c in range(cfg.vpp):
                ag.append(self._collective(rank, step, "params-all-gather", f"dp:pp{stage}:ag", c, cfg.dp, slot=c,
                                           deps=ag[-1:] if ag else [], queue=queues["comm"]))
            last_recv: _Op | None = None
            last_send: _Op | None = None
            prev: _Op | None = None
            started: set[int] = set()
            for i, it in enumerate(order):
                v = it.chunk * cfg.pp + stage
                name = "forward-compute" if it.forward else "backward-compute"
                deps: list[_Op] = [prev] if prev is not None else []
                has_recv = v > 0 if it.forward else v < num_v - 1
                if has_recv:
                    src = rank - stage + ((stage - 1) % cfg.pp if it.forward else (stage + 1) % cfg.pp)
                    last_recv = self._p2p(rank, src, step, it, recv=True, deps=[last_recv] if last_recv else [],
                                          queue=queues["recv"])
                    yield last_recv.done  # the host synchronises on the received data
                    deps.append(last_recv)
                if it.forward and it.chunk not in started:
                    started.add(it.chunk)
                    deps.append(ag[it.chunk])
                op = _Op(env, self._record(rank, step, name, mb=it.microbatch, chunk=it.chunk,
                                           deps=[x.id for x in deps]))
                op.deps = deps
                self._tokens(op.id, step, dp, it.microbatch)
                dur = (COSTS_MS[name][2] * 1e-3 / cfg.vpp) * d.compute[step, rank, i] * self.rank_factor[rank] \
                    * self.stage_factor[stage] * self.mb_cost[step, dp, it.microbatch]
                yield env.timeout(cfg.launch_s + self.launch_extra_s)
                if it.forward and self.gc_prob > 0 and d.gc[step, rank, i] < self.gc_prob:
                    # the host launches half the forward's kernels, collects garbage, launches the rest
                    resumed = env.event()
                    op.parts = [(None, 0.5 * dur), (resumed, 0.5 * dur)]
                    yield queues["compute"].put(op)
                    yield env.timeout(self.gc_pause_s)
                    resumed.succeed()
                else:
                    op.parts = [(None, dur)]
                    yield queues["compute"].put(op)
                prev = op
                has_send = v < num_v - 1 if it.forward else v > 0
                if has_send:
                    dst = rank - stage + ((stage + 1) % cfg.pp if it.forward else (stage - 1) % cfg.pp)
                    last_send = self._p2p(rank, dst, step, it, recv=False,
                                          deps=[op] + ([last_send] if last_send else []), queue=queues["send"])
            assert prev is not None
            chain: list[_Op] = [prev]
            if cfg.pp > 1 and stage in (0, cfg.pp - 1):
                chain = [self._collective(rank, step, "embedding-grads-all-reduce", f"emb:dp{dp}", 0, 2, slot=cfg.vpp,
                                          deps=chain, queue=queues["comm"])]
            for c in reversed(range(cfg.vpp)):
                chain = [self._collective(rank, step, "grads-reduce-scatter", f"dp:pp{stage}:rs", c, cfg.dp,
                                          slot=cfg.vpp + 1 + c, deps=chain + [ag[-1]], queue=queues["comm"])]
            clip = self._collective(rank, step, "optimizer-clip-main-grad", "world", 0, cfg.num_ranks,
                                    slot=2 * cfg.vpp + 1, deps=chain, queue=queues["comm"])
            opt = _Op(env, self._record(rank, step, "optimizer", deps=[prev.id, clip.id]))
            opt.deps = [prev, clip]
            opt.parts = [(None, COSTS_MS["optimizer"][2] * 1e-3 * d.coll[step, rank, 7])]
            yield env.timeout(cfg.launch_s)
            yield queues["compute"].put(opt)
            yield opt.done  # the host waits for the step to finish (loss / grad-norm read back)
            step_done[step] = env.now

    def _tokens(self, op_id: int, step: int, dp: int, mb: int) -> None:
        docs = self.docs[step, dp, mb]
        self.cols["num_tokens"][op_id] = int(docs.sum())
        self.seq_lens[op_id] = [int(x) for x in docs]

    def _collective(self, rank: int, step: int, name: str, group: str, seq: int, size: int, *, slot: int,
                    deps: list[_Op], queue: simpy.Store) -> _Op:
        op = _Op(self.env, self._record(rank, step, name, chunk=seq if "chunk" in group or name != "world" else -1,
                                        group=group, seq=seq, deps=[x.id for x in deps]))
        op.deps = deps
        # the link time is drawn by the group's lowest rank, so all participants agree
        lead = (rank % self.cfg.pp if group.startswith("dp:")
                else (rank - rank % self.cfg.pp if group.startswith("emb") else 0))
        dur = COSTS_MS[name][2] * 1e-3 * self.d.coll[step, lead, min(slot, 6)]
        op.rdv = self._rendezvous((step, group, seq), size, dur)
        queue.put(op)
        return op

    def _p2p(self, rank: int, other: int, step: int, it: Item, *, recv: bool, deps: list[_Op],
             queue: simpy.Store) -> _Op:
        d = "forward" if it.forward else "backward"
        src, dst = (other, rank) if recv else (rank, other)
        group = f"p2p:{src}>{dst}"
        # one sequence number per transfer, from the sending virtual stage (the chunk changes when
        # data wraps from the last stage to the first with vpp > 1)
        v = it.chunk * self.cfg.pp + rank % self.cfg.pp
        v_src = v if not recv else (v - 1 if it.forward else v + 1)
        seq = (v_src * self.cfg.microbatches + it.microbatch) * 2 + (0 if it.forward else 1)
        op = _Op(self.env, self._record(rank, step, f"{d}-{'recv' if recv else 'send'}", mb=it.microbatch,
                                        chunk=it.chunk, group=group, seq=seq, peer=other,
                                        deps=[x.id for x in deps]))
        op.deps = deps
        key = (step, group, seq)
        rdv = self.rdv.get(key)
        if rdv is None:
            # the sender's draw sets the latency; the receiver may post first, so draw it from the key
            dur = COSTS_MS[f"{d}-send"][2] * 1e-3 * float(self.d.send[step, src, seq % self.d.send.shape[2]])
            dur += self.link_delay.get((src, dst), 0.0)
            rdv = self._rendezvous(key, 2, dur)
        op.rdv = rdv
        queue.put(op)
        return op

    def run(self) -> np.ndarray:
        cfg, env = self.cfg, self.env
        step_done = [[0.0] * cfg.steps for _ in range(cfg.num_ranks)]
        for r in range(cfg.num_ranks):
            queues = {"compute": simpy.Store(env, capacity=cfg.queue_depth), "comm": simpy.Store(env),
                      "send": simpy.Store(env), "recv": simpy.Store(env)}
            env.process(self._compute_stream(queues["compute"]))
            for k in ("comm", "send", "recv"):
                env.process(self._comm_stream(queues[k]))
            env.process(self._worker(r, step_done[r], queues))
        env.run()
        start = np.array(self.cols["start_s"], dtype=float)
        if np.isnan(start).any():
            raise LaggardError(f"simulation deadlocked: {int(np.isnan(start).sum())} ops never ran "
                               "(a bug in the model)")
        end = np.array(self.cols["end_s"], dtype=float)
        step = np.array(self.cols["step"], dtype=np.int64)
        first = np.full(cfg.steps, np.inf)
        last = np.zeros(cfg.steps)
        np.minimum.at(first, step, start)
        np.maximum.at(last, step, end)
        return last - first


def simulate(cfg: SimConfig, causes: list[Cause] | None = None) -> SimOps:
    """Run the job with the given causes; op times are on each rank's own (skewed) clock."""
    sim = _Sim(cfg, list(causes or []))
    step_s = sim.run()
    skew = sim.d.skew[np.array(sim.cols["rank"], dtype=np.int64)]
    sim.cols["start_s"] = (np.array(sim.cols["start_s"]) + skew).tolist()
    sim.cols["end_s"] = (np.array(sim.cols["end_s"]) + skew).tolist()
    return SimOps(cfg=cfg, causes=list(causes or []), cols=sim.cols, step_time_s=step_s, seq_lens=sim.seq_lens)
