"""Tiny real gloo jobs that hang, desync, straggle or lose a rank, with Flight Recorder dumps.

    python examples/flight_jobs.py OUT [SCENARIO ...]       # default: every scenario

Each scenario is a real job: N processes (forked from this one after torch is imported, so torch
is imported once) on loopback, traced by ``laggard.tracer.Tracer`` with the Flight Recorder on and
a 1 s step watchdog, gloo timing out after 3 s. The trace and the dumps go to OUT/SCENARIO/trace/
and what was done to the job to OUT/SCENARIO/truth.json (the label the tests and the benchmark
check laggard's verdict against). Used by tests/test_hang.py and benchmarks/bench_hang.py.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

GLOO_TIMEOUT_S = 3.0  # the waiting ranks give up after this (a real job: 30 min)
WATCHDOG_S = 1.0  # the tracer dumps the Flight Recorder when a step runs longer than this
NUM_STEPS = 5
BAD_STEP = 2  # the step in which the culprit misbehaves
BUFFER_ENTRIES = 64  # Flight Recorder ring buffer; small enough that the bench can cut it further

# name -> (world size, culprit ranks, verdict, the culprit's group (ranks) or None, op)
SCENARIOS: dict[str, tuple[int, list[int], str, list[int] | None, str | None]] = {
    "healthy": (4, [], "healthy", None, None),
    "late": (4, [2], "straggling", None, None),
    "skip": (4, [1], "hang", [0, 1, 2, 3], "all_reduce"),
    "size": (4, [3], "desync", [0, 1, 2, 3], "all_reduce"),
    "stuck": (4, [2], "hang", [0, 1, 2, 3], "all_reduce"),
    "killed": (4, [3], "missing-ranks", None, None),
    "pp": (3, [1], "hang", None, None),
    "dppp": (4, [3], "hang", [1, 3], "all_reduce"),
}


def _rank_main(scenario: str, rank: int, world: int, port: int, trace: Path) -> None:
    import torch
    import torch.distributed as dist

    from laggard.tracer import Tracer
    from laggard.tracer.flight import enable

    enable(BUFFER_ENTRIES)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    culprits = SCENARIOS[scenario][1]
    bad = rank in culprits
    groups: dict[str, object] = {}
    pp_size = 2 if scenario == "dppp" else (world if scenario == "pp" else 1)
    if scenario == "dppp":
        pp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        groups = {"pp": pp_groups[rank // 2], "dp": dp_groups[rank % 2]}
    tracer = Tracer(trace, dp_rank=rank // pp_size, pp_rank=rank % pp_size, align=None, flight_watchdog_s=WATCHDOG_S,
                    handle_signals=False)
    step_fn = _STEPS.get(scenario, _dp_step)
    try:
        for step in range(NUM_STEPS):
            with tracer.step(step):
                step_fn(tracer, torch, rank, world, pp_size, step, bad and step == BAD_STEP, bad, groups, scenario)
    except RuntimeError:  # gloo gave up waiting (the timeout) or a peer died
        if tracer._flight is not None and tracer._flight.num_dumps == 0:  # noqa: SLF001
            tracer._flight.dump("error")  # noqa: SLF001
        tracer.close("failed: RuntimeError")
        _linger(dist, rank, world)
        os._exit(1)
    if tracer._flight is not None:  # noqa: SLF001
        tracer._flight.dump("end")  # noqa: SLF001
    tracer.close()
    _linger(dist, rank, world)
    os._exit(0)


def _linger(dist, rank: int, world: int) -> None:
    """Stay up until every rank is done (or has had time to give up): an early exit would wake the
    ranks still waiting (a closed connection) before their own timeout, and rank 0 holds the store."""
    try:
        store = dist.distributed_c10d._get_default_store()  # noqa: SLF001
        store.set(f"flight-jobs/done/{rank}", "1")
        store.wait([f"flight-jobs/done/{r}" for r in range(world)], datetime.timedelta(seconds=GLOO_TIMEOUT_S + 1.5))
    except (RuntimeError, AttributeError, ValueError):
        time.sleep(GLOO_TIMEOUT_S + 1.0)


def _compute(tracer, torch, secs: float = 0.0) -> None:
    with tracer.op("forward-compute"):
        x = torch.ones(16, 16)
        (x @ x).sum()
        if secs:
            time.sleep(secs)


def _dp_step(tracer, torch, rank, world, pp_size, step, now_bad, bad, groups, scenario) -> None:
    if scenario == "late" and bad:
        _compute(tracer, torch, 0.25)
    elif scenario == "stuck" and now_bad:
        _compute(tracer, torch, GLOO_TIMEOUT_S + 1.0)
    elif scenario == "killed" and now_bad:
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        _compute(tracer, torch)
    if scenario == "skip" and now_bad:
        return
    size = 16 if scenario == "size" and now_bad else 8
    tracer.all_reduce(torch.ones(size), name="grads-all-reduce")


def _pp_step(tracer, torch, rank, world, pp_size, step, now_bad, bad, groups, scenario) -> None:
    act = torch.ones(4)
    if rank > 0:
        tracer.recv(act, rank - 1, name="recv-forward")
    _compute(tracer, torch)
    if rank < world - 1 and not now_bad:
        tracer.send(act, rank + 1, name="send-forward")
    tracer.all_reduce(torch.ones(1), name="loss-all-reduce")


def _dppp_step(tracer, torch, rank, world, pp_size, step, now_bad, bad, groups, scenario) -> None:
    act = torch.ones(4)
    if rank % pp_size == 0:
        _compute(tracer, torch)
        tracer.send(act, rank + 1, name="send-forward")
    else:
        tracer.recv(act, rank - 1, name="recv-forward")
        _compute(tracer, torch)
    if not now_bad:
        tracer.all_reduce(torch.ones(8), group=groups["dp"], name="grads-all-reduce")
    tracer.all_reduce(torch.ones(1), name="loss-all-reduce")


_STEPS: dict[str, Callable[..., None]] = {"pp": _pp_step, "dppp": _dppp_step}


def generate(out: Path, scenarios: list[str], deadline_s: float = 60.0,
             on_progress: Callable[[int, int], None] | None = None) -> dict[str, Path]:
    """Run the scenarios (all at once: the ranks mostly wait) and return scenario -> its directory.
    ``on_progress(ranks_ended, ranks)`` as the rank processes end (or are killed at the deadline)."""
    # imported once here, before forking the ranks (each of ~30 ranks importing them itself: seconds of CPU)
    import pyarrow.parquet  # noqa: F401 - the tracer writes its shards with it
    import torch  # noqa: F401
    import torch._inductor  # noqa: F401 - a dump with Python stacks imports it (~2.4 s of CPU a process)
    import torch.distributed  # noqa: F401

    from laggard.collectives.launch import free_port
    from laggard.tracer import Tracer  # noqa: F401 - and laggard.tracer.flight with it

    out.mkdir(parents=True, exist_ok=True)
    pids: list[int] = []
    dirs: dict[str, Path] = {}
    ports = [free_port() for _ in scenarios]  # each held in TIME_WAIT: distinct
    for name, port in zip(scenarios, ports, strict=True):
        world, culprits, verdict, group, op = SCENARIOS[name]
        d = out / name
        trace = d / "trace"
        trace.mkdir(parents=True, exist_ok=True)
        (d / "truth.json").write_text(json.dumps({"scenario": name, "world_size": world, "verdict": verdict,
                                                  "culprit_ranks": culprits, "group_ranks": group, "op": op}))
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                try:
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, 2) if not os.environ.get("FJ_STDERR") else None
                    _rank_main(name, rank, world, port, trace)
                finally:
                    os._exit(3)
            pids.append(pid)
        dirs[name] = d
    end = time.monotonic() + deadline_s
    left = list(pids)
    while left:  # every rank, whichever ends first, so the progress moves as they end
        if on_progress is not None:
            on_progress(len(pids) - len(left), len(pids))
        for pid in list(left):
            if os.waitpid(pid, os.WNOHANG)[0]:
                left.remove(pid)
        if left and time.monotonic() > end:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            left = []
        time.sleep(0.05)
    if on_progress is not None:
        on_progress(len(pids), len(pids))
    return dirs


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    names = argv[1:] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("hanging jobs: rank processes ended"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("ranks", total=None)
        dirs = generate(Path(argv[0]), names, on_progress=lambda done, total: bar.update(task, completed=done,
                                                                                         total=total))
    for name, d in dirs.items():
        print(f"{name}: {d}  (laggard hang {d / 'trace'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
