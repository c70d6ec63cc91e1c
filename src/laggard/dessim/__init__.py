"""An independent discrete-event simulator of pipeline-parallel training jobs (SimPy), for ground truth.

It shares no code with laggard's graph, replay, what-if or synthetic generator: it runs the job as
processes (hosts, device streams, launch queues, rendezvous collectives and p2p links, GC pauses,
data stalls, clock skew) and measures the truth of a cause by simulating the job again without it.
SimPy is imported only here (``laggard[sim]``); the analysis stack never imports this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laggard.dessim.causes import DIAGNOSIS_CAUSE, KINDS, Cause, parse_cause
    from laggard.dessim.engine import SimConfig, SimOps, simulate
    from laggard.dessim.export import to_job, write_kineto
    from laggard.dessim.truth import CauseTruth, SimTruth, simulate_with_truth

# loaded on first use: `laggard`'s start-up imports this package for its CLI and must stay light
_LAZY = {
    **dict.fromkeys(("DIAGNOSIS_CAUSE", "KINDS", "Cause", "parse_cause"), "laggard.dessim.causes"),
    **dict.fromkeys(("SimConfig", "SimOps", "simulate"), "laggard.dessim.engine"),
    **dict.fromkeys(("to_job", "write_kineto"), "laggard.dessim.export"),
    **dict.fromkeys(("CauseTruth", "SimTruth", "simulate_with_truth"), "laggard.dessim.truth"),
}
__all__ = ["DIAGNOSIS_CAUSE", "KINDS", "Cause", "CauseTruth", "SimConfig", "SimOps", "SimTruth", "parse_cause",
           "simulate", "simulate_with_truth", "to_job", "write_kineto"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
