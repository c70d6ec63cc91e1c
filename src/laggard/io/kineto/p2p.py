"""Point-to-point transfers whose events name no peer rank, matched across ranks.

gloo's ``gloo:send`` / ``gloo:recv`` events say nothing of the other end; the ``c10d::send`` call
before them names it only when the profiler records shapes. Without peers the two ends of a
transfer are found here, from what every trace does hold:

* **order**: within one (sender, receiver) pair the k-th send of a step is the k-th receive
  (blocking transfers between two ranks complete in order);
* **counts**: every transfer has both ends, so per step a rank's sends to a neighbour and that
  neighbour's receives from it are equally many;
* **payload size** where both ends record it;
* **timing**: a receive cannot complete before its send was issued (the start of its
  ``c10d::send`` call), on the clocks the collectives align (``match.clock_offsets``), within
  ``_TOL_NS``; between hosts also on the clock the transfers themselves set (``_transfer_shift``),
  as that fit can be biased by ms. Among the pairings that break no rule the one of least cost is
  taken; a pair's cost is the time between its two calls (0 when they overlap, as the calls of a
  blocking transfer do), a small share of the gap between their ends, and ``_WAY_COST_NS`` when
  the two carry different phases (``_ways``: on CPU ranks, a send carries the phase of the compute
  before it, a receive that of the compute after it).

Two ranks' transfers are paired here (``_link``: each direction one dynamic programme, ``_embed``);
the chains of ranks they make are walked in ``laggard.io.kineto.chains``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from laggard.io.kineto.comm import KIND_RECV, KIND_SEND
from laggard.io.kineto.rank import RankOps
from laggard.io.kineto.segments import PHASES

# clock error allowed when checking that a receive completed after its send was issued: the
# clock fit's error between hosts (gloo releases a collective's ranks ~150 us apart) plus the
# profiler's own timestamps; far below a microbatch's compute, which wrong pairings are off by
_TOL_NS = 1_000_000
# ... plus this many times the two ranks' clock spreads where they are on different hosts: the
# fit on gloo's collective ends was 2-4 ms off on busy 2-core runs (ranks leave a collective ms
# apart), 1-3x its domains' median residual; 5 leaves a margin over the worst seen (at 3 the
# two-host test stayed unmatched once in ~30 real runs). Wrong pairings are a microbatch (tens of
# ms) off, far outside it, and the ambiguity rule still refuses two neighbours that fit alike
_SPREAD_K = 5.0
_FORWARD, _BACKWARD = PHASES.index("forward"), PHASES.index("backward")
# a pair's cost: the time between its two calls (0 when they overlap, as a blocking transfer's
# do) plus this share of the gap between their ends (which completes together, but a sender
# descheduled after the data went ends ms later: measured 12 ms on 2 busy cores), to tell apart
# receives that all overlap one long blocked send
_END_WEIGHT = 0.05
# ... plus this when the two ends carry different phases (``_ways``): a forward's activations
# received before a backward. A cost, not a rule: a phase read wrong (a stalled segment) must
# not make a pairing impossible; it outweighs the end gaps of a busy host, not 10 ms apart
_WAY_COST_NS = 10_000_000
# two mean pair costs under this count as a tie (``laggard.io.kineto.chains``); a pairing on the
# fitted clocks that costs less needs no shift (``_link``)
_COST_FLOOR_NS = 200_000


def p2p_kind(name: str) -> str | None:
    """'send' / 'recv' for a p2p op name ('gloo:send', 'nccl:recv'), else None."""
    tail = name.rsplit(":", 1)[-1]
    return tail if tail in ("send", "recv") else None


@dataclass(slots=True)
class _Side:
    """One rank's unmatched transfers of one kind (sends or receives), sorted by (step, start)."""

    rank: int
    rows: np.ndarray  # op indices in the rank's RankOps
    step: np.ndarray
    issue: np.ndarray  # ns, aligned clock
    end: np.ndarray  # ns, aligned clock
    size: np.ndarray  # bytes, -1 unknown
    way: np.ndarray  # 1 forward, 2 backward (the phase it carries: ``_ways``), 0 unknown

    def take(self, keep: np.ndarray) -> _Side:
        return _Side(self.rank, self.rows[keep], self.step[keep], self.issue[keep], self.end[keep], self.size[keep],
                     self.way[keep])

    def shifted(self, by_ns: float) -> _Side:
        return _Side(self.rank, self.rows, self.step, self.issue + by_ns, self.end + by_ns, self.size, self.way)


