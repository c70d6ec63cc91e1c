"""Matching collectives across ranks, per process group, by sequence id.

Every member of a process group calls its collectives in the same order, so the n-th collective
of a group (``collective_seq_id``) is one collective across its members, whatever the file names,
the moment of each dump or how much of each ring buffer is left (a wrapped buffer keeps its newest
entries and their sequence ids). Group members come from ``pg_config`` (laggard dumps and NCCL
ones); for plain gloo dumps, which have none, the default group ``0`` is the whole world and any
other group is the ranks that have entries of it (said in the notes).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from laggard.hang.dumps import Entry, RankDump

WORLD_GROUP = "0"  # the default process group's name in every dump


@dataclass(slots=True)
class GroupView:
    """One process group across the job's dumps."""

    name: str
    members: list[int]
    members_known: bool  # False: inferred from the entries (no pg_config)
    desc: str = ""
    entries: dict[int, dict[int, Entry]] = field(default_factory=dict)  # rank -> seq -> entry (collectives)
    top: dict[int, int | None] = field(default_factory=dict)  # rank -> highest seq entered (None: unknown)

    def present(self, dumps: dict[int, RankDump]) -> list[int]:
        return [r for r in self.members if r in dumps]

    def label(self) -> str:
        ranks = ",".join(str(r) for r in self.members[:16]) + ("..." if len(self.members) > 16 else "")
        desc = f" {self.desc}" if self.desc and self.desc != "undefined" else ""
        return f"group {self.name}{desc} (ranks {ranks})"


def world_size_of(dumps: list[RankDump]) -> tuple[int, bool]:
    """(world size, known): from laggard dumps or the default group's ranks, else max rank + 1."""
    sizes = [d.world_size for d in dumps if d.world_size]
    if sizes:
        return max(sizes), True
    world = [len(d.group_ranks[WORLD_GROUP]) for d in dumps if WORLD_GROUP in d.group_ranks]
    if world:
        return max(world), True
    return max(d.rank for d in dumps) + 1, False


def group_views(dumps: dict[int, RankDump], world_size: int) -> list[GroupView]:
    configured: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    seen: dict[str, set[int]] = {}
    for d in dumps.values():
        for g, ranks in d.group_ranks.items():
            configured.setdefault(g, set()).update(ranks)
            descs.setdefault(g, d.group_desc.get(g, ""))
        for e in d.entries:
            if not e.is_p2p:
                seen.setdefault(e.group, set()).add(d.rank)
    views: list[GroupView] = []
    for g in sorted(set(seen) | (set(configured) & set(seen)), key=lambda x: (len(x), x)):
        if g in configured:
            members, known = sorted(configured[g]), True
        elif g == WORLD_GROUP:
            members, known = list(range(world_size)), True
        else:
            members, known = sorted(seen[g]), False
        v = GroupView(name=g, members=members, members_known=known, desc=descs.get(g, ""))
        for r in v.present(dumps):
            d = dumps[r]
            per = {e.seq: e for e in d.entries if e.group == g and not e.is_p2p}
            v.entries[r] = per
            v.top[r] = max(per) if per else (None if d.wrapped else 0)
        views.append(v)
    return views


@dataclass(slots=True)
class Desync:
    group: GroupView
    seq: int
    culprits: list[int]  # the minority; empty when no signature has a strict majority
    sigs: dict[int, tuple]
    created_ns: int


def first_desync(views: list[GroupView]) -> Desync | None:
    """The earliest collective whose participants disagree on op, sizes or dtypes."""
    best: Desync | None = None
    for v in views:
        seqs = sorted({s for per in v.entries.values() for s in per})
        for s in seqs:
            here = {r: per[s] for r, per in v.entries.items() if s in per}
            if len(here) < 2:
                continue
            sigs = {r: e.sig for r, e in here.items()}
            if len(set(sigs.values())) == 1:
                continue
            counts: dict[tuple, int] = {}
            for sig in sigs.values():
                counts[sig] = counts.get(sig, 0) + 1
            top_sig, top_n = max(counts.items(), key=lambda kv: kv[1])
            majority = top_n * 2 > len(sigs)
            culprits = sorted(r for r, sig in sigs.items() if sig != top_sig) if majority else []
            created = min(e.created_ns for e in here.values())
            if best is None or created < best.created_ns:
                best = Desync(group=v, seq=s, culprits=culprits, sigs=sigs, created_ns=created)
            break  # later mismatches of this group follow from the first
    return best


def lateness(views: list[GroupView]) -> dict[int, list[float]]:
    """Per rank, how late it arrived (s after the median arrival) at each collective every present
    member of a group entered (arrival: the entry's creation time)."""
    out: dict[int, list[float]] = {}
    for v in views:
        ranks = [r for r in v.entries]
        if len(ranks) < 2:
            continue
        common = set.intersection(*(set(v.entries[r]) for r in ranks))
        for s in sorted(common):
            times = {r: v.entries[r][s].created_ns for r in ranks}
            med = statistics.median(times.values())
            for r, t in times.items():
                out.setdefault(r, []).append((t - med) / 1e9)
    return out
