"""User errors and warnings for ``laggard.mitigate`` without loading the analysis stack at import.

``laggard.optable.ops`` (where ``LaggardError`` and ``LaggardWarning`` live) imports pyarrow; a training loop
that only balances batches should not pay for that. The classes are imported on first use.
"""

from __future__ import annotations

import warnings

import numpy as np


def error(msg: str) -> Exception:
    """A ``laggard.optable.ops.LaggardError`` with ``msg`` (raise it: ``raise error("...")``)."""
    from laggard.optable.ops import LaggardError

    return LaggardError(msg)


def warn(msg: str, *, stacklevel: int = 3) -> None:
    """Issue ``msg`` as a ``laggard.optable.ops.LaggardWarning``."""
    from laggard.optable.ops import LaggardWarning

    warnings.warn(msg, LaggardWarning, stacklevel=stacklevel)


def check_positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise error(f"{what} must be a positive integer, got {value!r}")
    return int(value)