@dataclass(slots=True)
class Peerless:
    """Every rank's transfers without peer ranks: (sends, receives) per rank; each rank's clock
    domain and how far its fitted offset may be off (ns)."""

    sides: dict[int, tuple[_Side, _Side]]
    domain: dict[int, int] = field(default_factory=dict)
    spread: dict[int, float] = field(default_factory=dict)

    def other_host(self, a: int, b: int) -> bool:
        return self.domain.get(a, 0) != self.domain.get(b, 0)

    def tol(self, a: int, b: int) -> float:
        """The clock error allowed between ranks ``a`` and ``b``."""
        if not self.other_host(a, b):
            return _TOL_NS
        return _TOL_NS + _SPREAD_K * (self.spread.get(a, 0.0) + self.spread.get(b, 0.0))

    @property
    def num_ops(self) -> int:
        return sum(len(s.rows) + len(r.rows) for s, r in self.sides.values())


@dataclass(slots=True)
class Pairs:
    """Matched transfers: send ``send_row`` on rank ``src`` is receive ``recv_row`` on rank ``dst``."""

    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    send_rows: list[np.ndarray] = field(default_factory=list)
    recv_rows: list[np.ndarray] = field(default_factory=list)

    def add(self, src: int, dst: int, send_rows: np.ndarray, recv_rows: np.ndarray) -> None:
        if len(send_rows):
            self.src.append(src)
            self.dst.append(dst)
            self.send_rows.append(send_rows)
            self.recv_rows.append(recv_rows)

    def extend(self, other: Pairs) -> None:
        for f in ("src", "dst", "send_rows", "recv_rows"):
            getattr(self, f).extend(getattr(other, f))

    @property
    def num_transfers(self) -> int:
        return int(sum(len(x) for x in self.send_rows))


def peerless(ranks: list[RankOps]) -> Peerless | None:
    """The transfers whose events name no peer (None when there are none)."""
    found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for r in ranks:
        what = np.array([p2p_kind(n) or "" for n in r.names] + [""], dtype=object)[r.name]
        free = (what != "") & (r.group < 0)
        if free.any():
            found[int(r.rank)] = (np.flatnonzero(free & (what == "send")),  # type: ignore[arg-type]
                                  np.flatnonzero(free & (what == "recv")))
    if not found:
        return None
    shift, spread, dom = _clock_shift(ranks)
    sides: dict[int, tuple[_Side, _Side]] = {}
    for i, r in enumerate(ranks):
        me = int(r.rank)  # type: ignore[arg-type]
        if me not in found:
            continue
        made = []
        for rows, sends in zip(found[me], (True, False), strict=True):
            rows = rows[np.lexsort((r.start_ns[rows], r.step[rows]))]
            off = shift[i]
            made.append(_Side(me, rows, r.step[rows], r.issue_ns[rows] - off, r.start_ns[rows] + r.dur_ns[rows] - off,
                              r.size_bytes[rows], _ways(r, rows, sends)))
        sides[me] = (made[0], made[1])
    ids = [int(r.rank) for r in ranks]  # type: ignore[arg-type]
    return Peerless(sides, domain=dict(zip(ids, dom.tolist(), strict=True)),
                    spread=dict(zip(ids, spread.tolist(), strict=True)))


