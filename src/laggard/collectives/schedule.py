"""Round-by-round communication schedules: StragglAR's two phases and the ring baseline.

Pure numpy/python (no torch): the verifier and the CLI use these without starting torch.

Labels. A schedule speaks of *labels*, not ranks: a StragglAR schedule for ``n`` ranks has the on-time
labels ``0..n-2`` and the straggler label ``n-1``; the runtime maps labels to the ranks of the process
group when it knows who the straggler is. The buffer is cut into ``n-1`` chunks; after phase 1 (a ring
ReduceScatter among the on-time labels) label ``i`` holds the on-time partial sum of chunk ``i``.

Phase 2 (after the straggler arrives). In each of the first ``n-1`` rounds the straggler *swaps* one
chunk with its owner: it sends its own contribution to chunk ``i`` and receives the partial sum of chunk
``i``; both add, and chunk ``i`` is final at two places. From then on chunk ``i`` is only copied. Every
rank sends at most one chunk and receives at most one chunk per round.

Construction for ``n = 2^k`` (meets the lower bound ``n-2+log2(n)`` rounds). Give the straggler the
vector 0 of GF(2)^k and on-time label ``i`` the vector ``i+1``. Let ``a`` be a primitive element of
GF(2^k) and ``D_r = a^(r-1)``; any ``k`` consecutive ``D_r`` are a basis, and ``D_1..D_{n-1}`` run
through every non-zero vector once. In round ``r`` every rank ``x`` is paired with ``x XOR D_r``; the
straggler's partner ``D_r`` is the one it swaps with. A chunk finalised in round ``t`` is held (on time)
by ``D_t + span(D_{t+1}..D_{r-1})`` before round ``r``, and every holder forwards it to its partner.
Writing the basis ``e_j = D_{r-j}``, the chunk of age ``j`` is held exactly by the vectors whose highest
non-zero coordinate is ``j``: the holder sets of the ``k`` chunks in flight partition the on-time ranks,
so nobody ever has to send two chunks in a round, and each chunk reaches every rank ``k`` rounds after
it is final. The straggler, idle after its last swap, joins the broadcast of the last chunk, which then
needs only ``k-1`` more rounds: ``(n-1) + (k-1) = n-2+log2(n)`` rounds in all.

Other ``n`` (odd or not a power of two): a greedy synthesis (most urgent chunk first, a few
deterministic random tie-breaks, keep the shortest), verified like the rest; it stays within a few
rounds of the lower bound ``n-2+ceil(log2(n))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from laggard.errors import LaggardError

MAX_RANKS = 4096
# Rank counts above this use only the closed form for the round count (the greedy is O(n^3)).
MAX_GREEDY_RANKS = 256
_NUM_GREEDY_TRIES = 6


@dataclass(kw_only=True, slots=True)
class Schedule:
    """Transfers grouped into rounds, as flat arrays (one row per transfer).

    ``reduce[j]`` true means the receiver adds the received chunk to its own copy; false means the
    received chunk overwrites it. Within a round all sends read the values from before the round.
    """

    name: str
    num_ranks: int
    num_chunks: int
    num_rounds: int
    round_idx: np.ndarray  # int32, 0-based round of each transfer
    src: np.ndarray  # int32 label
    dst: np.ndarray  # int32 label
    chunk: np.ndarray  # int32 chunk index
    reduce: np.ndarray  # bool

    @property
    def num_transfers(self) -> int:
        return int(self.src.size)

    def round_slices(self) -> list[slice]:
        """Transfers of round ``r`` are ``arrays[slices[r]]`` (rows are sorted by round)."""
        bounds = np.searchsorted(self.round_idx, np.arange(self.num_rounds + 1))
        return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def chunks_received(self) -> np.ndarray:
        """Number of chunks each label receives over the whole schedule."""
        return np.bincount(self.dst, minlength=self.num_ranks)


@dataclass(kw_only=True, slots=True)
class RankPlan:
    """One label's view of a schedule: per round whom it sends to / receives from (-1: nobody)."""

    send_peer: np.ndarray
    send_chunk: np.ndarray
    recv_peer: np.ndarray
    recv_chunk: np.ndarray
    recv_reduce: np.ndarray

    @property
    def num_rounds(self) -> int:
        return int(self.send_peer.size)


