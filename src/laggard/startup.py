"""Process start-up settings for laggard's own processes (the CLI, fleet pool workers).

pyarrow imports pandas (~0.4-1 s of CPU) on its first array construction just to check whether an
object is a pandas Series; laggard never uses pandas, so its processes hide it unless something
already imported it. The analysis does no linear algebra worth threads: OpenBLAS's thread pool
(~70 ms of numpy's import) is not started unless the user asked for it.
"""

from __future__ import annotations

import os
import sys


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
