"""Shapley values of a small cooperative game whose value is known for every subset of players.

One definition for every joint attribution in laggard: the diagnosis shares a slowdown among
candidate fixes (``laggard.diagnose.explain``) and ``laggard diff`` shares the change between two
runs among the parts that changed (``laggard.whatif.diff``). Players are bit positions; ``v`` is
indexed by the bitmask of a subset (``v[0]``: the empty set).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def shapley(v: Sequence[float], alive: list[int]) -> dict[int, float]:
    """Shapley value of each player in ``alive`` for the game ``v[bitmask]`` restricted to them
    (the values add up to ``v[all alive] - v[0]``)."""
    n = len(alive)
    out = {}
    for i in alive:
        others = [j for j in alive if j != i]
        phi = 0.0
        for k in range(1 << len(others)):
            s = sum(1 << others[b] for b in range(len(others)) if k >> b & 1)
            size = bin(k).count("1")
            phi += math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n) * (v[s | 1 << i] - v[s])
        out[i] = phi
    return out


__all__ = ["shapley"]
