"""Exact verifier for schedules: an integer simulation of who holds whose contribution.

State ``counts[label, chunk, origin]`` = how many times the contribution of ``origin`` to ``chunk`` is in
``label``'s copy of that chunk. A chunk is *final* when the row is all ones (every rank counted exactly
once: nothing lost, nothing added twice). Rules checked round by round:

* at most one send and one receive per label per round; no self-sends; labels and chunks in range;
* all sends read the values from before the round (the runtime posts them together);
* a label never receives a chunk by copy that it sends in the same round (the runtime receives copies
  in place, so this would be a read/write race);
* StragglAR phase 2 only: reductions happen only in swaps with the straggler, and a copy always
  carries a final chunk ("finalised at the swap, then only copied");
* at the end every label holds every chunk final.

Pure numpy; used by the tests for every n in 4..64 and by ``laggard collectives verify``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from laggard.collectives.schedule import Schedule, StragglarSchedule, optimal_rounds, stragglar_schedule


@dataclass(kw_only=True, slots=True)
class VerifyResult:
    """Outcome of verifying one schedule (or both StragglAR phases)."""

    num_ranks: int
    num_rounds: int
    optimal_rounds: int | None
    errors: list[str] = field(default_factory=list)
    num_transfers: int = 0
    max_chunks_received: int = 0  # by any label, over the schedule (phase 2 for StragglAR)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def meets_bound(self) -> bool:
        return self.optimal_rounds is None or self.num_rounds <= self.optimal_rounds

    def to_json(self) -> dict:
        out: dict = {"ranks": self.num_ranks, "rounds": self.num_rounds, "optimal_rounds": self.optimal_rounds,
                     "ok": self.ok, "meets_bound": self.meets_bound}
        if self.errors:
            out["errors"] = self.errors[:10]
        return out


def simulate(schedule: Schedule, counts: np.ndarray, *, phase2_straggler: int | None = None,
             max_errors: int = 20) -> list[str]:
    """Apply ``schedule`` to ``counts`` in place; return the rule violations found (empty = fine)."""
    errors: list[str] = []
    n, c_max = schedule.num_ranks, schedule.num_chunks
    full = np.ones(counts.shape[2], dtype=counts.dtype)
    if (np.diff(schedule.round_idx) < 0).any() or (schedule.round_idx >= schedule.num_rounds).any():
        order = np.argsort(schedule.round_idx, kind="stable")
        schedule = dataclasses.replace(
            schedule, num_rounds=max(schedule.num_rounds, int(schedule.round_idx.max(initial=-1)) + 1),
            round_idx=schedule.round_idx[order], src=schedule.src[order], dst=schedule.dst[order],
            chunk=schedule.chunk[order], reduce=schedule.reduce[order])
    for r, sl in enumerate(schedule.round_slices()):
        src, dst, ch, red = (schedule.src[sl], schedule.dst[sl], schedule.chunk[sl], schedule.reduce[sl])
        where = f"round {r + 1}"
        bad = (src < 0) | (src >= n) | (dst < 0) | (dst >= n) | (ch < 0) | (ch >= c_max)
        if bad.any():
            errors.append(f"{where}: label or chunk out of range")
            break
        if (src == dst).any():
            errors.append(f"{where}: rank {int(src[src == dst][0])} sends to itself")
        for arr, what in ((src, "sends"), (dst, "receives")):
            cnt = np.bincount(arr, minlength=n)
            if (cnt > 1).any():
                errors.append(f"{where}: rank {int(np.argmax(cnt))} {what} {int(cnt.max())} chunks")
        copy = ~red
        sent = set(zip(src.tolist(), ch.tolist(), strict=True))
        for d, c in zip(dst[copy].tolist(), ch[copy].tolist(), strict=True):
            if (d, c) in sent:
                errors.append(f"{where}: rank {d} receives chunk {c} by copy while sending it")
        payload = counts[src, ch].copy()  # values before the round
        if phase2_straggler is not None:
            swap = (src == phase2_straggler) | (dst == phase2_straggler)
            if (red & ~swap).any():
                errors.append(f"{where}: a reduction outside a swap with the straggler")
            not_final = copy & ~(payload == full).all(axis=1)
            if not_final.any():
                j = int(np.flatnonzero(not_final)[0])
                errors.append(f"{where}: rank {int(src[j])} copies chunk {int(ch[j])} before it is final")
        counts[dst[red], ch[red]] += payload[red]
        counts[dst[copy], ch[copy]] = payload[copy]
        if len(errors) >= max_errors:
            break
    return errors


def _final_errors(counts: np.ndarray, labels: np.ndarray, what: str) -> list[str]:
    ok = (counts[labels] == 1).all(axis=2)
    if ok.all():
        return []
    li, ci = np.argwhere(~ok)[0]
    num_bad = int((~ok).sum())
    return [f"{what}: rank {int(labels[li])} ends with a wrong chunk {int(ci)} ({num_bad} wrong (rank, chunk) pairs)"]


def verify_schedule(schedule: Schedule) -> VerifyResult:
    """Verify an AllReduce schedule where every label starts with its own data (e.g. the ring)."""
    n = schedule.num_ranks
    counts = np.zeros((n, schedule.num_chunks, n), np.int64)
    counts[np.arange(n), :, np.arange(n)] = 1
    errors = simulate(schedule, counts)
    errors += _final_errors(counts, np.arange(n), schedule.name)
    return VerifyResult(num_ranks=n, num_rounds=schedule.num_rounds, optimal_rounds=None, errors=errors,
                        num_transfers=schedule.num_transfers,
                        max_chunks_received=int(schedule.chunks_received().max(initial=0)))


def verify_stragglar(schedule: StragglarSchedule | int) -> VerifyResult:
    """Verify both StragglAR phases for ``n`` ranks: phase 1 leaves label ``i`` with the on-time sum of
    chunk ``i`` (and the straggler untouched), phase 2 then completes the AllReduce."""
    sched = stragglar_schedule(schedule) if isinstance(schedule, int) else schedule
    n, m, strag = sched.num_ranks, sched.num_chunks, sched.straggler
    counts = np.zeros((n, m, n), np.int64)
    counts[np.arange(n), :, np.arange(n)] = 1
    errors: list[str] = []
    # Phase 1 runs on labels 0..n-2 only; embed it in the n-label state.
    p1 = sched.phase1
    if p1.num_ranks != m or p1.num_chunks != m:
        errors.append("phase 1: wrong shape")
    else:
        sub = counts[:m]
        errors += [f"phase 1 {e}" for e in simulate(p1, sub)]
        counts[:m] = sub
        expect = np.ones(n, np.int64)
        expect[strag] = 0
        if not (counts[np.arange(m), np.arange(m)] == expect).all():
            errors.append("phase 1: on-time rank i does not end with the on-time sum of chunk i")
    if (sched.phase2.src == strag).sum() + (sched.phase2.dst == strag).sum() < 2 * m:
        errors.append("phase 2: the straggler does not swap every chunk")
    errors += [f"phase 2 {e}" for e in simulate(sched.phase2, counts, phase2_straggler=strag)]
    errors += _final_errors(counts, np.arange(n), "phase 2")
    return VerifyResult(num_ranks=n, num_rounds=sched.num_rounds, optimal_rounds=optimal_rounds(n),
                        errors=errors, num_transfers=sched.phase2.num_transfers,
                        max_chunks_received=int(sched.phase2.chunks_received().max(initial=0)))
