"""What a step says on its own, where there are too few steps to judge (a profiler often captures one).

Straggling is judged over steps (``DiagnoseConfig.min_steps``): one step cannot tell a steady
straggler from a one-off. It can still say who arrived late and what that cost. Per step, each
rank's **entry** (its first op's start after the earliest rank's) and its **arrival** at its first
collective (the op's start, against the other members' starts of the same collective); the rank that
arrives last, clearly after the next-to-last (``LATE_SHARE`` of the step, at least ``LATE_MIN_S``), is
late: by how much, the wait it caused there (the other members' waits for it, summed), and what came
before: how much later it began the step than the other members (the time before its first op is not
on the trace: the end of the step before, data loading, a host stall), or, where it began with them,
the untraced time between its ops or the op that took longest over the same op on the others.

These are findings of low confidence with no what-if (a replay of one step from t = 0 has no entry to
be late at), under the verdict "one step only" ("few steps only" for two): ``diagnose`` returns it
from its too-few-steps branch instead of "not enough to judge". A step where no rank is late names
no rank; a job without a collective that the ranks share says nothing (None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from laggard.results.diagnosis import Diagnosis, Finding
from laggard.results.onestep import Arrival, LateRank, OneStep

if TYPE_CHECKING:
    from laggard.diagnose.config import DiagnoseConfig
    from laggard.results.analysis import Analysis

# a rank is late when it reaches its first collective this share of the step after the next-to-last
# member, and at least LATE_MIN_S: one step has no step-to-step noise to judge against, so the bar sits
# above the lead a healthy last arrival takes on a shared host (a fifth of the step at most) and below
# the lateness of a host stall or of extra work ending the step before (a quarter of it and more);
# the traces it was read on: benchmarks/README.md ("one profiled step")
LATE_SHARE = 0.3
LATE_MIN_S = 1e-3
# the lateness is "from before the step" where the rank's late entry is at least this share of it
ENTRY_SHARE = 0.5


def one_step(res: Analysis, cfg: DiagnoseConfig, reason: str) -> Diagnosis | None:
    """The diagnosis of a job with fewer steps than ``cfg.min_steps`` but two workers or more: each
    step read on its own (see the module docstring); None when no step has a collective to read
    arrivals at. ``reason``: why the job cannot be judged, kept as the caveat."""
    base = res.base
    if base is None or res.num_workers < 2 or not res.steps:
        return None
    kinds = np.array(base.kinds + [""], dtype=object)[base.kind_code]
    traced = kinds != "host"  # (untraced gaps the engine modelled as ops: not ops of the trace)
    coll = (kinds == "collective") & (base.graph.op_group >= 0)
    if not coll.any():
        return None
    steps = [_step(res, k, traced, coll) for k in range(len(base.graph.steps))]
    read = [s for s in steps if s is not None]
    if not read:
        return None
    findings = _findings(res, read, cfg.min_steps)
    n = len(res.steps)
    caveat = (f"{reason}; read on its own, {'the step' if n == 1 else 'each step'} shows who arrived late "
              f"at the first collective, but one step cannot tell a steady straggler from a one-off: profile "
              f"at least {cfg.min_steps} steps to judge")
    return Diagnosis(verdict="one step only" if n == 1 else "few steps only", threshold=cfg.threshold,
                     findings=findings, reason=caveat, one_step=read)


def _step(res: Analysis, k: int, traced: np.ndarray, coll: np.ndarray) -> OneStep | None:
    base = res.base
    assert base is not None
    g = base.graph
    here = g.op_step == k
    ops = np.flatnonzero(here & traced)
    if not len(ops):
        return None
    rank, start, end = base.rank, base.start_s, base.end_s
    ranks = np.unique(rank[ops])
    if len(ranks) < 2:
        return None
    entry = {int(r): float(start[ops[rank[ops] == r]].min()) for r in ranks}
    t0 = min(entry.values())
    step_s = float(end[ops].max()) - t0
    first: dict[int, int] = {}  # rank -> its first collective op
    for i in np.flatnonzero(here & coll)[np.argsort(start[here & coll], kind="stable")]:
        first.setdefault(int(rank[i]), int(i))
    if len(first) < 2:
        return None
    arrivals, late = [], []
    threshold = max(LATE_MIN_S, LATE_SHARE * step_s)
    for grp in sorted({int(g.op_group[i]) for i in first.values()}):
        members = g.group_ops[g.group_ptr[grp]:g.group_ptr[grp + 1]]
        at = {int(rank[m]): float(start[m]) for m in members}
        if len(at) < 2:
            continue
        last_at = max(at.values())
        for r in sorted(at):
            if first.get(r) is not None and int(g.op_group[first[r]]) == grp:
                arrivals.append(Arrival(rank=r, entry_s=entry[r] - t0, arrival_s=at[r] - min(at.values()),
                                        waited_s=last_at - at[r]))
        order = sorted(at, key=at.get)
        L, second = order[-1], at[order[-2]]
        if at[L] - second >= threshold and first.get(L) is not None and int(g.op_group[first[L]]) == grp:
            late.append(_late(res, k, L, at, entry, ops, first[L]))
    return OneStep(step=int(g.steps[k]), step_s=step_s, threshold_s=threshold,
                   arrivals=sorted(arrivals, key=lambda a: a.rank), late=late)


def _late(res: Analysis, k: int, L: int, at: dict[int, float], entry: dict[int, float], ops: np.ndarray,
          coll_op: int) -> LateRank:
    """What came before rank ``L``'s late arrival at the collective its members ``at`` (rank -> start)."""
    base = res.base
    assert base is not None
    rank, start, end = base.rank, base.start_s, base.end_s
    names = np.array(base.names + [""], dtype=object)[base.name_code]
    others = [r for r in at if r != L]
    late_by = at[L] - max(at[r] for r in others)
    entry_late = entry[L] - float(np.median([entry[r] for r in others]))
    took = {r: at[r] - entry[r] for r in at}
    in_step = took[L] - float(np.median([took[r] for r in others]))
    before = {r: ops[(rank[ops] == r) & (start[ops] < at[r])] for r in at}
    gap = {r: took[r] - _busy(start[before[r]], np.minimum(end[before[r]], at[r])) for r in at}
    gap_late = gap[L] - float(np.median([gap[r] for r in others]))
    mine = before[L][np.argsort(start[before[L]], kind="stable")]
    last = [i for i in mine if i != coll_op]
    last_op = str(names[last[-1]]) if last else ""
    slow_op, excess = _slowest(names, start, end, before, L, others)
    where = f"at {names[coll_op]} (step {int(base.graph.steps[k])})"
    if entry_late >= ENTRY_SHARE * late_by:
        first_op = str(names[mine[0]]) if len(mine) else "its first op"
        words = (f"it began the step {1e3 * entry_late:.1f} ms after the others (its first op, {first_op}); what "
                 "delayed it ran before the step, outside the trace (the previous step's end, data loading, a host "
                 "stall)")
    elif gap_late >= max(excess, 0.0):
        words = (f"{1e3 * gap_late:.1f} ms more untraced time between its ops than the others before the "
                 f"collective (host work no op covers), its last op {last_op or 'none'}")
    elif slow_op:
        words = f"its {slow_op} took {1e3 * excess:.1f} ms longer than on the others; its last op {last_op or 'none'}"
    else:
        words = f"its ops up to the collective took {1e3 * in_step:.1f} ms longer than the others'"
    return LateRank(rank=L, step=int(base.graph.steps[k]), collective=f"{names[coll_op]}", late_by_s=late_by,
                    caused_wait_s=float(sum(at[L] - at[r] for r in others)), entry_s=entry_late, in_step_s=in_step,
                    gap_s=gap_late, last_op=last_op, slow_op=slow_op, slow_op_excess_s=excess,
                    before=f"{where}: {words}")