def rank_plan(schedule: Schedule, label: int) -> RankPlan:
    """Extract one label's sends and receives, round by round (vectorised)."""
    r = schedule.num_rounds
    send_peer = np.full(r, -1, np.int32)
    send_chunk = np.full(r, -1, np.int32)
    recv_peer = np.full(r, -1, np.int32)
    recv_chunk = np.full(r, -1, np.int32)
    recv_reduce = np.zeros(r, bool)
    s = schedule.src == label
    send_peer[schedule.round_idx[s]] = schedule.dst[s]
    send_chunk[schedule.round_idx[s]] = schedule.chunk[s]
    d = schedule.dst == label
    recv_peer[schedule.round_idx[d]] = schedule.src[d]
    recv_chunk[schedule.round_idx[d]] = schedule.chunk[d]
    recv_reduce[schedule.round_idx[d]] = schedule.reduce[d]
    return RankPlan(send_peer=send_peer, send_chunk=send_chunk, recv_peer=recv_peer,
                    recv_chunk=recv_chunk, recv_reduce=recv_reduce)


def check_num_ranks(num_ranks: int, *, minimum: int = 2, what: str = "StragglAR") -> int:
    """Validate a rank count given by a user; one-line ``LaggardError`` otherwise."""
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int | np.integer):
        raise LaggardError(f"{what}: the number of ranks must be an integer, got {num_ranks!r}")
    if num_ranks < minimum:
        raise LaggardError(f"{what}: needs at least {minimum} ranks, got {num_ranks}")
    if num_ranks > MAX_RANKS:
        raise LaggardError(f"{what}: at most {MAX_RANKS} ranks are supported, got {num_ranks}")
    return int(num_ranks)


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def optimal_rounds(num_ranks: int) -> int:
    """Lower bound on phase-2 rounds: ``n-1`` swaps, then the last chunk doubles from 2 holders to n.

    Equals ``n-2+log2(n)`` for powers of two, where the construction meets it.
    """
    n = check_num_ranks(num_ranks)
    return n - 2 + math.ceil(math.log2(n))


def _from_rows(name: str, num_ranks: int, num_chunks: int, num_rounds: int, rows: list[tuple]) -> Schedule:
    arr = np.array(rows, dtype=np.int64).reshape(-1, 5)
    order = np.argsort(arr[:, 0], kind="stable")
    arr = arr[order]
    return Schedule(name=name, num_ranks=num_ranks, num_chunks=num_chunks, num_rounds=num_rounds,
                    round_idx=arr[:, 0].astype(np.int32), src=arr[:, 1].astype(np.int32),
                    dst=arr[:, 2].astype(np.int32), chunk=arr[:, 3].astype(np.int32),
                    reduce=arr[:, 4].astype(bool))


# ---------------------------------------------------------------------------------------------- ring


def ring_reduce_scatter_schedule(num_ranks: int) -> Schedule:
    """Ring ReduceScatter of ``num_ranks`` chunks over labels ``0..num_ranks-1``: label ``p`` ends
    with the full sum of chunk ``p`` after ``num_ranks-1`` rounds.

    In round ``s`` label ``p`` sends chunk ``p-s-1`` to ``p+1`` and adds chunk ``p-s-2`` from ``p-1``.
    """
    m = int(num_ranks)
    rows = []
    for s in range(m - 1):
        for p in range(m):
            rows.append((s, p, (p + 1) % m, (p - s - 1) % m, 1))
    return _from_rows("ring-reduce-scatter", m, m, max(m - 1, 0), rows)


def ring_allreduce_schedule(num_ranks: int) -> Schedule:
    """Ring AllReduce: the ReduceScatter above, then an AllGather of ``n-1`` rounds (copies)."""
    n = check_num_ranks(num_ranks, what="ring AllReduce")
    rs = ring_reduce_scatter_schedule(n)
    rows = list(zip(rs.round_idx.tolist(), rs.src.tolist(), rs.dst.tolist(), rs.chunk.tolist(),
                    rs.reduce.astype(int).tolist(), strict=True))
    for s in range(n - 1):
        for p in range(n):
            rows.append((n - 1 + s, p, (p + 1) % n, (p - s) % n, 0))
    return _from_rows("ring-allreduce", n, n, 2 * (n - 1), rows)


# ------------------------------------------------------------------------------------------ StragglAR


