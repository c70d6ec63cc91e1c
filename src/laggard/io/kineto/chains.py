"""Pipelines as chains of ranks, walked along transfers without peers (``laggard.io.kineto.p2p``
pairs two ranks' transfers).

A pipeline is a chain of ranks: its first stage talks to one neighbour only, so all of its
transfers go to one rank; with them taken out, that rank's remaining transfers go to one other
rank, and so on (``_walk``; each link one dynamic programme, ``p2p._embed``). Where a layout is given
(``--layout``, a rank map, per-stage process groups), the walk follows its stages; otherwise
chains are searched (``find_chains``) from the ranks with the fewest transfers (the ends), each
link to the rank whose pairing costs least. When another rank fits almost as well, the link goes to
the nearer one where one is (``_nearest``: a rank further along the same pipeline sees the data a
hop later) and the others must then lie further along the chain walked; otherwise (two DP replicas
of a pipeline running in lockstep look alike) nothing is matched, and the warning says which ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.io.kineto.p2p import _COST_FLOOR_NS, Pairs, Peerless, _left, _Link, _link, _Side

# a neighbour is chosen only when the next best fits clearly worse: its mean cost at least this
# many times the best one's (plus _COST_FLOOR_NS, so that two near-zero costs count as a tie)
_AMBIGUOUS_RATIO = 3.0
# ... unless one of them is the nearer for this share of the transfers (``_nearest``): causality makes
# it every transfer on one host; a share leaves room for the clock error between hosts
_NEAR_SHARE = 0.9


@dataclass(slots=True)
class Search:
    """Chains found by matching transfers (``why``: why there are none)."""

    chains: list[list[int]] | None
    pairs: dict[tuple[int, ...], Pairs]  # chain (as walked) -> its matched transfers
    why: str = ""

    @property
    def edges(self) -> set[tuple[int, int]]:
        return {(a, b) for p in self.pairs.values() for a, b in zip(p.src, p.dst, strict=True)}


@dataclass(slots=True)
class _Walk:
    chain: list[int]
    pairs: Pairs
    left: dict[int, tuple[_Side, _Side]]
    why: str = ""  # why the walk failed ("" when it did not)
    ambiguous: bool = False


def _walk(pl: Peerless, left: dict[int, tuple[_Side, _Side]], start: int, order: list[int] | None = None) -> _Walk:
    """From ``start``, whose transfers all go to one rank: pair them with that rank's (the one that
    fits best, or the next in ``order``), take them out, and go on from that rank until one has
    none left. A walk that cannot go on, or (without ``order``) has two ranks to go on to that fit
    alike, fails."""
    left = dict(left)
    w = _Walk(chain=[start], pairs=Pairs(), left=left)
    cur = start
    rivals: dict[int, tuple[int, int]] = {}  # a rank that fit almost as well -> (the rank, the one chosen)
    while cur in left and (len(left[cur][0].rows) or len(left[cur][1].rows)):
        if order is not None:
            cands = order[len(w.chain):len(w.chain) + 1]
        else:
            cands = [c for c in left if c not in w.chain and (len(left[c][0].rows) or len(left[c][1].rows))]
        links = ((c, _link(left[cur], left[c], pl.tol(cur, c), pl.other_host(cur, c))) for c in cands if c in left)
        fits = sorted(((lk.cost_ns, c, lk) for c, lk in links if lk is not None), key=lambda x: (x[0], x[1]))
        if not fits:
            nxt = f"rank {cands[0]}'s" if order is not None and cands else "any other rank's"
            w.why = (f"rank {cur}'s transfers do not pair with {nxt} (the counts per step differ, or a receive would "
                     "complete before its send was issued)")
            return w
        pick = fits[0]
        if order is None and len(fits) > 1 and fits[1][0] <= _AMBIGUOUS_RATIO * fits[0][0] + _COST_FLOOR_NS:
            close = [f for f in fits if f[0] <= _AMBIGUOUS_RATIO * fits[0][0] + _COST_FLOOR_NS]
            near = _nearest(close)
            if near is None:
                w.why = (f"rank {cur}'s transfers pair as well with rank {fits[1][1]} as with rank {fits[0][1]} (mean "
                         f"pairing cost {fits[1][0] / 1e6:.2f} vs {fits[0][0] / 1e6:.2f} ms)")
                w.ambiguous = True
                return w
            pick = near
            rivals.update({c: (cur, pick[1]) for _, c, _ in close if c != pick[1]})
        _, nxt_rank, lk = pick
        w.pairs.extend(lk.pairs)
        left[cur] = (_left(left[cur][0], np.arange(len(left[cur][0].rows))),
                     _left(left[cur][1], np.arange(len(left[cur][1].rows))))
        left[nxt_rank] = (_left(left[nxt_rank][0], lk.used_send), _left(left[nxt_rank][1], lk.used_recv))
        w.chain.append(nxt_rank)
        cur = nxt_rank
    apart = {c: how for c, how in rivals.items() if c not in w.chain}
    if apart:  # a rank off this chain fit almost as well: two pipelines in lockstep, not one
        c, (at, chose) = next(iter(apart.items()))
        w.why = (f"rank {at}'s transfers pair almost as well with rank {c} as with rank {chose}, and rank {c} is not "
                 "on the same pipeline")
        w.ambiguous = True
        return w
    if order is not None:
        rest = [r for r in order if r in left and (len(left[r][0].rows) or len(left[r][1].rows))]
        if rest or w.chain != order[:len(w.chain)]:
            w.why = (f"the transfers of ranks {order} do not pair up along the pipeline (rank "
                     f"{rest[0] if rest else w.chain[-1]} has transfers left over)")
    return w


def _nearest(fits: list[tuple[float, int, _Link]]) -> tuple[float, int, _Link] | None:
    """Of links that pair about as well, the one to the rank next on the chain: its data's way
    (``_Link.latency``) is the shorter for ``_NEAR_SHARE`` of the transfers against each other link;
    None when no link is. A rank further along the same pipeline pairs nearly as well (it sees the same
    microbatches a hop later: a small model's hop is well under a millisecond) but never earlier: a
    microbatch reaches the second stage after the first, and a gradient leaves the second stage
    before the first. Two pipelines in lockstep have no such order (``_walk`` then checks that the
    ranks passed over lie on the chain it walks)."""
    for f in fits:
        if all(np.mean(f[2].latency < g[2].latency) >= _NEAR_SHARE for g in fits if g is not f):
            return f
    return None


def find_chains(pl: Peerless) -> Search:
    """Pipelines as chains of ranks joined by matched transfers, walked from their ends (the ranks
    with the fewest transfers first)."""
    left = dict(pl.sides)
    order = sorted(left, key=lambda r: (len(left[r][0].rows) + len(left[r][1].rows), r))
    out = Search(chains=[], pairs={})
    first_why = ""
    while left:
        for start in [r for r in order if r in left]:
            w = _walk(pl, left, start)
            if w.ambiguous:
                return Search(chains=None, pairs={}, why=w.why)
            if not w.why and len(w.chain) > 1:
                break
            first_why = first_why or w.why
        else:
            return Search(chains=None, pairs={}, why=first_why or "no rank's transfers pair with another's")
        out.chains.append(w.chain)  # type: ignore[union-attr]
        out.pairs[tuple(w.chain)] = w.pairs
        left = {r: s for r, s in w.left.items() if r not in w.chain}
    return out


def match_pipelines(pl: Peerless, pipes: list[list[int]], search: Search | None = None) -> tuple[Pairs, list[str]]:
    """The transfers of each pipeline (ranks by stage), matched along its stages; why those of a
    pipeline stay unmatched, for each that does."""
    pairs, why = Pairs(), []
    for pipe in pipes:
        if len(pipe) < 2 or not any(r in pl.sides for r in pipe):
            continue
        known = search.pairs.get(tuple(pipe), search.pairs.get(tuple(pipe[::-1]))) if search else None
        if known is not None:
            pairs.extend(known)
            continue
        w = _walk(pl, {r: pl.sides[r] for r in pipe if r in pl.sides}, pipe[0], order=pipe)
        if w.why:
            why.append(w.why)
        else:
            pairs.extend(w.pairs)
    return pairs, why


__all__ = ["Search", "find_chains", "match_pipelines"]