def _ways(r: RankOps, rows: np.ndarray, sends: bool) -> np.ndarray:
    """The phase a transfer carries: a send that of the compute before it (a stage sends the
    activations its forward made, the gradients its backward made), a receive that of the compute
    after it (what it feeds); 0 where no forward or backward compute of the step is there, and on
    GPU ranks (a kernel's neighbours in time on other streams belong to other microbatches)."""
    comp = np.flatnonzero((r.kind == 0) & np.isin(r.phase, (_FORWARD, _BACKWARD)))
    out = np.zeros(len(rows), np.int8)
    if not len(comp) or not len(rows) or r.device != "cpu":
        return out
    if sends:  # the compute that ended last before the send was issued
        comp = comp[np.argsort(r.start_ns[comp] + r.dur_ns[comp], kind="stable")]
        j = np.searchsorted(r.start_ns[comp] + r.dur_ns[comp], r.issue_ns[rows], side="right") - 1
    else:  # the compute that began first after the receive completed
        comp = comp[np.argsort(r.start_ns[comp], kind="stable")]
        j = np.searchsorted(r.start_ns[comp], r.start_ns[rows] + r.dur_ns[rows], side="left")
    ok = (j >= 0) & (j < len(comp))
    c = comp[np.clip(j, 0, len(comp) - 1)]
    ok &= r.step[c] == r.step[rows]
    out[ok] = r.phase[c[ok]]
    return out