@dataclass(kw_only=True, slots=True)
class StragglarSchedule:
    """Both phases of StragglAR for ``num_ranks`` ranks (labels as in the module docstring)."""

    num_ranks: int
    method: str  # "gf2" (power-of-two construction) or "greedy"
    phase1: Schedule  # ring ReduceScatter among labels 0..n-2 (the straggler has no part in it)
    phase2: Schedule

    @property
    def straggler(self) -> int:
        return self.num_ranks - 1

    @property
    def num_chunks(self) -> int:
        return self.num_ranks - 1

    @property
    def num_rounds(self) -> int:
        """Phase-2 rounds: the part after the straggler arrives."""
        return self.phase2.num_rounds

    @property
    def optimal_rounds(self) -> int:
        return optimal_rounds(self.num_ranks)


def _primitive_poly(k: int) -> int:
    """The smallest primitive polynomial of degree ``k`` over GF(2), as a bit mask (bit k set)."""
    order = (1 << k) - 1
    primes = [p for p in range(2, order + 1) if order % p == 0 and all(p % q for q in range(2, math.isqrt(p) + 1))]

    def mulmod(a: int, b: int, poly: int) -> int:
        out = 0
        while b:
            if b & 1:
                out ^= a
            b >>= 1
            a <<= 1
            if a >> k & 1:
                a ^= poly
        return out

    def powmod(e: int, poly: int) -> int:
        result, base = 1, 2 % poly if k > 1 else 1
        while e:
            if e & 1:
                result = mulmod(result, base, poly)
            base = mulmod(base, base, poly)
            e >>= 1
        return result

    if k == 1:
        return 0b11
    for poly in range((1 << k) | 1, 1 << (k + 1), 2):
        if powmod(order, poly) == 1 and all(powmod(order // p, poly) != 1 for p in primes):
            return poly
    raise AssertionError(f"no primitive polynomial of degree {k}")  # cannot happen


def _directions(k: int, count: int) -> list[int]:
    """``D_1..D_count``: successive powers of a primitive element of GF(2^k) (as k-bit vectors)."""
    poly = _primitive_poly(k)
    out, x = [], 1
    for _ in range(count):
        out.append(x)
        x <<= 1
        if x >> k & 1:
            x ^= poly
    return out


def _phase2_gf2(n: int) -> Schedule:
    k = n.bit_length() - 1
    m = n - 1
    num_rounds = m + k - 1
    d = _directions(k, num_rounds)
    strag = n - 1

    def label(v: int) -> int:
        return strag if v == 0 else v - 1

    # holders[c] = set of vectors (including 0 for the straggler once it holds the final chunk)
    holders: list[set[int]] = [set() for _ in range(m)]
    rows: list[tuple] = []
    for r in range(1, num_rounds + 1):
        dr = d[r - 1]
        sends: list[tuple[int, int, int]] = []  # (from vector, to vector, chunk)
        for c in range(m):
            h = holders[c]
            if not h or len(h) == n:
                continue
            for x in h:
                y = x ^ dr
                if y in h:
                    continue
                if x == 0 and c != d[m - 1] - 1:
                    continue  # the straggler only helps with the last chunk (after its swaps)
                if y == 0:
                    continue  # the straggler needs nothing
                sends.append((x, y, c))
        if r <= m:  # swap with the partner of 0
            c = dr - 1
            rows.append((r - 1, strag, label(dr), c, 1))
            rows.append((r - 1, label(dr), strag, c, 1))
        senders = [s[0] for s in sends]
        receivers = [s[1] for s in sends]
        if len(set(senders)) != len(senders) or len(set(receivers)) != len(receivers):
            raise AssertionError(f"GF(2) construction conflict at n={n}, round {r}")  # proven impossible
        for x, y, c in sends:
            rows.append((r - 1, label(x), label(y), c, 0))
        for _x, y, c in sends:
            holders[c].add(y)
        if r <= m:
            holders[dr - 1].update((0, dr))
    return _from_rows("stragglar-phase2", n, m, num_rounds, rows)


def _phase2_greedy_once(n: int, rng: np.random.Generator | None) -> tuple[int, list[tuple]]:
    """One greedy run. Each round: the straggler swaps with the next on-time label; then chunks
    in order of fewest holders (ties at random) are forwarded from free holders (those with the fewest
    useful chunks first) to free ranks that lack them (those missing most first)."""
    m = n - 1
    strag = m
    have = np.zeros((n, m), bool)  # final chunk values held
    rows: list[tuple] = []
    r = 0
    swapped = 0
    limit = 4 * n + 8
    while swapped < m or not have[:m].all():
        free_send = np.ones(n, bool)
        free_recv = np.ones(n, bool)
        free_recv[strag] = False
        new: list[tuple[int, int]] = []
        if swapped < m:
            i = swapped
            free_send[[i, strag]] = False
            free_recv[i] = False
            rows.append((r, strag, i, i, 1))
            rows.append((r, i, strag, i, 1))
            new.append((i, i))
            new.append((strag, i))
            swapped += 1
        count = have[:m].sum(0)
        missing = (~have[:m]).sum(1)
        live = np.flatnonzero(have.any(0) & (count < m))
        noise = rng.random(live.size) if rng is not None else np.zeros(live.size)
        for c in live[np.lexsort((noise, count[live]))]:
            hs = np.flatnonzero(have[:, c] & free_send)
            ls = np.flatnonzero(~have[:m, c] & free_recv[:m])
            if hs.size == 0 or ls.size == 0:
                continue
            util = have[hs][:, live].sum(1)
            hs = hs[np.lexsort((rng.random(hs.size) if rng is not None else np.zeros(hs.size), util))]
            ls = ls[np.lexsort((rng.random(ls.size) if rng is not None else np.zeros(ls.size), -missing[ls]))]
            for u, v in zip(hs.tolist(), ls.tolist(), strict=False):
                free_send[u] = False
                free_recv[v] = False
                rows.append((r, u, v, int(c), 0))
                new.append((v, int(c)))
        for v, c in new:
            have[v, c] = True
        r += 1
        if r > limit:
            raise AssertionError(f"greedy schedule did not finish for n={n}")  # cannot happen
    return r, rows


def _phase2_greedy(n: int) -> Schedule:
    best: tuple[int, list[tuple]] | None = None
    for seed in range(_NUM_GREEDY_TRIES):
        rng = None if seed == 0 else np.random.default_rng(seed)
        got = _phase2_greedy_once(n, rng)
        if best is None or got[0] < best[0]:
            best = got
        if best[0] <= optimal_rounds(n):
            break
    assert best is not None
    return _from_rows("stragglar-phase2", n, n - 1, best[0], best[1])


@lru_cache(maxsize=64)
def stragglar_schedule(num_ranks: int) -> StragglarSchedule:
    """Both phases of StragglAR for ``num_ranks`` ranks (cached). ``LaggardError`` for bad ``n``."""
    n = check_num_ranks(num_ranks)
    if n > MAX_GREEDY_RANKS and not is_power_of_two(n):
        raise LaggardError(f"StragglAR: schedules for {n} ranks (not a power of two) are only synthesised "
                           f"up to {MAX_GREEDY_RANKS} ranks; use a power of two")
    method = "gf2" if is_power_of_two(n) else "greedy"
    phase2 = _phase2_gf2(n) if method == "gf2" else _phase2_greedy(n)
    phase1 = ring_reduce_scatter_schedule(n - 1)
    phase1.name = "stragglar-phase1"
    return StragglarSchedule(num_ranks=n, method=method, phase1=phase1, phase2=phase2)


def stragglar_rounds(num_ranks: int) -> int:
    """Phase-2 round count without building large schedules: closed form for powers of two."""
    n = check_num_ranks(num_ranks)
    if is_power_of_two(n):
        return optimal_rounds(n)
    return stragglar_schedule(n).num_rounds


def format_schedule(schedule: Schedule, *, straggler: int | None = None) -> list[str]:
    """One line per round: ``src->dst:chunk`` for copies, ``src<+>dst:chunk`` for swaps."""
    lines = []
    for r, sl in enumerate(schedule.round_slices()):
        src, dst, ch, red = (schedule.src[sl], schedule.dst[sl], schedule.chunk[sl], schedule.reduce[sl])
        items = []
        done = set()
        for j in range(src.size):
            a, b, c = int(src[j]), int(dst[j]), int(ch[j])
            if (a, b, c) in done:
                continue
            back = np.flatnonzero((src == b) & (dst == a) & (ch == c) & red)
            if red[j] and back.size:
                done.add((b, a, c))
                items.append(f"{_name(a, straggler)}<+>{_name(b, straggler)}:c{c}")
            else:
                items.append(f"{_name(a, straggler)}{'+>' if red[j] else '->'}{_name(b, straggler)}:c{c}")
        lines.append(f"round {r + 1:>3}: " + "  ".join(items))
    return lines


def _name(label: int, straggler: int | None) -> str:
    return "S" if straggler is not None and label == straggler else str(label)