def _busy(start: np.ndarray, end: np.ndarray) -> float:
    """Seconds covered by the intervals (streams overlap: their union)."""
    if not len(start):
        return 0.0
    o = np.argsort(start, kind="stable")
    s, e = start[o], np.maximum.accumulate(end[o])
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > e[:-1]  # a new run where an interval starts after every earlier one ended
    runs = np.flatnonzero(new)
    return float(np.sum(np.maximum(np.maximum.reduceat(e, runs) - s[runs], 0.0)))


def _slowest(names: np.ndarray, start: np.ndarray, end: np.ndarray, before: dict[int, np.ndarray], L: int,
             others: list[int]) -> tuple[str, float]:
    """The op of rank ``L`` before the collective that took longest over the same op (name and
    occurrence) on the other members (their median): ("name", excess s), ("", 0) where none did."""
    def keyed(r: int) -> dict[tuple[str, int], float]:
        rows = before[r][np.argsort(start[before[r]], kind="stable")]
        seen: dict[str, int] = {}
        out = {}
        for i in rows:
            n = str(names[i])
            out[(n, seen.get(n, 0))] = float(end[i] - start[i])
            seen[n] = seen.get(n, 0) + 1
        return out

    mine, theirs = keyed(L), [keyed(r) for r in others]
    best, excess = "", 0.0
    for key, d in mine.items():
        ref = [t[key] for t in theirs if key in t]
        if ref and d - float(np.median(ref)) > excess:
            best, excess = key[0], d - float(np.median(ref))
    return best, excess


def _findings(res: Analysis, read: list[OneStep], min_steps: int) -> list[Finding]:
    """One low-confidence finding per late rank (its steps merged), latest arrival first."""
    base = res.base
    assert base is not None
    by_rank: dict[int, list[LateRank]] = {}
    for s in read:
        for x in s.late:
            by_rank.setdefault(x.rank, []).append(x)
    ranks, at = np.unique(base.rank, return_index=True)
    first = dict(zip(ranks.tolist(), at.tolist(), strict=True))
    out = []
    for r, xs in sorted(by_rank.items(), key=lambda kv: -max(x.late_by_s for x in kv[1])):
        i = first[r]
        worker = {"dp_rank": int(base.dp_rank[i]), "stage": int(base.pp_rank[i]), "rank": r}
        step_of = {s.step: s for s in read}
        ev = "; ".join(f"rank {r} reached {x.collective} {1e3 * x.late_by_s:.1f} ms after the next rank in step "
                       f"{x.step} ({100 * x.late_by_s / step_of[x.step].step_s:.0f}% of its "
                       f"{1e3 * step_of[x.step].step_s:.1f} ms), the others waiting {1e3 * x.caused_wait_s:.1f} ms "
                       f"for it in all; {x.before.split(': ', 1)[-1]}" for x in xs)
        out.append(Finding(
            cause="late-arrival", workers=[worker], steps=[x.step for x in xs], evidence=ev, confidence="low",
            fix=(f"profile more steps (at least {min_steps}) to tell a steady "
                 f"straggler from a one-off; if rank {r} is late in them too, look at what runs on it before the "
                 "step (data loading, host contention) or in the ops named"),
        ))
    return out


__all__ = ["ENTRY_SHARE", "LATE_MIN_S", "LATE_SHARE", "one_step"]
