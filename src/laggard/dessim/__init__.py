"""An independent discrete-event simulator of pipeline-parallel training jobs (SimPy), for ground truth.

It shares no code with laggard's graph, replay, what-if or synthetic generator: it runs the job as
processes (hosts, device streams, launch queues, rendezvous collectives and p2p links, GC pauses,
data stalls, clock skew) and measures the truth of a cause by simulating the job again without it.
SimPy is imported only here (``laggard[sim]``); the analysis stack never imports this package.
"""

from __future__ import annotations

from laggard.dessim.causes import DIAGNOSIS_CAUSE, KINDS, Cause, parse_cause
from laggard.dessim.engine import SimConfig, SimOps, simulate
from laggard.dessim.export import to_job, write_kineto
from laggard.dessim.truth import CauseTruth, SimTruth, simulate_with_truth

__all__ = ["DIAGNOSIS_CAUSE", "KINDS", "Cause", "CauseTruth", "SimConfig", "SimOps", "SimTruth", "parse_cause",
           "simulate", "simulate_with_truth", "to_job", "write_kineto"]