def _clock_shift(ranks: list[RankOps]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each rank's clock offset (ns) as the importer fits it from the collectives matched so far,
    how far it may be off (its domain's ``match.clock_spread``), and its clock domain."""
    from laggard.io.kineto.match import clock_domains, clock_offsets, clock_spread, match_collectives

    dom = clock_domains(ranks)
    if dom.max(initial=0) == 0:
        return np.zeros(len(ranks)), np.zeros(len(ranks)), dom
    sizes = np.array([len(r.step) for r in ranks])
    labels: dict[str, int] = {}
    group_c = np.concatenate([np.array([labels.setdefault(g, len(labels)) for g in r.groups] + [-1],
                                       dtype=np.int64)[r.group] for r in ranks])
    cat = np.concatenate
    step, start, size_b = (cat([r.step for r in ranks]), cat([r.start_ns for r in ranks]),
                           cat([r.size_bytes for r in ranks]))
    end = start + cat([r.dur_ns for r in ranks])
    rank_of = np.repeat(np.arange(len(ranks)), sizes)
    with warnings.catch_warnings():  # the job's own fit, later, says what is wrong with it
        warnings.simplefilter("ignore")
        seq, _ = match_collectives(group_c, list(labels), cat([r.meta_seq for r in ranks]), start, step, rank_of,
                                   size_b)
        op_dom = np.repeat(dom, sizes)
        off = clock_offsets(op_dom, group_c, seq, step, end, int(dom.max()) + 1)
        spread = clock_spread(op_dom, group_c, seq, step, end, off)
    return off[dom], spread[dom], dom


# ---------------------------------------------------------------- pairing two ranks


def _dense(step: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step of ``steps``: the indices of ``step`` (sorted by step) in it, padded with -1 to
    (num_steps, most per step), and how many each step has."""
    t = np.searchsorted(steps, step)
    ok = (t < len(steps)) & (steps[np.minimum(t, len(steps) - 1)] == step)
    idx = np.flatnonzero(ok)
    t = t[ok]
    count = np.bincount(t, minlength=len(steps))
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    pos = np.arange(len(idx)) - first[t]
    out = np.full((len(steps), max(int(count.max(initial=0)), 1)), -1, np.int64)
    out[t, pos] = idx
    return out, count


def _embed(full: _Side, part: _Side, full_sends: bool, tol: float = _TOL_NS
           ) -> tuple[float, np.ndarray, np.ndarray] | None:
    """Each transfer of ``full`` paired with one of ``part`` in the same step, order kept, breaking
    no rule (sizes, causality within ``tol``) at the least summed cost (see the module docstring):
    (summed cost, full indices, part indices), or None when no such pairing exists. One dynamic
    programme over all steps at once, one pass per position in a step."""
    if not len(full.rows):
        return 0.0, np.zeros(0, np.int64), np.zeros(0, np.int64)
    steps = np.unique(full.step)
    F, n = _dense(full.step, steps)
    P, m = _dense(part.step, steps)
    if (m < n).any():
        return None
    fi, pj = np.maximum(F, 0), np.maximum(P, 0)
    s_side, r_side = (full, part) if full_sends else (part, full)
    s_idx, r_idx = (fi[:, :, None], pj[:, None, :]) if full_sends else (pj[:, None, :], fi[:, :, None])
    s_on, s_off, r_on, r_off = s_side.issue[s_idx], s_side.end[s_idx], r_side.issue[r_idx], r_side.end[r_idx]
    apart = np.maximum(np.maximum(r_on - s_off, s_on - r_off), 0)  # 0: the two calls overlap
    w_s, w_r = s_side.way[s_idx], r_side.way[r_idx]
    pay = (apart + _END_WEIGHT * np.abs(r_off - s_off).astype(np.float64)
           + _WAY_COST_NS * ((w_s > 0) & (w_r > 0) & (w_s != w_r)))  # activations arrive as activations
    bad = r_off < s_on - tol  # received before it was sent
    sz_s, sz_r = s_side.size[s_idx], r_side.size[r_idx]
    bad |= (sz_s >= 0) & (sz_r >= 0) & (sz_s != sz_r)
    bad |= (F[:, :, None] < 0) | (P[:, None, :] < 0)
    cost = np.where(bad, np.inf, pay)  # (steps, full position, part position)
    T, width = len(steps), P.shape[1] + 1
    D = np.zeros((T, width))
    hist = []
    for i in range(F.shape[1]):  # D[:, j]: least cost of pairing the first i+1 with the first j
        cand = np.full((T, width), np.inf)
        cand[:, 1:] = D[:, :-1] + cost[:, i, :]
        hist.append(cand)
        D = np.where((i < n)[:, None], np.minimum.accumulate(cand, axis=1), D)
    total = D[np.arange(T), m]
    if not np.isfinite(total).all():
        return None
    pick = np.full(F.shape, -1, np.int64)
    j = m.copy()
    cols = np.arange(width)[None, :]
    for i in range(F.shape[1] - 1, -1, -1):  # back from the last position: where each one went
        act = i < n
        masked = np.where(cols <= j[:, None], hist[i], np.inf)
        jj = np.argmax(masked == masked.min(axis=1)[:, None], axis=1)
        pick[act, i] = P[act, jj[act] - 1]
        j = np.where(act, jj - 1, j)
    keep = F >= 0
    return float(total.sum()), F[keep], pick[keep]


@dataclass(slots=True)
class _Link:
    cost_ns: float  # mean cost of its pairs
    pairs: Pairs
    used_send: np.ndarray  # of the next rank: indices into its remaining sends / receives
    used_recv: np.ndarray
    # per transfer of this rank (its sends, then its receives, in order): from the send's issue to the
    # receive's end, the data's way from one end to the other (``_nearest``)
    latency: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _link(me: tuple[_Side, _Side], nxt: tuple[_Side, _Side], tol: float = _TOL_NS, other_host: bool = False
          ) -> _Link | None:
    """All of ``me``'s remaining transfers with ``nxt``: its sends to ``nxt``'s receives and its
    receives from ``nxt``'s sends, or None when they do not pair up. On ``other_host`` the pairing
    is also tried on ``nxt``'s clock as the transfers themselves set it (``_transfer_shift``); the
    one that costs less is kept."""
    best = _link_on(me, nxt, tol)
    if not other_host or (best is not None and best.cost_ns <= _COST_FLOOR_NS):
        return best  # (on the fitted clocks the pairs' calls already overlap)
    shift = _transfer_shift(me, nxt)
    if not shift:
        return best
    moved = _link_on(me, (nxt[0].shifted(shift), nxt[1].shifted(shift)), tol)
    return moved if best is None or (moved is not None and moved.cost_ns < best.cost_ns) else best


def _transfer_shift(me: tuple[_Side, _Side], nxt: tuple[_Side, _Side]) -> float:
    """The shift (ns) of ``nxt``'s clock that lets the most of its transfers with ``me`` overlap
    the other end's call, as a blocking transfer's two calls do, from a pairing by order, counts
    and cost alone (no causality rule): 0 when they do not pair up.

    The collectives' fit can be off by more than its spread says: a rank that leaves every
    collective late (descheduled on a busy host) biases it, measured 3 ms with a spread of 0.15 ms
    on a real two-host pipeline, which made the true neighbour's receives seem to complete before
    their sends. Transfers both ways bracket the shift, so a rank that is not the neighbour finds
    no shift that lets both directions overlap (its forward transfers want it one way, its
    backward ones the other way). The pairing it starts from is on the fitted clocks, so a fit off
    by more than about half the time between a rank's transfers takes wrong partners and the shift
    is not found (a synthetic 2-microbatch stage 20 ms apart: found up to 10 ms off, not at 15)."""
    out = _embed(me[0], nxt[1], True, np.inf)
    back = _embed(me[1], nxt[0], False, np.inf)
    if out is None or back is None or not len(out[1]) + len(back[1]):
        return 0.0
    s, r = me[0], nxt[1]  # me sends; nxt's receive moved by d overlaps it: d in [s_on - r_off, s_off - r_on]
    lo = [s.issue[out[1]] - r.end[out[2]]]
    hi = [s.end[out[1]] - r.issue[out[2]]]
    r, s = me[1], nxt[0]  # nxt sends: its call moved by d overlaps me's receive: d in [r_on - s_off, r_off - s_on]
    lo.append(r.issue[back[1]] - s.end[back[2]])
    hi.append(r.end[back[1]] - s.issue[back[2]])
    return _most_covered(np.concatenate(lo).astype(np.float64), np.concatenate(hi).astype(np.float64))


def _most_covered(lo: np.ndarray, hi: np.ndarray) -> float:
    """The middle of the stretch that the most intervals [lo, hi] cover (of several such, the one
    nearest 0: the collectives' fit is kept where the transfers do not say otherwise)."""
    at = np.concatenate([lo, hi])
    step = np.concatenate([np.ones(len(lo)), -np.ones(len(hi))])
    order = np.lexsort((-step, at))  # at one point an interval opens before another closes
    at, depth = at[order], np.cumsum(step[order])
    tops = np.flatnonzero(depth == depth.max())
    mids = (at[tops] + at[np.minimum(tops + 1, len(at) - 1)]) / 2
    return float(mids[np.argmin(np.abs(mids))])


def _link_on(me: tuple[_Side, _Side], nxt: tuple[_Side, _Side], tol: float) -> _Link | None:
    out = _embed(me[0], nxt[1], True, tol)
    if out is None:
        return None
    back = _embed(me[1], nxt[0], False, tol)
    if back is None:
        return None
    num = len(out[1]) + len(back[1])
    pairs = Pairs()
    pairs.add(me[0].rank, nxt[0].rank, me[0].rows[out[1]], nxt[1].rows[out[2]])
    pairs.add(nxt[0].rank, me[0].rank, nxt[0].rows[back[2]], me[1].rows[back[1]])
    latency = np.empty(len(me[0].rows) + len(me[1].rows))
    latency[out[1]] = nxt[1].end[out[2]] - me[0].issue[out[1]]
    latency[len(me[0].rows) + back[1]] = me[1].end[back[1]] - nxt[0].issue[back[2]]
    return _Link(cost_ns=(out[0] + back[0]) / max(num, 1), pairs=pairs, used_send=back[2], used_recv=out[2],
                 latency=latency)


def _left(side: _Side, used: np.ndarray) -> _Side:
    keep = np.ones(len(side.rows), bool)
    keep[used] = False
    return side.take(keep)


def apply_pairs(ranks: list[RankOps], pairs: Pairs) -> None:
    """Label matched transfers as the trace's own peers would: group ``p2p:<src>><dst>``, kind,
    peer (both ends then share (step, group, order in the step), which ``match`` pairs)."""
    by_rank = {int(r.rank): r for r in ranks}  # type: ignore[arg-type]
    for src, dst, s_rows, r_rows in zip(pairs.src, pairs.dst, pairs.send_rows, pairs.recv_rows, strict=True):
        label = f"p2p:{src}>{dst}"
        for me, rows, kind, peer in ((src, s_rows, KIND_SEND, dst), (dst, r_rows, KIND_RECV, src)):
            r = by_rank[me]
            if label not in r.groups:
                r.groups.append(label)
            r.group[rows] = r.groups.index(label)
            r.kind[rows] = kind
            r.peer[rows] = peer
