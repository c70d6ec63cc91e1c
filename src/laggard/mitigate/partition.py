"""Cost-aware pipeline partitioning: contiguous layers into stages, minimising the most expensive stage.

Splitting layers evenly by count leaves the stage holding the logits and the loss (often many times
a transformer layer) as the bottleneck of every microbatch. ``partition_stages`` finds the exact
optimum of the contiguous min-max split:

    best[p][i] = min over j of max(best[p-1][j], S[i] - S[j])      (S: prefix sums of layer costs)

``best[p-1][j] + S[j]`` is non-decreasing in j and ``S[i] - S[j]`` is non-increasing, so the
minimum sits where the two cross: one ``searchsorted`` per stage finds it for every i at once
(O(P n log n), vectorised; thousands of layers in milliseconds). Among optimal splits it returns the
one whose stages end as late as possible, then ``megatron_layout`` writes it as a Megatron
``--pipeline-model-parallel-layout`` string.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from laggard.mitigate._errors import check_positive_int, error

# layer kinds for the Megatron layout string
LAYER_SYMBOLS = {"embedding": "E", "decoder": "t", "loss": "L", "mtp": "m", "E": "E", "t": "t", "L": "L", "m": "m"}


@dataclass(kw_only=True, slots=True)
class StageSplit:
    """A contiguous split of layers into pipeline stages."""

    counts: list[int]  # layers per stage
    split_points: list[int]  # index of the first layer of stages 1..P-1
    stage_costs: np.ndarray
    layout: str  # Megatron --pipeline-model-parallel-layout

    @property
    def max_cost(self) -> float:
        return float(self.stage_costs.max())

    @property
    def imbalance(self) -> float:
        mean = float(self.stage_costs.mean())
        return self.max_cost / mean if mean > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"counts": self.counts, "split_points": self.split_points, "stage_costs": self.stage_costs.tolist(),
                "max_cost": self.max_cost, "imbalance": self.imbalance, "layout": self.layout}


def _check_costs(layer_costs: Any, num_stages: int) -> tuple[np.ndarray, int]:
    c = np.asarray(layer_costs, dtype=np.float64)
    if c.ndim != 1 or len(c) == 0:
        raise error("layer_costs must be a non-empty flat sequence of numbers")
    if not np.isfinite(c).all() or (c < 0).any():
        raise error("layer_costs must be finite and >= 0")
    p = check_positive_int(num_stages, "num_stages")
    if p > len(c):
        raise error(f"num_stages={p} is more than the {len(c)} layers")
    return c, p


def _optimal_counts(c: np.ndarray, p: int) -> list[int]:
    n = len(c)
    s = np.concatenate([[0.0], np.cumsum(c)])
    idx = np.arange(n + 1)
    # best[i]: optimal max over the first i layers in the current number of stages (inf: infeasible)
    best = np.where(idx >= 1, s, np.inf)
    best[0] = np.inf
    choice = np.zeros((p, n + 1), dtype=np.int64)
    for q in range(2, p + 1):
        prev = best
        g = prev + s  # non-decreasing in j from j = q-1 on (fewer layers than stages: infeasible)
        g[: q - 1] = -np.inf  # keeps g sorted; those j are clipped away below
        i = idx[q:]
        j = np.searchsorted(g, s[i], side="left")
        lo, hi = q - 1, i - 1
        j1 = np.clip(j, lo, hi)
        j0 = np.clip(j - 1, lo, hi)
        v1 = np.maximum(prev[j1], s[i] - s[j1])
        v0 = np.maximum(prev[j0], s[i] - s[j0])
        take1 = v1 <= v0  # ties: the later split point
        new = np.full(n + 1, np.inf)
        new[i] = np.where(take1, v1, v0)
        choice[q - 1, i] = np.where(take1, j1, j0)
        best = new
    counts = []
    end = n
    for q in range(p, 1, -1):
        j = int(choice[q - 1, end])
        counts.append(end - j)
        end = j
    counts.append(end)
    return counts[::-1]


def partition_stages(layer_costs: Sequence[float] | np.ndarray, num_stages: int) -> list[int]:
    """Layers per stage of the contiguous split that minimises the most expensive stage (exact).

    Every stage gets at least one layer. ``layer_costs`` include the embedding and the loss as layers
    of their own when they cost something (see ``layer_costs_from_stages``).
    """
    c, p = _check_costs(layer_costs, num_stages)
    return _optimal_counts(c, p)


def stage_costs(layer_costs: Any, counts: Sequence[int]) -> np.ndarray:
    """Cost of each stage of a split (sums of its layers)."""
    c = np.asarray(layer_costs, dtype=np.float64)
    k = np.asarray(counts, dtype=np.int64)
    if k.sum() != len(c) or (k < 0).any():
        raise error(f"counts {list(counts)} do not add up to the {len(c)} layers")
    bounds = np.concatenate([[0], np.cumsum(k)])
    return np.array([math.fsum(c[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])


def megatron_layout(counts: Sequence[int], layer_kinds: Sequence[str] | None = None) -> str:
    """The split as a Megatron ``--pipeline-model-parallel-layout`` string (``|`` between stages,
    ``t*N`` for runs, ``(...|)*N`` for repeated stages). ``layer_kinds``: one of embedding/decoder/loss
    (or E/t/L/m) per layer; default all decoder layers."""
    total = int(sum(counts))
    kinds = ["t"] * total if layer_kinds is None else [LAYER_SYMBOLS.get(k, "") for k in layer_kinds]
    if len(kinds) != total:
        raise error(f"layer_kinds has {len(kinds)} entries for {total} layers")
    if "" in kinds:
        bad = next(k for k in layer_kinds or [] if k not in LAYER_SYMBOLS)
        raise error(f"layer kind {bad!r} not known (use embedding, decoder, loss, mtp or E, t, L, m)")
    stages = []
    pos = 0
    for n in counts:
        syms = kinds[pos : pos + n]
        pos += n
        text = ""
        i = 0
        while i < len(syms):
            j = i
            while j < len(syms) and syms[j] == syms[i]:
                j += 1
            if text and text[-1].isdigit():  # "t*3,L": a comma after a repeat count
                text += ","
            text += syms[i] if j - i == 1 else f"{syms[i]}*{j - i}"
            i = j
        stages.append(text)
    # repeats of identical stages as (s|)*N; the last stage is always written out
    parts: list[str] = []
    i = 0
    last = len(stages) - 1
    while i <= last:
        j = i
        while j + 1 < last and stages[j + 1] == stages[i]:
            j += 1
        reps = j - i + 1
        if i == last:
            piece = stages[i]
        elif reps >= 3 and stages[i]:
            piece = f"({stages[i]}|)*{reps}"
        else:
            piece = "".join(st + "|" for st in stages[i : j + 1])
        if parts and parts[-1][-1].isdigit() and piece and piece[0] not in "|":
            parts.append(",")
        parts.append(piece)
        i = j + 1
    return "".join(parts)


def split_stages(layer_costs: Sequence[float] | np.ndarray, num_stages: int, *,
                 layer_kinds: Sequence[str] | None = None) -> StageSplit:
    """``partition_stages`` with everything around it: split points, stage costs, Megatron layout."""
    counts = partition_stages(layer_costs, num_stages)
    return describe_split(layer_costs, counts, layer_kinds=layer_kinds)


def describe_split(layer_costs: Any, counts: Sequence[int], *, layer_kinds: Sequence[str] | None = None
                   ) -> StageSplit:
    """A given split (e.g. the current even one) as a ``StageSplit``."""
    counts = [int(x) for x in counts]
    return StageSplit(counts=counts, split_points=np.cumsum(counts)[:-1].tolist(),
                      stage_costs=stage_costs(layer_costs, counts), layout=megatron_layout(counts, layer_kinds))


def even_counts(num_layers: int, num_stages: int) -> list[int]:
    """Layers per stage when split evenly by count (the first stages take the remainder)."""
    q, r = divmod(num_layers, num_stages)
    return [q + (1 if s < r else 0) for s in range(num_stages)]


def layer_costs_from_stages(stage_costs: Sequence[float], decoder_layers_per_stage: Sequence[int], *,
                            embedding: bool = True, loss: bool = True) -> tuple[np.ndarray, list[str]]:
    """Per-layer costs from measured per-stage costs, as ``[embedding], decoder..., [loss]``.

    Decoder layers are taken to cost the same everywhere: the mean per layer of the middle stages
    (or, with two stages or fewer, of the stage with the smallest cost per layer). What the first
    stage costs beyond its decoder layers is the embedding, what the last costs beyond them is the
    output layer and the loss (both clipped at 0). Returns the costs and the layer kinds.
    """
    c = np.asarray(stage_costs, dtype=np.float64)
    n = np.asarray(decoder_layers_per_stage, dtype=np.int64)
    if c.ndim != 1 or len(c) == 0 or n.shape != c.shape:
        raise error(f"{len(c)} stage costs but {len(n)} layer counts")
    if (n < 1).any():
        raise error("every stage must hold at least one decoder layer")
    if not np.isfinite(c).all() or (c < 0).any():
        raise error("stage costs must be finite and >= 0")
    p = len(c)
    if p >= 3:
        per_layer = float(c[1:-1].sum() / n[1:-1].sum())
    else:
        per_layer = float((c / n).min())
    costs = [float(per_layer)] * int(n.sum())
    kinds = ["decoder"] * int(n.sum())
    if embedding:
        costs.insert(0, max(0.0, float(c[0] - n[0] * per_layer)))
        kinds.insert(0, "embedding")
    if loss:
        costs.append(max(0.0, float(c[-1] - n[-1] * per_layer)))
        kinds.append("loss")
    return np.array(costs), kinds


__all__ = ["StageSplit", "describe_split", "even_counts", "layer_costs_from_stages", "megatron_layout",
           "partition_stages", "split_stages", "stage_costs"]
