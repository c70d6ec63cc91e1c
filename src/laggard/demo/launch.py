"""Launch the real demo job (``examples/demo_job.py``): one spawned process per rank, gloo on loopback.

The training code lives in ``examples/demo_job.py`` (a file meant to be read); this module starts
its ranks, relays their progress, and copes with a rank that dies: the others fail on their next
collective (gloo notices the closed connection) and close their tracers; any rank still running
``grace_s`` later gets SIGTERM (the tracer flushes on it), then SIGKILL.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from laggard.errors import LaggardError
from laggard.groundtruth.inject import Injection

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "demo_job.py"


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """The demo job: layout, model, data, injected stragglers, tracing."""

    dp: int = 2
    pp: int = 2
    steps: int = 200  # traced steps (about two minutes with the start-up, on two cores)
    warmup_steps: int = 3  # run first, untraced (first-call costs are not stragglers)
    microbatches: int = 4
    batch_size: int = 4  # sequences per microbatch
    seq_len: int = 128  # tokens per sequence (the mean, with seqlen-imbalance)
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    lr: float = 1e-3
    seed: int = 0
    injections: list[Injection] = field(default_factory=list)
    trace_dir: str | None = None  # None: train without tracing
    flush_interval_s: float = 10.0
    monitor_url: str | None = None  # also stream the trace to this live-monitor collector
    monitor_token: str | None = None
    monitor_job: str | None = None  # the job id there (default: the job name)
    record_every: int = 1  # trace one step in N (the others run untraced)
    profiler_dir: str | None = None  # also run the traced steps under torch.profiler: rank{R}.json here
    # ...recording Python's garbage collections too ("Python GC" events: torch >= 2.13's
    # record_python_gc_info, which needs the Python stacks, so every Python call becomes an event)
    profiler_gc: bool = False
    timeout_s: float = 120.0  # a collective that waits longer fails (gloo timeout)
    crash_rank: int | None = None  # testing: this rank dies (os._exit) at the end of crash_step
    crash_step: int = 0
    # mitigations (laggard.mitigate), see examples/demo_job.py
    planned_gc: int | str | None = None  # PlannedGC: all ranks collect every N steps, or "adaptive"
    balance_sequences: bool = False  # seqlen-imbalance: microbatches balanced by cost, not taken in order
    layers_per_stage: list[int] | None = None  # transformer blocks per pipeline stage (default: even)
    # gc.freeze() after the warm-up steps: the objects alive then (torch's own, the model) are out of the
    # collector's reach, so the traced steps have no natural full-collection pauses (~150 ms here) and
    # the only GC pauses are injected ones (gc-pauses); the real-process corpus's clean jobs need this
    freeze_gc: bool = False
    # runtime actions (laggard.mitigate.Controller): rows shifted off a slow DP rank, planned GC and
    # balanced packing on the collector's findings, drain requests to act_webhook; logged to actions_path
    act: bool = False
    actions_path: str | None = None
    act_config: dict[str, Any] | None = None  # ActConfig fields (thresholds), e.g. {"every_steps": 5}
    act_webhook: str | None = None

    def __post_init__(self) -> None:
        for k in ("dp", "pp", "steps", "microbatches", "batch_size", "seq_len", "d_model", "num_layers", "num_heads"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LaggardError(f"--{k.replace('_', '-')}: must be a positive integer, got {v!r}")
        if self.num_layers < self.pp:
            raise LaggardError(f"the model has {self.num_layers} layers: too few for {self.pp} pipeline stages")
        if self.d_model % self.num_heads:
            raise LaggardError(f"d_model {self.d_model} is not a multiple of num_heads {self.num_heads}")
        world = self.dp * self.pp
        if world > 64:
            raise LaggardError(f"--dp x --pp = {world} processes: too many for one machine (at most 64)")
        for inj in self.injections:
            for key in ("rank", "src", "dst"):
                if key in inj.params and int(inj.params[key]) >= world:
                    raise LaggardError(f"--inject {inj.spec()}: {key}={int(inj.params[key])} but the job has "
                                       f"{world} ranks (0..{world - 1})")
            if inj.cause == "heavy-stage" and int(inj.params["stage"]) >= self.pp:
                raise LaggardError(f"--inject {inj.spec()}: stage={int(inj.params['stage'])} but the job has "
                                   f"{self.pp} pipeline stages (0..{self.pp - 1})")
            if inj.cause == "slow-link":
                src, dst = int(inj.params["src"]), int(inj.params["dst"])
                stage = src % self.pp
                peers = [r for r, ok in ((src + 1, stage < self.pp - 1), (src - 1, stage > 0)) if ok]
                if dst not in peers:
                    raise LaggardError(f"--inject {inj.spec()}: rank {src} never sends to rank {dst} (rank = "
                                       f"dp * {self.pp} + stage; it sends to its pipeline neighbours "
                                       f"{' and '.join(map(str, peers)) or '(none: pp is 1)'})")
        if self.planned_gc is not None and self.planned_gc != "adaptive" and (
                not isinstance(self.planned_gc, int) or isinstance(self.planned_gc, bool) or self.planned_gc < 1):
            raise LaggardError(f"--planned-gc: a positive number of steps or 'adaptive', got {self.planned_gc!r}")
        if self.layers_per_stage is not None:
            split = list(self.layers_per_stage)
            if (len(split) != self.pp or sum(split) != self.num_layers
                    or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in split)):
                raise LaggardError(f"--layers-per-stage {split}: {self.pp} non-negative integers adding up to the "
                                   f"{self.num_layers} layers")
            self.layers_per_stage = split
        if self.act_config:
            from laggard.mitigate import ActConfig

            try:
                ActConfig(**self.act_config)
            except TypeError as e:
                raise LaggardError(f"act_config: {e}") from None

    @property
    def world_size(self) -> int:
        return self.dp * self.pp

    @classmethod
    def quick(cls, **kw: Any) -> JobConfig:
        """Under a minute on two cores: fewer steps, a smaller model."""
        base = {"steps": 24, "d_model": 96, "seq_len": 96}
        return cls(**{**base, **kw})


@dataclass(kw_only=True, slots=True)
class JobResult:
    ok: bool
    wall_s: float
    ranks: dict[int, dict[str, Any]]  # what each rank's train() returned
    failures: dict[int, str]  # rank -> what went wrong


def load_example(path: Path = EXAMPLE) -> ModuleType:
    """The training script, imported from its file (it is an example, not part of the package)."""
    if not path.exists():
        raise LaggardError(f"{path}: the demo job is missing (run the demo from a laggard checkout)")
    spec = importlib.util.spec_from_file_location("laggard_demo_job", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def shaped_link_rates(cfg: JobConfig) -> dict[tuple[int, int], float]:
    """(src, dst) -> bits/s for each ``slow-link`` with ``shaped=1``: the rate at which one
    microbatch's activations (float32, batch x seq_len x d_model: what each transfer carries) take
    ``delay_ms`` to cross."""
    payload_bits = cfg.batch_size * cfg.seq_len * cfg.d_model * 4 * 8
    return {(int(i["src"]), int(i["dst"])): payload_bits / (max(i["delay_ms"], 0.01) / 1e3)
            for i in cfg.injections if i.cause == "slow-link" and i.params.get("shaped")}


def _worker(rank: int, cfgs: list[JobConfig], port: int, example: str, out: Any, net: Any = None) -> None:
    from datetime import timedelta

    try:
        if net is not None:  # shaped links: this rank's own network namespace, before any socket
            net.enter(rank)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        mod = load_example(Path(example))
        master = net.addr(0) if net is not None else "127.0.0.1"
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                                world_size=cfgs[0].world_size, timeout=timedelta(seconds=cfgs[0].timeout_s))
        try:
            for i, cfg in enumerate(cfgs):

                def report(step: int, loss: float | None, i: int = i, cfg: JobConfig = cfg) -> None:
                    out.put(("step", rank, i, (step, loss)))
                    if cfg.crash_rank == rank and step == cfg.crash_step:
                        os._exit(3)  # a hard crash: no flush, no clean-up (what the tracer must survive)

                out.put(("done", rank, i, mod.train(rank, cfg.world_size, cfg, report=report)))
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group after a peer died
                pass
    except BaseException as e:  # report everything; the parent decides
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
        msg = str(e).split(". This is typically")[0]  # gloo's advice is longer than its news
        out.put(("error", rank, -1, f"{type(e).__name__}: {msg[:300]}{at}"))


def run_job(cfg: JobConfig, *, on_progress: Callable[[int, int, float | None], None] | None = None,
            grace_s: float = 15.0, example: Path = EXAMPLE) -> JobResult:
    """Run the job on ``cfg.world_size`` local processes; ``on_progress(steps_done, steps, loss)``."""
    return run_jobs([cfg], on_progress=on_progress, grace_s=grace_s, example=example)[0]


def run_jobs(cfgs: list[JobConfig], *, on_progress: Callable[[int, int, float | None], None] | None = None,
             grace_s: float = 15.0, example: Path = EXAMPLE) -> list[JobResult]:
    """Run several jobs of one world size one after the other in the same processes (start-up once).

    ``on_progress(steps_done, steps, loss)`` counts over all jobs. A failure ends every job after it.
    """
    if not cfgs or len({c.world_size for c in cfgs}) != 1:
        raise LaggardError("run_jobs: give one or more jobs of the same world size")
    if not example.exists():
        raise LaggardError(f"{example}: the demo job is missing (run the demo from a laggard checkout)")
    rates = shaped_link_rates(cfgs[0])
    if any(shaped_link_rates(c) != rates for c in cfgs):
        raise LaggardError("run_jobs: jobs run in the same processes must shape the same links (shaped=1)")
    if not rates:
        return _run_jobs(cfgs, on_progress, grace_s, example, None)
    from laggard.demo.netshape import shaped_network

    with shaped_network(cfgs[0].world_size, rates) as net:
        return _run_jobs(cfgs, on_progress, grace_s, example, net)


def _run_jobs(cfgs: list[JobConfig], on_progress: Callable[[int, int, float | None], None] | None,
              grace_s: float, example: Path, net: Any) -> list[JobResult]:
    from laggard.collectives.launch import free_port, rank_context

    world = cfgs[0].world_size
    total_steps = sum(c.steps for c in cfgs)
    # a fork server that has imported torch once starts every rank without importing it again
    ctx = rank_context()
    out = ctx.Queue()
    port = free_port()
    t0 = time.perf_counter()
    procs = {r: ctx.Process(target=_worker, args=(r, cfgs, port, str(example), out, net), daemon=True,
                            name=f"laggard-demo-rank{r}") for r in range(world)}
    for p in procs.values():
        p.start()
    results: list[dict[int, dict[str, Any]]] = [{} for _ in cfgs]
    walls = [0.0 for _ in cfgs]
    failures: dict[int, str] = {}
    first_failure: float | None = None
    deadline = t0 + 120 + sum(c.timeout_s + c.steps * 30 for c in cfgs)
    done_steps = 0
    last_t = t0

    def finished(i: int) -> bool:
        return len(results[i]) == world

    try:
        while not finished(len(cfgs) - 1) and len(failures) < world:
            now = time.perf_counter()
            if now > deadline:
                for r in procs:
                    failures.setdefault(r, "timed out")
                break
            if first_failure is not None and now - first_failure > grace_s:
                break
            try:
                kind, rank, i, payload = out.get(timeout=0.5)
            except queue.Empty:
                for r, p in procs.items():
                    if r not in failures and p.exitcode is not None and not all(r in res for res in results):
                        time.sleep(0.2)  # its last message may still be in the pipe
                        if out.empty():
                            failures[r] = f"exited with code {p.exitcode}"
                            first_failure = first_failure or time.perf_counter()
                continue
            if kind == "step":
                if rank == world - 1:  # the last stage knows the loss
                    done_steps += 1
                    if on_progress is not None:
                        on_progress(done_steps, total_steps, payload[1])
            elif kind == "done":
                results[i][rank] = payload
                if finished(i):
                    walls[i] = time.perf_counter() - last_t
                    last_t = time.perf_counter()
            else:
                failures[rank] = payload
                first_failure = first_failure or time.perf_counter()
    finally:
        _stop(procs, failures)
    out_list = []
    for i in range(len(cfgs)):
        ok = finished(i)
        fails = {} if ok else (failures or {r: "did not finish" for r in range(world) if r not in results[i]})
        out_list.append(JobResult(ok=ok, wall_s=walls[i] if ok else time.perf_counter() - last_t,
                                  ranks=results[i], failures=fails))
    return out_list


def _stop(procs: dict[int, Any], failures: dict[int, str]) -> None:
    """Let finished ranks exit; SIGTERM the rest (their tracers flush), then SIGKILL."""
    t_end = time.perf_counter() + (2 if failures else 20)
    for p in procs.values():
        p.join(timeout=max(0.05, t_end - time.perf_counter()))
    alive = [p for p in procs.values() if p.is_alive()]
    for p in alive:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except OSError:
            pass
    t_end = time.perf_counter() + 10
    for p in alive:
        p.join(timeout=max(0.1, t_end - time.perf_counter()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
