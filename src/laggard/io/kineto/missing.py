"""Ranks of a profiler-traced job that have no trace: which they are, and which traced ranks cannot
be analyzed without them (those sharing a pipeline with a missing rank)."""

from __future__ import annotations

from laggard.errors import LaggardError
from laggard.io.kineto.evidence import Evidence, evidence
from laggard.io.kineto.rank import RankOps


def missing_ranks(ranks: list[RankOps]) -> tuple[str | None, set[int]]:
    """Ranks of the job that have no trace: a warning naming them, and the given ranks to leave
    out. A pipeline cannot be replayed without one of its stages: the given ranks that share a
    pipeline with a missing rank (joined to it by send/recv or a pipeline process group) are left
    out and the complete pipelines analyzed; an error when none is complete. Collectives are then
    replayed among the ranks analyzed only."""
    present = {int(r.rank) for r in ranks}  # type: ignore[arg-type]
    declared = next((r.world_size for r in ranks if r.world_size is not None), None)
    if declared is None or declared <= len(present):
        return None, set()
    missing = sorted(set(range(declared)) - present)
    if not missing:
        return None, set()
    what = f"the job has {declared} ranks but {len(present)} trace(s) were given: no trace for rank(s) {_few(missing)}"
    ev = evidence(ranks)
    talk = sorted({(a, b) for a, b in ev.edges if (a in present) != (b in present)})
    if len(present) <= 1 or not talk:
        return f"{what}; collectives are replayed among the given ranks only", set()
    pairs = ", ".join(f"{a}->{b}" for a, b in talk[:6]) + (" ..." if len(talk) > 6 else "")
    drop = _pipeline_of(set(missing), ev) & present
    if drop == present:
        raise LaggardError(f"{what}; the traced ranks exchange send/recv with them ({pairs}), so the pipeline "
                           "cannot be replayed without them: pass every rank's trace")
    return (f"{what}; traced rank(s) {_few(sorted(drop))} share a pipeline with them (send/recv {pairs}) and are "
            "left out: "
            f"the analysis covers the complete pipelines (ranks {_few(sorted(present - drop))}) and replays "
            "their collectives among them only"), drop


def _few(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:8])) + (" ..." if len(xs) > 8 else "")


def _pipeline_of(seed: set[int], ev: Evidence) -> set[int]:
    """Every rank joined to ``seed`` by send/recv or by a pipeline process group."""
    nbrs: dict[int, set[int]] = {}
    links = list(ev.edges) + [(g[0], r) for g in ev.role_groups.get("pp", []) if g for r in g[1:]]
    for a, b in links:
        nbrs.setdefault(a, set()).add(b)
        nbrs.setdefault(b, set()).add(a)
    out, todo = set(seed), list(seed)
    while todo:
        for b in nbrs.get(todo.pop(), ()):
            if b not in out:
                out.add(b)
                todo.append(b)
    return out
