"""Straggler-aware collectives: StragglAR AllReduce, its schedules, verifier, cost models and benchmarks.

Modules (torch is imported only by the ones that talk between ranks):

* ``schedule`` / ``verify`` / ``cost`` / ``predict`` / ``sim``: pure numpy (schedule synthesis, exact
  verifier, alpha-beta models and break-even delay, straggler prediction, large-n simulation);
* ``stragglar``, ``ring``, ``p2p``, ``adaptive``, ``calibrate``: over ``torch.distributed``;
* ``launch`` / ``bench``: local multi-process runs on gloo; ``cli``: ``laggard collectives`` and
  ``laggard bench allreduce``.

``stragglar_allreduce``, ``ring_allreduce`` and ``AdaptiveAllReduce`` are importable from here; torch
is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AdaptiveAllReduce", "ring_allreduce", "stragglar_allreduce"]


def __getattr__(name: str) -> Any:
    if name == "stragglar_allreduce":
        from laggard.collectives.stragglar import stragglar_allreduce

        return stragglar_allreduce
    if name == "ring_allreduce":
        from laggard.collectives.ring import ring_allreduce

        return ring_allreduce
    if name == "AdaptiveAllReduce":
        from laggard.collectives.adaptive import AdaptiveAllReduce

        return AdaptiveAllReduce
    raise AttributeError(f"module 'laggard.collectives' has no attribute {name!r}")
