"""The per-rank files of a PyTorch-profiler (Kineto) trace: which files a directory, glob or list
names (``trace_files``), and decoding them, in worker processes when it pays (``decode_all``).

The workers only decode (``laggard.io.kineto.decode.decode_file``: msgspec into compact columns;
the decoder needs neither numpy nor pyarrow); each rank's ops are built in the parent as its columns
arrive (``kineto_rank.rank_ops``), while the workers go on with the other files; raw events never
leave the worker that decoded them.
"""

from __future__ import annotations

import glob as globmod
import os
import sys
import types
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError, LaggardWarning
from laggard.io.kineto.rank import RankOps, decode_rank, rank_ops

_SUFFIXES = (".json", ".json.gz")
# decode in worker processes when there is more than this much compressed input
_PARALLEL_MIN_BYTES = 16 * 2**20


def looks_like_kineto(path: Path) -> bool:
    from laggard.io.kineto.decode import peek

    head = peek(path)
    return any(k in head for k in (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"'))


def trace_files(spec: str | Path | Sequence[str | Path]) -> list[Path]:
    """The per-rank files named by a directory, a glob, a file or a list of those."""
    items = [spec] if isinstance(spec, str | Path) else list(spec)
    out: list[Path] = []
    for item in items:
        s = str(item)
        p = Path(s)
        if any(ch in s for ch in "*?[") and not p.exists():
            found = sorted(Path(x) for x in globmod.glob(s) if Path(x).is_file())
            if not found:
                raise LaggardError(f"{s}: no file matches this pattern")
            out.extend(found)
        elif p.is_dir():
            found = sorted(x for x in p.iterdir() if x.is_file() and x.name.endswith(_SUFFIXES))
            traces = [x for x in found if looks_like_kineto(x) or x.stat().st_size == 0]
            if len(traces) < len(found):
                skipped = [x.name for x in found if x not in traces]
                warnings.warn(
                    f"{p}: skipped {len(skipped)} JSON file(s) that are not profiler traces: {', '.join(skipped[:5])}",
                    LaggardWarning,
                    stacklevel=3,
                )
            if not traces:
                raise LaggardError(f"{p}: no PyTorch profiler trace (*.json, *.json.gz) in this directory")
            out.extend(traces)
        elif p.exists():
            out.append(p)
        else:
            raise LaggardError(f"{p}: no such file or directory")
    seen: set[Path] = set()
    uniq = []
    for p in out:
        r = p.resolve()
        if r not in seen:
            seen.add(r)
            uniq.append(p)
    return uniq


def decode_all(files: list[Path], *, workers: int | None = None) -> list[RankOps]:
    """Decode every file, in parallel worker processes when it pays (one rank per task).

    The workers only decode (msgspec into array columns; see ``_worker_context`` for how they
    start); each rank's ops are built here as its columns arrive, while the workers go on with
    the other files.
    """
    total = sum(f.stat().st_size for f in files)
    n = min(len(files), workers if workers is not None else _available_cpus())
    if n <= 1 or (workers is None and total < _PARALLEL_MIN_BYTES):
        return [decode_rank(str(f)) for f in files]
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from laggard.io.kineto.decode import decode_file

    ctx = _worker_context(mp)
    out: list[RankOps | None] = [None] * len(files)
    errors: dict[int, Exception] = {}
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        with _main_hidden():  # the executor starts its worker processes in these submits
            pending = {pool.submit(decode_file, str(f)): i for i, f in enumerate(files)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    out[i] = rank_ops(fut.result(), in_worker=True)
                except Exception as e:  # reported below, for the first bad file as in a serial run
                    errors[i] = e
    if errors:
        raise errors[min(errors)]
    return out  # type: ignore[return-value]


def _worker_context(mp: Any) -> Any:
    """How decode workers start: forked from this process when that is safe, else from a server.

    A fork costs next to nothing and the worker has the decoder already imported, but it is only
    safe while this process runs a single OS thread (a thread holding a lock at the fork would
    leave it locked in the child; pyarrow, for one, starts a thread when imported, so Kineto
    loading keeps it out until the ranks are decoded). Otherwise the workers are forked from a
    fresh single-threaded server with only the decoder imported (msgspec): two more interpreters
    (the server and multiprocessing's resource tracker), ~0.2 CPU-s.
    """
    methods = mp.get_all_start_methods()
    if sys.platform == "linux" and "fork" in methods and _os_threads() == 1:
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["laggard.io.kineto.decode"])
        return ctx
    return mp.get_context("spawn")


def _os_threads() -> int:
    """OS threads of this process (native ones included, which ``threading`` does not see)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # unknown: not safe to fork


def _available_cpus() -> int:
    """CPUs this process may run on (its affinity mask: taskset, cgroup cpusets), else all."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextmanager
def _main_hidden() -> Iterator[None]:
    """Start worker processes without re-running the caller's ``__main__`` in each of them.

    multiprocessing re-imports the main script in every worker it starts (for ``laggard`` that is
    the CLI: typer, pyarrow, ~0.3 CPU-s per worker; for a script without a ``__main__`` guard, a
    crash). The workers run only this package's code, so they are given an empty main module.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main
        else:
            del sys.modules["__main__"]


__all__ = ["decode_all", "looks_like_kineto", "trace_files"]
