"""Which rank each trace of a profiler-traced job is, and that the traces come from one job: one
rank per file, the same world size and backend, recorded together, over common ``ProfilerStep#N``
numbers (steps not traced on every rank are dropped, with a warning)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from laggard.errors import LaggardError, LaggardWarning
from laggard.io.kineto.rank import RankOps

# traces whose spans are further apart than this were not recorded together
_MAX_APART_S = 300.0


def identify(ranks: list[RankOps]) -> None:
    """Each rank from ``distributedInfo``, else from ``rank<N>`` in its file name (with a warning); one
    trace per rank."""
    for r in ranks:
        if r.rank is not None:
            continue
        m = re.search(r"rank[-_]?(\d+)", Path(r.path).name, re.IGNORECASE)
        if m:
            r.rank = int(m.group(1))
            warnings.warn(
                f"{r.path}: no rank in distributedInfo; took rank {r.rank} from the file name",
                LaggardWarning, stacklevel=3
            )
        elif len(ranks) == 1:
            r.rank = 0
            warnings.warn(
                f"{r.path}: no rank in distributedInfo nor in the file name; analyzed as rank 0",
                LaggardWarning, stacklevel=3
            )
        else:
            raise LaggardError(
                f"{r.path}: cannot tell which rank this trace is (no distributedInfo.rank, "
                "no 'rank<N>' in the file name)"
            )
    by_rank: dict[int, str] = {}
    for r in ranks:
        assert r.rank is not None
        if r.rank in by_rank:
            raise LaggardError(f"{by_rank[r.rank]} and {r.path} both claim rank {r.rank}; give one trace per rank")
        by_rank[r.rank] = r.path


def check_same_job(ranks: list[RankOps]) -> None:
    """LaggardError when the traces cannot come from one job and one profiling window."""
    ws = {r.world_size for r in ranks if r.world_size is not None}
    if len(ws) > 1:
        a = next(r for r in ranks if r.world_size == min(ws))
        b = next(r for r in ranks if r.world_size == max(ws))
        raise LaggardError(
            f"ranks from different jobs: {a.path} says world_size {a.world_size}, {b.path} says {b.world_size}"
        )
    for r in ranks:
        if r.world_size is not None and r.rank is not None and r.rank >= r.world_size:
            raise LaggardError(f"{r.path}: rank {r.rank} is not below the trace's world_size {r.world_size}")
    backends = {r.backend for r in ranks if r.backend}
    if len(backends) > 1:
        raise LaggardError("ranks from different jobs: the traces use different backends "
                           f"({', '.join(sorted(backends))})")
    if len(ranks) > 1 and all(r.base_ns is not None for r in ranks) and all(len(r.start_ns) for r in ranks):
        lo = np.array([r.start_ns.min() for r in ranks], dtype=np.float64)
        hi = np.array([(r.start_ns + r.dur_ns).max() for r in ranks], dtype=np.float64)
        if lo.max() - hi.min() > _MAX_APART_S * 1e9:
            a, b = int(np.argmin(hi)), int(np.argmax(lo))
            raise LaggardError(
                f"ranks from different jobs or profiling runs: {ranks[b].path} starts "
                f"{(lo[b] - hi[a]) / 1e9:.0f} s after {ranks[a].path} ends"
            )
    steps = [set(np.unique(r.step).tolist()) for r in ranks]
    if len(ranks) > 1 and all(steps) and not set.intersection(*steps):
        a, b = _disjoint_pair(steps)
        raise LaggardError(
            f"ranks from different jobs or profiling windows: {ranks[a].path} has steps {_span(steps[a])}, "
            f"{ranks[b].path} has steps {_span(steps[b])} (no step in common)"
        )


def _disjoint_pair(steps: list[set[int]]) -> tuple[int, int]:
    for i in range(len(steps)):
        for j in range(i + 1, len(steps)):
            if not steps[i] & steps[j]:
                return i, j
    return 0, 1


def _span(s: set[int]) -> str:
    return f"{min(s)}-{max(s)}" if len(s) > 1 else str(min(s))


def common_steps(ranks: list[RankOps]) -> list[RankOps]:
    """The ranks' ops in the steps every rank traced."""
    if len(ranks) < 2:
        return ranks
    steps = [set(np.unique(r.step).tolist()) for r in ranks]
    common = set.intersection(*steps)
    extra = set.union(*steps) - common
    if extra:
        warnings.warn(
            f"skipped {len(extra)} step(s) not traced on every rank: {', '.join(str(s) for s in sorted(extra)[:8])}"
            + (" ..." if len(extra) > 8 else ""),
            LaggardWarning,
            stacklevel=3,
        )
        ranks = [_subset(r, np.isin(r.step, sorted(common))) for r in ranks]
    if not common:
        raise LaggardError("no ProfilerStep#N is traced on every rank; nothing to analyze")
    return ranks


def _subset(r: RankOps, keep: np.ndarray) -> RankOps:
    """The ops of ``r`` in ``keep`` (dependencies on dropped ops are dropped)."""
    new_idx = np.full(len(keep), -1, np.int64)
    new_idx[keep] = np.arange(int(keep.sum()))
    owner = np.repeat(np.arange(len(keep)), np.diff(r.dep_ptr))
    ok = keep[owner] & (new_idx[r.dep_idx] >= 0)
    dst, src = new_idx[owner[ok]], new_idx[r.dep_idx[ok]]
    n = int(keep.sum())
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    order = np.argsort(dst, kind="stable")
    fields = {}
    for f in ("step", "stream", "name", "kind", "start_ns", "dur_ns", "issue_ns", "group", "meta_seq", "size_bytes",
              "peer", "has_deps", "phase", "microbatch", "seq_count", "seq_tokens"):
        fields[f] = getattr(r, f)[keep]
    out = RankOps(**{**{k: getattr(r, k) for k in r.__slots__ if k not in fields}, **fields,
                     "dep_ptr": ptr, "dep_idx": src[order]})  # type: ignore[attr-defined]
    return out
