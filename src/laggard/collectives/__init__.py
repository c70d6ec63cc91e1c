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

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "stragglar_allreduce": "laggard.collectives.stragglar",
    "ring_allreduce": "laggard.collectives.ring",
    "AdaptiveAllReduce": "laggard.collectives.adaptive",
})
