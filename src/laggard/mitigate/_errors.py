"""Small helpers for ``laggard.mitigate``'s user errors and warnings.

The classes live in ``laggard.errors`` (no dependencies, cheap to import from a training loop); these
helpers only spell ``laggard.mitigate``'s checks and warnings once.
"""

from __future__ import annotations

import warnings

import numpy as np

from laggard.errors import LaggardError, LaggardWarning


def error(msg: str) -> LaggardError:
    """A ``laggard.errors.LaggardError`` with ``msg`` (raise it: ``raise error("...")``)."""
    return LaggardError(msg)


def warn(msg: str, *, stacklevel: int = 3) -> None:
    """Issue ``msg`` as a ``laggard.errors.LaggardWarning`` (by default, at the caller's caller)."""
    warnings.warn(msg, LaggardWarning, stacklevel=stacklevel)


def check_positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise error(f"{what} must be a positive integer, got {value!r}")
    return int(value)
