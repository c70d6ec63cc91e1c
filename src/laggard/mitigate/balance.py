"""Sequence balancing: documents into DP ranks x microbatches so every bin costs about the same.

A microbatch's time grows with the sum of its documents' costs (attention: d^2 per document, plus a
linear part; see ``laggard.mitigate.cost``). Three partitioners, all under an optional per-bin token
cap (the activation-memory limit), which is never exceeded:

* ``greedy``: longest-processing-time first: documents by decreasing cost, each to the cheapest bin
  that still has room.
* ``kk``: Karmarkar-Karp k-way largest differencing: every document starts as a k-tuple of bin sums;
  the two tuples with the largest spread are merged (largest sum against smallest) until one is left.
* ``wlb``: variable-length packing in the spirit of WLB-LLM (Wang et al., 2025): documents that cannot
  be balanced in this batch (one alone above the balanced bin level, or too many expensive ones for
  the bins) wait for a later batch instead of unbalancing this one; the rest is packed longest-first
  and improved by moves and swaps out of the most expensive bin (details in ``packing``).
  ``WLBPacker`` keeps the waiting documents across batches (forced in after ``max_wait_batches``) and
  reports how many tokens were delayed and for how long.

Bins are numbered rank-major when used for DP x microbatches: bin ``r * num_microbatches + m``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.mitigate._errors import check_positive_int, error
from laggard.mitigate.cost import Cost, CostModel, doc_costs
from laggard.mitigate.packing import (
    DEFAULT_OUTLIER_SLACK,
    DEFAULT_TOLERANCE,
    greedy_assign,
    kk_assign,
    repair_cap,
    wlb_assign,
)

METHODS = ("wlb", "kk", "greedy")


def imbalance(costs: Any) -> float:
    """max / mean of per-bin costs: 1.0 is perfect balance (the figure everyone reports)."""
    c = np.asarray(costs, dtype=np.float64).ravel()
    if len(c) == 0:
        raise error("imbalance: no costs given")
    if not np.isfinite(c).all() or (c < 0).any():
        raise error("imbalance: costs must be finite and >= 0")
    mean = c.mean()
    return float(c.max() / mean) if mean > 0 else 1.0


@dataclass(kw_only=True, slots=True)
class Plan:
    """Documents assigned to bins. Ids are indices into the lengths given (or ``WLBPacker`` ids)."""

    bins: list[list[int]]
    deferred: list[int]
    costs: np.ndarray  # per bin: c0 (if the bin is not empty) + sum of document costs
    tokens: np.ndarray  # per bin: sum of document lengths
    method: str
    max_tokens: int | None = None
    # documents in ``bins`` that had been held back, and how many batches each waited (WLBPacker)
    released: list[int] = field(default_factory=list)
    waited_batches: list[int] = field(default_factory=list)
    num_deferred_tokens: int = 0

    @property
    def num_bins(self) -> int:
        return len(self.bins)

    @property
    def imbalance(self) -> float:
        return imbalance(self.costs) if len(self.costs) else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method, "num_bins": self.num_bins, "imbalance": self.imbalance,
            "bins": self.bins, "deferred": self.deferred, "costs": self.costs.tolist(),
            "tokens": self.tokens.tolist(), "max_tokens": self.max_tokens, "released": self.released,
            "waited_batches": self.waited_batches, "num_deferred_tokens": self.num_deferred_tokens,
        }

# ------------------------------------------------------------------ public API


def _check_lengths(lengths: Any, max_tokens: int | None) -> tuple[np.ndarray, float]:
    d = np.asarray(lengths)
    if d.ndim != 1:
        raise error(f"lengths must be a flat sequence of integers, got shape {d.shape}")
    if len(d) and (d.dtype.kind not in "iu" and not (d.dtype.kind == "f" and np.isfinite(d).all()
                                                     and (d == np.round(d)).all())):
        raise error("lengths must be integers")
    d = d.astype(np.int64)
    if len(d) and d.min() < 0:
        raise error(f"lengths must be >= 0, got {int(d.min())}")
    if max_tokens is None:
        return d, math.inf
    cap = check_positive_int(max_tokens, "max_tokens")
    if len(d) and d.max() > cap:
        i = int(np.argmax(d))
        raise error(f"document {i} has {int(d[i])} tokens, more than max_tokens={cap}: split it first")
    return d, float(cap)


def _plan(bin_of: np.ndarray, costs: np.ndarray, tokens: np.ndarray, num_bins: int, base: float, method: str,
          max_tokens: int | None, ids: np.ndarray | None = None) -> Plan:
    ids = np.arange(len(bin_of)) if ids is None else ids
    placed = bin_of >= 0
    order = np.argsort(np.where(placed, bin_of, num_bins), kind="stable")
    counts = np.bincount(bin_of[placed], minlength=num_bins)
    bins = [a.tolist() for a in np.split(ids[order[: int(placed.sum())]], np.cumsum(counts)[:-1])]
    bin_costs = np.bincount(bin_of[placed], weights=costs[placed], minlength=num_bins) + base * (counts > 0)
    bin_tokens = np.bincount(bin_of[placed], weights=tokens[placed], minlength=num_bins).astype(np.int64)
    deferred = ids[~placed]
    return Plan(bins=bins, deferred=deferred.tolist(), costs=bin_costs, tokens=bin_tokens, method=method,
                max_tokens=max_tokens, num_deferred_tokens=int(tokens[~placed].sum()))


def balance(lengths: Sequence[int] | np.ndarray, num_bins: int, *, method: str = "wlb",
            cost: CostModel | Cost | None = None, max_tokens: int | None = None,
            tolerance: float = DEFAULT_TOLERANCE, outlier_slack: float = DEFAULT_OUTLIER_SLACK) -> Plan:
    """Split documents of ``lengths`` tokens into ``num_bins`` bins of about equal cost.

    ``cost``: a ``CostModel``, a callable on a length, or None for the attention-dominated d^2.
    ``max_tokens``: per-bin token cap, never exceeded. ``method``: ``wlb`` (outliers go to
    ``plan.deferred`` for the next batch; see ``WLBPacker`` to keep them across batches), ``kk`` or
    ``greedy`` (both place every document or raise ``LaggardError``).
    ``tolerance``: refinement stops within this of the mean; ``outlier_slack``: wlb holds documents
    back only when balance would otherwise miss by more than this (see ``laggard.mitigate.packing``).
    """
    if method not in METHODS:
        raise error(f"method {method!r} not known (choose from {', '.join(METHODS)})")
    num_bins = check_positive_int(num_bins, "num_bins")
    d, cap = _check_lengths(lengths, max_tokens)
    costs, base = doc_costs(d, cost)
    tokens = d.astype(np.float64)
    if method == "wlb":
        bin_of = wlb_assign(costs, tokens, num_bins, cap, base, tolerance=tolerance, outlier_slack=outlier_slack)
    elif method == "greedy":
        bin_of = greedy_assign(costs, tokens, num_bins, cap, base)
    else:
        bin_of = kk_assign(costs, num_bins)
        if math.isfinite(cap):
            bin_of = repair_cap(bin_of, costs, tokens, num_bins, cap)
            if (bin_of < 0).any():  # repair could not place everything: longest-first under the cap
                bin_of = greedy_assign(costs, tokens, num_bins, cap, base)
    if method != "wlb" and (bin_of < 0).any():
        raise error(f"{method}: {int((bin_of < 0).sum())} document(s) do not fit in {num_bins} bins of "
                    f"max_tokens={max_tokens} ({int(d.sum())} tokens in all); use more bins, a larger cap "
                    "or method='wlb' (which defers what does not fit)")
    return _plan(bin_of, costs, tokens, num_bins, base, method, max_tokens)


class WLBPacker:
    """WLB packing across batches: outliers (and what does not fit under the cap) wait in a queue and
    join a later batch, at the latest after ``max_wait_batches`` batches.

    ``pack(lengths)`` returns a ``Plan`` whose ids are global document ids (a running count unless
    ``ids`` are given); ``plan.released`` lists the documents placed after waiting and
    ``plan.waited_batches`` how long each waited. ``flush()`` places everything still waiting.
    """

    def __init__(self, num_bins: int, *, cost: CostModel | Cost | None = None, max_tokens: int | None = None,
                 max_wait_batches: int = 4, tolerance: float = DEFAULT_TOLERANCE,
                 outlier_slack: float = DEFAULT_OUTLIER_SLACK) -> None:
        self.num_bins = check_positive_int(num_bins, "num_bins")
        if isinstance(max_wait_batches, bool) or not isinstance(max_wait_batches, int) or max_wait_batches < 0:
            raise error(f"max_wait_batches must be an integer >= 0, got {max_wait_batches!r}")
        self.cost = cost
        self.max_tokens = max_tokens
        self.max_wait_batches = max_wait_batches
        self.tolerance = tolerance
        self.outlier_slack = outlier_slack
        self._ids = np.zeros(0, dtype=np.int64)
        self._lengths = np.zeros(0, dtype=np.int64)
        self._waited = np.zeros(0, dtype=np.int64)
        self._next_id = 0
        self.num_batches = 0
        self.num_tokens = 0
        self.num_delayed_docs = 0
        self.num_delayed_tokens = 0  # tokens that joined a later batch than the one they came with
        self.delayed_token_batches = 0  # sum over delayed documents of tokens x batches waited
        self.max_waited_batches = 0

    @property
    def pending(self) -> list[int]:
        """Ids of documents waiting for a later batch."""
        return self._ids.tolist()

    def pack(self, lengths: Sequence[int] | np.ndarray, ids: Sequence[int] | np.ndarray | None = None,
             *, force_all: bool = False) -> Plan:
        d, cap = _check_lengths(lengths, self.max_tokens)
        if ids is None:
            new_ids = np.arange(self._next_id, self._next_id + len(d), dtype=np.int64)
        else:
            new_ids = np.asarray(ids, dtype=np.int64)
            if new_ids.shape != d.shape:
                raise error(f"ids: {len(new_ids)} ids for {len(d)} lengths")
        self._next_id = max(self._next_id, int(new_ids.max()) + 1) if len(new_ids) else self._next_id
        all_ids = np.concatenate([self._ids, new_ids])
        all_d = np.concatenate([self._lengths, d])
        waited = np.concatenate([self._waited, np.zeros(len(d), dtype=np.int64)])
        costs, base = doc_costs(all_d, self.cost)
        tokens = all_d.astype(np.float64)
        forced = np.ones(len(all_d), dtype=bool) if force_all else waited >= self.max_wait_batches
        bin_of = wlb_assign(costs, tokens, self.num_bins, cap, base, forced=forced, tolerance=self.tolerance,
                            outlier_slack=self.outlier_slack, waited=waited)
        plan = _plan(bin_of, costs, tokens, self.num_bins, base, "wlb", self.max_tokens, ids=all_ids)
        placed = bin_of >= 0
        late = placed & (waited > 0)
        plan.released = all_ids[late].tolist()
        plan.waited_batches = waited[late].tolist()
        self.num_batches += 1
        self.num_tokens += int(d.sum())
        self.num_delayed_docs += int(late.sum())
        self.num_delayed_tokens += int(all_d[late].sum())
        self.delayed_token_batches += int((all_d[late] * waited[late]).sum())
        if late.any():
            self.max_waited_batches = max(self.max_waited_batches, int(waited[late].max()))
        self._ids, self._lengths, self._waited = all_ids[~placed], all_d[~placed], waited[~placed] + 1
        return plan

    def flush(self) -> Plan:
        """Place every waiting document (as many bins as needed under the cap, in repeated plans is the
        caller's business: what still does not fit stays pending)."""
        return self.pack(np.zeros(0, dtype=np.int64), force_all=True)

    def stats(self) -> dict[str, float | int]:
        """Delay figures so far: delayed tokens (share of all tokens), mean and max wait in batches."""
        return {
            "num_batches": self.num_batches, "num_tokens": self.num_tokens,
            "num_delayed_docs": self.num_delayed_docs, "num_delayed_tokens": self.num_delayed_tokens,
            "delayed_token_share": self.num_delayed_tokens / self.num_tokens if self.num_tokens else 0.0,
            "mean_wait_batches": (self.delayed_token_batches / self.num_delayed_tokens
                                  if self.num_delayed_tokens else 0.0),
            "max_wait_batches": self.max_waited_batches, "num_pending_docs": len(self._ids),
            "num_pending_tokens": int(self._lengths.sum()),
        }


__all__ = ["METHODS", "Plan", "WLBPacker", "balance", "imbalance"]
