"""An independent discrete-event simulator of pipeline-parallel training jobs (SimPy), for ground truth.

It shares no code with laggard's graph, replay, what-if or synthetic generator: it runs the job as
processes (hosts, device streams, launch queues, rendezvous collectives and p2p links, GC pauses,
data stalls, clock skew) and measures the truth of a cause by simulating the job again without it.
SimPy is imported only here (``laggard[sim]``); the analysis stack never imports this package.
"""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

# loaded on first use: `laggard`'s start-up imports this package for its CLI and must stay light
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    **dict.fromkeys(("DIAGNOSIS_CAUSE", "KINDS", "Cause", "parse_cause"), "laggard.groundtruth.dessim.causes"),
    **dict.fromkeys(("SimConfig", "SimOps", "simulate"), "laggard.groundtruth.dessim.engine"),
    **dict.fromkeys(("to_job", "write_kineto"), "laggard.groundtruth.dessim.export"),
    **dict.fromkeys(("CauseTruth", "SimTruth", "simulate_with_truth"), "laggard.groundtruth.dessim.truth"),
})
