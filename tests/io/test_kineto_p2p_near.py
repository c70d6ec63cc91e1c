"""Transfers without peers: which of two ranks that pair about as well is the next on the chain
(``laggard.io.kineto.chains._nearest``), on hand-made transfers (the real pipelines are in
test_kineto_pipe4.py and test_kineto_p2p.py)."""

from __future__ import annotations

import numpy as np

from laggard.io.kineto import chains, p2p

MS = 1_000_000


def _side(rank: int, issue_ms: list[float], end_ms: list[float], steps: list[int]) -> p2p._Side:
    n = len(issue_ms)
    return p2p._Side(rank, np.arange(n), np.array(steps), (np.array(issue_ms) * MS).astype(np.int64),
                     (np.array(end_ms) * MS).astype(np.int64), np.full(n, -1), np.zeros(n, np.int8))


def _pipeline(first: int, lag_ms: float, steps: int = 4) -> dict[int, tuple[p2p._Side, p2p._Side]]:
    """A 2-stage pipeline: per step, ``first`` sends activations at 10 ms (received by ``first + 1``, which
    waits from 5 ms) and receives its gradients at 20 ms. ``lag_ms``: how much later the second stage's
    receive ends and how much earlier its send is issued (0 for one pipeline, a skew for its twin)."""
    st = [s for s in range(steps)]
    at = [100 * s for s in st]
    s0 = _side(first, [t + 10 for t in at], [t + 10.02 for t in at], st)
    r0 = _side(first, [t + 15 for t in at], [t + 20.05 for t in at], st)
    s1 = _side(first + 1, [t + 20 - lag_ms for t in at], [t + 20.02 - lag_ms for t in at], st)
    r1 = _side(first + 1, [t + 5 for t in at], [t + 10.05 + lag_ms for t in at], st)
    return {first: (s0, r0), first + 1: (s1, r1)}


def test_two_pipelines_in_lockstep_stay_unmatched_when_one_is_nearer() -> None:
    """Two 2-stage pipelines (0 -> 1, 2 -> 3) in lockstep, the second's stage 1 a little behind: rank 1 is
    the nearer of rank 0's two candidates every time, but rank 3 lies on no chain through rank 1, so the
    two pipelines are not told apart and nothing is matched."""
    pl = p2p.Peerless({**_pipeline(0, 0.0), **_pipeline(2, 0.1)})
    found = chains.find_chains(pl)
    assert found.chains is None and "is not on the same pipeline" in found.why, found.why


def test_one_pipeline_is_matched() -> None:
    found = chains.find_chains(p2p.Peerless(_pipeline(0, 0.0)))
    assert found.chains == [[0, 1]], found.why
