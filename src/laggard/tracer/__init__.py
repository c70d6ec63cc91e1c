"""Runtime tracing of training loops into laggard's native format (see ``laggard.tracer.core``).

Importing this package does not import torch; the torch.distributed wrappers import it when used.
"""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "Tracer": "laggard.tracer.core",
    "TracedWork": "laggard.tracer.comm",
    "ClockSync": "laggard.tracer.clock",
    "offsets_from_samples": "laggard.tracer.clock",
    "check_trace": "laggard.optable.tracedir",
})
