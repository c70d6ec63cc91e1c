"""Waiting on a multi-rank job's processes in the tests: for a line one rank prints, or for every rank
to end with its pipes drained at once; a rank that ends in error fails the wait soon rather than after
its peers sit out the gloo timeout."""

from __future__ import annotations

import select
import subprocess
import threading
import time

import pytest


def line_from(procs: list[subprocess.Popen], rank: int, within_s: float = 120.0) -> str:
    """The next line rank ``rank`` prints (stripped; its stdout a text pipe). A rank that ends first fails
    the test at once with its stderr, as does no line within ``within_s``."""
    out = procs[rank].stdout
    assert out is not None, f"rank {rank}'s stdout is not a pipe"
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if select.select([out], [], [], 0.5)[0]:
            return out.readline().strip()
        ended = [(r, p.returncode) for r, p in enumerate(procs) if p.poll() is not None]
        if ended:
            r, code = ended[0]
            err = procs[r].stderr.read()[-3000:] if procs[r].stderr else ""
            pytest.fail(f"rank {r} exited with {code} before rank {rank} printed its line:\n{err}")
    pytest.fail(f"rank {rank} printed no line within {within_s:.0f} s")


def finish_ranks(procs: list[subprocess.Popen], timeout_s: float = 240.0, *,
                 grace_s: float = 30.0) -> list[subprocess.CompletedProcess]:
    """Each rank's ``CompletedProcess`` (stdout, stderr, return code) once every rank has ended.

    A rank that exits non-zero gives the others ``grace_s`` to end by themselves: a job that fails on
    purpose ends every rank, while peers of a rank that died at start-up would wait in the rendezvous
    or a collective. Those still running after the grace are killed (return code -9) and returned, so
    the caller's check on return codes names the rank that failed first. Past ``timeout_s`` every rank
    left is killed and the test fails with each rank's state and the tail of its stderr."""
    outs: list[tuple[str, str] | None] = [None] * len(procs)

    def drain(i: int) -> None:
        outs[i] = procs[i].communicate()

    threads = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(len(procs))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    timed_out = False
    while any(t.is_alive() for t in threads):
        now = time.monotonic()
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + grace_s):
            timed_out = now > deadline
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for t in threads:
                t.join(timeout=30)
            break
        time.sleep(0.1)
    results = [subprocess.CompletedProcess(p.args, p.returncode, *(o or ("", "")))
               for p, o in zip(procs, outs, strict=True)]
    if timed_out:
        tails = "\n".join(f"rank {r} exited {c.returncode}:\n{(c.stderr or '')[-1500:]}" for r, c in enumerate(results))
        pytest.fail(f"the ranks did not all end within {timeout_s:.0f} s; killed the rest:\n{tails}")
    return results


def first_failure(results: list[subprocess.CompletedProcess], rc: int = 0) -> str | None:
    """The first rank whose return code is not ``rc`` and its stderr tail, preferring a rank that ended
    by itself to one the wait killed; ``None`` when every rank returned ``rc``."""
    bad = [(r, c) for r, c in enumerate(results) if c.returncode != rc]
    if not bad:
        return None
    own = [x for x in bad if x[1].returncode != -9] or bad
    r, c = own[0]
    return f"rank {r} exited {c.returncode} (wanted {rc}):\n{(c.stderr or '')[-3000:]}"
