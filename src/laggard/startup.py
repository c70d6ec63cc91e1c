"""Process start-up settings for laggard's own processes (the CLI, fleet pool workers).

pyarrow imports pandas (~0.4-1 s of CPU) on its first array construction just to check whether an
object is a pandas Series; laggard never uses pandas, so its processes hide it unless something
already imported it. The analysis does no linear algebra worth threads: OpenBLAS's thread pool
(~70 ms of numpy's import) is not started unless the user asked for it. A finished command ends
without the interpreter's teardown (``exit_now``).

Memory (``reuse_memory``): the analysis allocates and frees arrays of every op (60 MB each at 4,096
workers) hundreds of times. By default glibc maps each one fresh and unmaps it when freed, and numpy
asks for transparent huge pages on each: every array is faulted in (and zeroed) again, and with THP
in ``madvise`` mode a fault may wait for the kernel to compact memory. Measured on a 2-core VM,
`laggard analyze` of 4,096 workers (7.7M ops, 3 runs each): 11.4-16.5 s with 4.5-10.5 s of system
time by default, 8.2-8.6 s with 1.1-1.3 s once freed memory is kept and reused and numpy's
huge-page advice is off (peak RSS 2.75 -> 2.84 GiB).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


class _HidePandas:
    """A meta-path finder that makes `import pandas` fail as if pandas were not installed."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def hide_pandas() -> None:
    if "pandas" not in sys.modules and not any(isinstance(f, _HidePandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _HidePandas())


# the environment variables through which a user tunes glibc's malloc themselves
_USER_MALLOC = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                "GLIBC_TUNABLES")


def reuse_memory() -> None:
    """Keep freed memory for the next array instead of returning it to the kernel (glibc: no mmap'd
    chunks, no trimming under 2 GiB free at the heap's top) and no huge-page advice from numpy (read
    when numpy is imported; the user's own NUMPY_MADVISE_HUGEPAGE wins, and so do their own malloc
    settings: with any of ``_USER_MALLOC`` in the environment mallopt is left alone). A no-op where
    libc has no ``mallopt`` (musl, macOS)."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    if not sys.platform.startswith("linux") or any(v in os.environ for v in _USER_MALLOC):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    mallopt(m_mmap_max, 0)
    mallopt(m_trim_threshold, 2**31 - 1)


def lean_process() -> None:
    """The settings above; call before numpy/pyarrow are imported for OpenBLAS and numpy's to count."""
    hide_pandas()
    # the user's own setting wins
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    reuse_memory()


def exit_now(code: int) -> NoReturn:
    """End the process once its command has finished, without the interpreter's teardown: freeing
    every module and object one by one costs a `laggard analyze` 40-80 ms of CPU (numpy, pyarrow,
    typer and the analysis' arrays), twice what a process that only imports numpy and pyarrow pays.
    What an ordinary exit does that matters still happens, in its order: ``atexit`` handlers (logging,
    temporary directories, multiprocessing's children, coverage), then the standard streams are
    flushed. A thread still running, or streams that cannot be flushed (a closed pipe), take the
    ordinary exit, which waits for the thread or reports the stream as before."""
    import atexit
    import threading

    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)
