"""Process start-up settings for laggard's own processes (the CLI, fleet pool workers).

pyarrow imports pandas (~0.4-1 s of CPU) on its first array construction just to check whether an
object is a pandas Series; laggard never uses pandas, so its processes hide it unless something
already imported it. The analysis does no linear algebra worth threads: OpenBLAS's thread pool
(~70 ms of numpy's import) is not started unless the user asked for it. A finished command ends
without the interpreter's teardown (``exit_now``).
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


def lean_process() -> None:
    """Both settings; call before numpy/pyarrow are imported for the OpenBLAS one to count."""
    hide_pandas()
    # the user's own setting wins
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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
