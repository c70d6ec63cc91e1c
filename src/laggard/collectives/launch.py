"""Start ``n`` local processes in a gloo process group on loopback and collect what each returns.

Used by the benchmark, the calibration and the tests. Each worker sets ``torch.set_num_threads(1)``,
joins ``init_process_group("gloo", init_method="tcp://127.0.0.1:PORT")`` on a reserved free port, runs
``fn(rank, world_size, *args)`` and sends back its (picklable) result. A failing worker's traceback is
re-raised in the parent as ``WorkerError``; a hung group is killed after ``timeout_s``.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


class WorkerError(RuntimeError):
    """A worker process raised, died or timed out."""


def free_port() -> int:
    """A loopback port that the kernel hands no other socket for about a minute (TIME_WAIT's length),
    yet that a listener asking for address reuse binds at once, as TCPStore, uvicorn, Python's
    socketserver and Go's net do.

    A port merely bound to 0 and closed goes straight back to the kernel's pool: on a busy host any
    socket opened before rank 0 binds it (a connection's own local port, another ``bind(0)``) may
    take it, and then rank 0 fails while its peers wait out the rendezvous timeout. One connection
    to itself, closed by the accepting side first, leaves the port in TIME_WAIT, and the kernel skips
    such a port when it picks one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = int(srv.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port)):
            conn, _ = srv.accept()
            conn.close()  # the side that closes first keeps the port in TIME_WAIT
    return port


# what ranks import: a fork server that imported them once forks each rank with them loaded
# (spawned, each rank imports torch itself: ~2 s of CPU a rank, 8 ranks on 2 cores ~8 s of waiting).
# One list for every launcher (the demo's training ranks need the optimizers, which load dynamo):
# a process has one fork server, and the preload of its first start holds
RANK_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.optim", "numpy")


def rank_context() -> Any:
    """The multiprocessing context to start ranks with: a fork server preloading ``RANK_PRELOAD``
    where the platform has one, else spawn. Never fork: the caller may have threads (a collector,
    a progress bar)."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(RANK_PRELOAD))
    return ctx


_progress_out: Any = None  # the parent's queue, in a worker process (``report_progress``)


def report_progress(done: int, total: int | None, what: str | None = None) -> None:
    """From rank 0 of ``run_workers``' function: how far it is, and ``what`` it is doing where it
    changes (the parent's ``on_progress(done, total, what)``)."""
    if _progress_out is not None:
        _progress_out.put((0, None, (done, total, what)))


def _worker(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, out: Any) -> None:
    global _progress_out
    _progress_out = out if rank == 0 else None
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        out.put((rank, True, result))
    except BaseException:  # report everything, the parent decides
        out.put((rank, False, traceback.format_exc()))


def run_workers(fn: Callable[..., Any], num_ranks: int, *args: Any, timeout_s: float = 300.0,
                on_progress: Callable[[int, int | None, str | None], None] | None = None) -> list[Any]:
    """Run ``fn(rank, num_ranks, *args)`` on ``num_ranks`` new processes (``rank_context``); results
    by rank. ``on_progress(done, total, what)`` gets what rank 0 reports with ``report_progress``."""
    ctx = rank_context()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(fn, r, num_ranks, port, args, out), daemon=True)
             for r in range(num_ranks)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(errors) < num_ranks:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"workers timed out after {timeout_s:.0f} s "
                                  f"({len(results)} of {num_ranks} finished)")
            try:
                rank, ok, value = out.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and not errors:
                    time.sleep(0.5)  # let a dying worker's report arrive first
                    if out.empty():
                        raise WorkerError(f"worker exited with code {dead[0].exitcode}") from None
                continue
            if ok is None:  # progress, not a result
                if on_progress is not None:
                    on_progress(*value)
                continue
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
                break  # the others may hang waiting for this one
        if errors:
            raise WorkerError("\n".join(errors))
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [results[r] for r in range(num_ranks)]
