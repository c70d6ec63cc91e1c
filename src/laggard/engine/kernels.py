"""The engine's optional compiled kernels (``_replay.c``, built by setup.py where a C compiler is) and
the switch that turns them off.

Loops that numpy runs one small call at a time, or in a dozen passes over every op, are compiled:
the replay's walk over the graph's segments (``laggard.engine.replay.propagate``), the levelling of
the graph's nodes (``laggard.engine.plan``, Kahn's algorithm: a few numpy calls per level, hundreds of
levels on a pipeline's step) and the gap step's running maxima (``laggard.engine.gaps``). Each has a
numpy twin beside its caller that gives the same result, taken where the extension was not built,
where an older build lacks the kernel, or when ``PURE_PYTHON_ENV`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Callable

try:
    from laggard.engine import _replay
except ImportError:  # not built (no C compiler at install): the numpy twins
    _replay = None

# set to 1 to take the numpy twins even where the compiled kernels were built (a comparison, a kill switch)
PURE_PYTHON_ENV = "LAGGARD_REPLAY_PURE_PYTHON"


def compiled_replay() -> bool:
    """Whether the compiled kernels run (built, and not switched off by ``PURE_PYTHON_ENV``)."""
    return _replay is not None and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0")


def kernel(name: str) -> Callable | None:
    """The compiled kernel ``name`` where it runs (``compiled_replay``; an extension built from an older
    source may lack it), else None: the caller takes its numpy twin."""
    return getattr(_replay, name, None) if compiled_replay() else None
