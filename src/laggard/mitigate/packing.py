"""Partitioning algorithms on arrays: per-document costs and token counts in, a bin per document out
(-1: held back). ``laggard.mitigate.balance`` wraps them in the public API.

* ``greedy_assign``: longest-processing-time first under the token cap (a heap of bin loads).
* ``kk_assign``: Karmarkar-Karp k-way largest differencing, O(k) numpy work per merge; groups are
  nodes of a forest resolved by pointer jumping.
* ``refine``: local search: move or swap one document between the most expensive bin and one of
  the cheapest, while that strictly lowers the pair's maximum and keeps both under the cap.
* ``select_outliers`` / ``defer_from_heavy_bins`` / ``wlb_assign``: the WLB-style packer. Documents
  wait for a later batch when (1) one alone costs more than the balanced bin level, (2) pigeonhole:
  the r + 1 cheapest of the r x k + 1 most expensive documents already exceed the level (some r + 1
  of them must share a bin), or (3) after packing and refinement a bin is still above the level and
  giving up one medium document fixes it. (2) and (3) together hold back at most
  ``DEFER_BUDGET_SHARE`` of the tokens placed.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

# refinement stops once the most expensive bin is within this of the mean
DEFAULT_TOLERANCE = 1e-4
# wlb holds documents back only when a bin would otherwise be more than this above the mean
DEFAULT_OUTLIER_SLACK = 0.01
# tokens that may wait for pigeonhole and packing reasons (not single outliers), as a share of those placed
DEFER_BUDGET_SHARE = 0.10
# how many of the cheapest bins each refinement step looks at for moves and swaps
_NUM_PARTNERS = 4


def greedy_assign(costs: np.ndarray, tokens: np.ndarray, num_bins: int, cap: float,
                  base: float = 0.0, order: np.ndarray | None = None,
                  bin_of: np.ndarray | None = None) -> np.ndarray:
    """Longest-first: each document (in ``order``, default by decreasing cost) to the cheapest bin with
    room. Returns the bin of every document, -1 where no bin had room. ``bin_of`` holds documents
    already placed (-1: to place)."""
    n = len(costs)
    out = np.full(n, -1, dtype=np.int64) if bin_of is None else bin_of.copy()
    loads = np.zeros(num_bins)
    toks = np.zeros(num_bins)
    placed = out >= 0
    if placed.any():
        np.add.at(loads, out[placed], costs[placed])
        np.add.at(toks, out[placed], tokens[placed])
        loads[np.bincount(out[placed], minlength=num_bins) > 0] += base
    if order is None:
        order = np.argsort(-costs, kind="stable")
    order = order[out[order] < 0]
    heap = [(float(loads[b]), b) for b in range(num_bins)]
    heapq.heapify(heap)
    tok_list = toks.tolist()
    empty = [t == 0 for t in tok_list]
    capped = math.isfinite(cap)
    for i, c, t in zip(order.tolist(), costs[order].tolist(), tokens[order].tolist(), strict=True):
        if not capped:
            load, b = heap[0]
            out[i] = b
            heapq.heapreplace(heap, (load + c + (base if empty[b] else 0.0), b))
            empty[b] = False
            continue
        skipped = []
        while heap and tok_list[heap[0][1]] + t > cap:
            skipped.append(heapq.heappop(heap))
        if heap:
            load, b = heap[0]
            out[i] = b
            tok_list[b] += t
            heapq.heapreplace(heap, (load + c + (base if empty[b] else 0.0), b))
            empty[b] = False
        for s in skipped:
            heapq.heappush(heap, s)
    return out


def kk_assign(costs: np.ndarray, num_bins: int) -> np.ndarray:
    """Karmarkar-Karp k-way largest differencing (no token cap): the bin of every document.

    Each partial solution is k bin sums (sorted, largest first) and the group of documents in each.
    Merging two partials pairs the largest sum of one with the smallest of the other. Groups are
    nodes of a forest (a merge of two non-empty groups makes a parent node), resolved at the end by
    pointer jumping, so a merge costs O(k) numpy work and no per-document Python loop.
    """
    n, k = len(costs), num_bins
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    parent = np.full(2 * n, -1, dtype=np.int64)  # leaves 0..n-1, merge nodes n..2n-2
    next_node = n
    sums: list[np.ndarray] = []
    groups: list[np.ndarray] = []
    heap: list[tuple[float, int]] = []
    for i, c in enumerate(costs.tolist()):
        s = np.zeros(k)
        s[0] = c
        g = np.full(k, -1, dtype=np.int64)
        g[0] = i
        sums.append(s)
        groups.append(g)
        heap.append((-c, i))
    heapq.heapify(heap)
    while len(heap) > 1:
        _, ia = heapq.heappop(heap)
        _, ib = heapq.heappop(heap)
        s = sums[ia] + sums[ib][::-1]
        ga, gb = groups[ia], groups[ib][::-1]
        both = (ga >= 0) & (gb >= 0)
        g = np.where(ga >= 0, ga, gb)
        num_new = int(both.sum())
        if num_new:
            new = np.arange(next_node, next_node + num_new)
            parent[ga[both]] = new
            parent[gb[both]] = new
            g[both] = new
            next_node += num_new
        order = np.argsort(-s, kind="stable")
        s, g = s[order], g[order]
        sums[ia], groups[ia] = s, g
        sums[ib] = groups[ib] = None  # type: ignore[call-overload]
        heapq.heappush(heap, (-(s[0] - s[-1]), ia))
    _, last = heap[0]
    root_bin = np.full(next_node, -1, dtype=np.int64)
    final = groups[last]
    root_bin[final[final >= 0]] = np.flatnonzero(final >= 0)
    parent = parent[:next_node]
    # pointer jumping: every node to its root
    root = np.where(parent >= 0, parent, np.arange(next_node))
    while True:
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    return root_bin[root[:n]]


def refine(bin_of: np.ndarray, costs: np.ndarray, tokens: np.ndarray, num_bins: int, cap: float,
           base: float = 0.0, *, tolerance: float = DEFAULT_TOLERANCE, max_iters: int | None = None) -> np.ndarray:
    """Lower the most expensive bin by moving or swapping one of its documents with one of the cheapest
    bins, while that strictly improves the pair and keeps both under the token cap."""
    bin_of = bin_of.copy()
    placed = bin_of >= 0
    loads = np.bincount(bin_of[placed], weights=costs[placed], minlength=num_bins)
    toks = np.bincount(bin_of[placed], weights=tokens[placed], minlength=num_bins)
    count = np.bincount(bin_of[placed], minlength=num_bins)
    loads = loads + base * (count > 0)
    mean = loads.mean()
    if mean <= 0 or num_bins < 2:
        return bin_of
    max_iters = 8 * num_bins + 64 if max_iters is None else max_iters
    num_partners = min(_NUM_PARTNERS, num_bins - 1)
    capped = math.isfinite(cap)
    is_partner = np.zeros(num_bins, dtype=bool)
    for _ in range(max_iters):
        m = int(np.argmax(loads))
        lm = loads[m]
        if lm <= (1 + tolerance) * mean:
            break
        partners = np.argpartition(loads, num_partners)[: num_partners + 1]
        partners = partners[partners != m][:num_partners]
        xs = np.flatnonzero(bin_of == m)
        cx, tx = costs[xs], tokens[xs]
        # moves: x from m to partner j (a partner that was empty starts paying ``base``)
        last = len(xs) == 1  # moving the only document empties m: it stops paying base
        mv = np.maximum((lm - (base if last else 0.0)) - cx[:, None],
                        (loads[partners] + base * (count[partners] == 0))[None, :] + cx[:, None])
        if capped:
            mv[toks[partners][None, :] + tx[:, None] > cap] = np.inf
        best_mv = np.unravel_index(int(np.argmin(mv)), mv.shape)
        best_val = mv[best_mv]
        # swaps: x in m with y in partner bin j
        is_partner[:] = False
        is_partner[partners] = True
        ys = np.flatnonzero(is_partner[bin_of] & (bin_of >= 0))
        best_sw = None
        if len(ys):
            jy = bin_of[ys]
            delta = cx[:, None] - costs[ys][None, :]
            sw = np.maximum(lm - delta, loads[jy][None, :] + delta)
            sw[delta <= 0] = np.inf
            if capped:
                dt = tx[:, None] - tokens[ys][None, :]
                sw[(toks[m] - dt > cap) | (toks[jy][None, :] + dt > cap)] = np.inf
            idx = np.unravel_index(int(np.argmin(sw)), sw.shape)
            if sw[idx] < best_val:
                best_val, best_sw = sw[idx], idx
        if not best_val < lm * (1 - 1e-12):
            break
        if best_sw is not None:
            xi, yi = xs[best_sw[0]], ys[best_sw[1]]
            j = int(bin_of[yi])
            d, dtk = costs[xi] - costs[yi], tokens[xi] - tokens[yi]
            bin_of[xi], bin_of[yi] = j, m
            loads[m] -= d
            loads[j] += d
            toks[m] -= dtk
            toks[j] += dtk
        else:
            xi, j = xs[best_mv[0]], int(partners[best_mv[1]])
            bin_of[xi] = j
            loads[m] -= costs[xi] + (base if last else 0.0)
            loads[j] += costs[xi] + (base if count[j] == 0 else 0.0)
            toks[m] -= tokens[xi]
            toks[j] += tokens[xi]
            count[m] -= 1
            count[j] += 1
    return bin_of


def repair_cap(bin_of: np.ndarray, costs: np.ndarray, tokens: np.ndarray, num_bins: int, cap: float) -> np.ndarray:
    """Move documents out of bins over the token cap (cheapest first) into the cheapest bins with room.
    Documents that find no room are left at -1."""
    bin_of = bin_of.copy()
    toks = np.bincount(bin_of[bin_of >= 0], weights=tokens[bin_of >= 0], minlength=num_bins)
    loads = np.bincount(bin_of[bin_of >= 0], weights=costs[bin_of >= 0], minlength=num_bins)
    for b in np.flatnonzero(toks > cap).tolist():
        members = np.flatnonzero(bin_of == b)
        for i in members[np.argsort(costs[members], kind="stable")].tolist():
            if toks[b] <= cap:
                break
            room = np.flatnonzero(toks + tokens[i] <= cap)
            bin_of[i] = -1
            toks[b] -= tokens[i]
            loads[b] -= costs[i]
            if len(room):
                j = int(room[np.argmin(loads[room])])
                bin_of[i] = j
                toks[j] += tokens[i]
                loads[j] += costs[i]
    return bin_of


def select_outliers(costs: np.ndarray, num_bins: int, base: float, forced: np.ndarray | None = None,
                    slack: float = 0.0, waited: np.ndarray | None = None, max_share: int = 3,
                    tokens: np.ndarray | None = None,
                    budget_share: float = DEFER_BUDGET_SHARE) -> tuple[np.ndarray, float]:
    """Documents that cannot be balanced in this batch, held back one at a time until none is left:

    * a document whose cost alone is above the balanced bin level of what is kept (largest first);
    * pigeonhole: among the r x num_bins + 1 most expensive documents some r + 1 share a bin, so when
      the r + 1 cheapest of them already exceed the level (r = 1..``max_share``), one of them waits
      (the cheapest; the newest among equals), while the tokens held back for this reason stay within
      ``budget_share`` of the tokens kept.

    The level drops as documents leave. When that would leave no more documents than bins, nothing is
    held back (waiting would not buy balance). ``forced`` documents are never held back. Returns the
    documents held back and the tokens held back for pigeonhole reasons.
    """
    n = len(costs)
    held = np.zeros(n, dtype=bool)
    if n <= num_bins:
        return held, 0.0
    tok = costs if tokens is None else tokens
    kept_tokens = float(tok.sum())
    used = 0.0
    # most expensive first; among equal costs the newest (least waited) first
    kept = np.argsort(-costs, kind="stable") if waited is None else np.lexsort((waited, -costs))
    fixed = np.zeros(n, dtype=bool) if forced is None else forced
    total = float(costs.sum())
    while True:
        # single outliers, largest first, all at once: the j-th non-forced document against the level
        # left after the j - 1 before it have gone
        nf_pos = np.flatnonzero(~fixed[kept])
        c_nf = costs[kept[nf_pos]]
        before = np.concatenate([[0.0], np.cumsum(c_nf)[:-1]])
        above = c_nf > (1 + slack) * (base + (total - before) / num_bins) - base
        j = len(above) if above.all() else int(np.argmin(above))
        if j:
            if len(kept) - j < num_bins:  # a bin per document and still no balance: waiting does not help
                return np.zeros(n, dtype=bool), 0.0
            gone = kept[nf_pos[:j]]
            held[gone] = True
            total -= float(c_nf[:j].sum())
            kept_tokens -= float(tok[gone].sum())
            kept = np.delete(kept, nf_pos[:j])
            continue
        # pigeonhole: one document at a time
        ck = costs[kept]
        level = (1 + slack) * (base + total / num_bins) - base
        victim = -1
        for r in range(1, max_share + 1):
            top = r * num_bins + 1
            if top > len(kept):
                break
            if ck[top - r - 1 : top].sum() <= level:
                continue
            window = kept[:top][~fixed[kept[:top]]]
            if len(window):
                cheapest = costs[window].min()
                v = int(window[np.argmax(costs[window] == cheapest)])
                if used + tok[v] <= budget_share * (kept_tokens - tok[v]):
                    victim = v
                    used += float(tok[v])
            break
        if victim < 0 or len(kept) <= num_bins:
            return held, used
        held[victim] = True
        kept_tokens -= float(tok[victim])
        total -= float(costs[victim])
        kept = kept[kept != victim]


def defer_from_heavy_bins(bin_of: np.ndarray, costs: np.ndarray, tokens: np.ndarray, num_bins: int,
                          base: float, slack: float, forced: np.ndarray | None = None,
                          budget_tokens: float = math.inf) -> tuple[np.ndarray, float]:
    """Hold back one document from every bin still above (1 + slack) x the mean after packing: the one
    with the fewest tokens whose removal brings the bin down to that level, else the most expensive,
    while the tokens held back stay within ``budget_tokens``. (A stuck packing, e.g. three
    context-length documents plus one medium one, then costs one medium document's delay instead of
    the whole batch's balance.) Returns the new assignment and the budget left."""
    bin_of = bin_of.copy()
    placed = bin_of >= 0
    count = np.bincount(bin_of[placed], minlength=num_bins)
    loads = np.bincount(bin_of[placed], weights=costs[placed], minlength=num_bins) + base * (count > 0)
    limit = (1 + slack) * loads.mean()
    heavy = loads > limit
    cand = np.flatnonzero(placed & heavy[np.maximum(bin_of, 0)] & (True if forced is None else ~forced))
    if len(cand) == 0:
        return bin_of, budget_tokens
    b = bin_of[cand]
    enough = costs[cand] >= loads[b] - limit
    # per heavy bin: the fewest tokens among documents whose removal suffices, else the most expensive
    order = np.lexsort((np.where(enough, tokens[cand], -costs[cand]), ~enough, b))
    b_sorted = b[order]
    first = np.r_[True, b_sorted[1:] != b_sorted[:-1]]
    num_cand = np.bincount(b, minlength=num_bins)
    for x, bb in zip(cand[order[first]].tolist(), b_sorted[first].tolist(), strict=True):
        if num_cand[bb] <= 1 or tokens[x] > budget_tokens:  # a bin of one document: the outlier rule's
            continue
        budget_tokens -= tokens[x]
        bin_of[x] = -1
    return bin_of, budget_tokens


def wlb_assign(costs: np.ndarray, tokens: np.ndarray, num_bins: int, cap: float, base: float = 0.0, *,
               forced: np.ndarray | None = None, tolerance: float = DEFAULT_TOLERANCE,
               defer_outliers: bool = True, outlier_slack: float = DEFAULT_OUTLIER_SLACK,
               waited: np.ndarray | None = None, max_rounds: int = 3) -> np.ndarray:
    """WLB-style packing: outliers held back (-1), the rest longest-first then refined; bins still above
    (1 + outlier_slack) x the mean give up one document and the packing is refined again (at most
    ``max_rounds`` times). Documents that find no room under the cap are held back too; ``forced``
    ones are placed first and never held back. Beyond the single-document outliers, documents worth at
    most ``DEFER_BUDGET_SHARE`` of the tokens placed wait (holding back half of a tiny batch to balance
    it is not worth it)."""
    n = len(costs)
    held = np.zeros(n, dtype=bool)
    used = 0.0
    if defer_outliers:
        held, used = select_outliers(costs, num_bins, base, forced, outlier_slack, waited, tokens=tokens,
                                     budget_share=DEFER_BUDGET_SHARE)
    keep = ~held
    budget = DEFER_BUDGET_SHARE * float(tokens[keep].sum()) - used
    order = np.argsort(-costs, kind="stable")
    if forced is not None and forced.any():
        order = np.concatenate([order[forced[order]], order[~forced[order]]])
    order = order[keep[order]]
    bin_of = greedy_assign(costs, tokens, num_bins, cap, base, order=order)
    bin_of = refine(bin_of, costs, tokens, num_bins, cap, base, tolerance=tolerance)
    for _ in range(max_rounds if defer_outliers else 0):
        nxt, budget = defer_from_heavy_bins(bin_of, costs, tokens, num_bins, base, outlier_slack, forced, budget)
        if np.array_equal(nxt, bin_of):
            break
        bin_of = refine(nxt, costs, tokens, num_bins, cap, base, tolerance=tolerance)
    return bin_of


__all__ = ["DEFAULT_OUTLIER_SLACK", "DEFAULT_TOLERANCE", "DEFER_BUDGET_SHARE", "defer_from_heavy_bins",
           "greedy_assign", "kk_assign", "refine", "repair_cap", "select_outliers", "wlb_assign"]
