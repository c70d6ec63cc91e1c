"""Runtime tracing of training loops into laggard's native format (see ``laggard.tracer.core``).

Importing this package does not import torch; the torch.distributed wrappers import it when used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ClockSync", "Tracer", "TracedWork", "check_trace", "offsets_from_samples"]

_EXPORTS = {
    "Tracer": "laggard.tracer.core",
    "TracedWork": "laggard.tracer.comm",
    "ClockSync": "laggard.tracer.clock",
    "offsets_from_samples": "laggard.tracer.clock",
    "check_trace": "laggard.tracer.state",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'laggard.tracer' has no attribute {name!r}")
