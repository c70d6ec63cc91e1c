"""What the traces of a profiler-traced job say about its parallel layout (``laggard.io.kineto.layout``
reads the layout from it): the process groups, with their roles where their descriptions name one,
the point-to-point transfers whose two ends are known, the ranks that send or receive at all, and
whether each rank's first transfer is a send."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.errors import LaggardError
from laggard.io.kineto.comm import KIND_RECV, KIND_SEND
from laggard.io.kineto.p2p import p2p_kind
from laggard.io.kineto.rank import RankOps

_ROLE_WORDS = {"pp": ("pipeline",), "dp": ("data",), "tp": ("tensor",)}
# descriptions naming these are combined or other groups (cp, ep, embeddings, tp x dp): no role
_NOT_A_ROLE = {"cp", "ep", "context", "expert", "embedding", "position", "and", "with", "amax"}


@dataclass(kw_only=True, slots=True)
class Evidence:
    """What the traces say about the layout."""

    ranks: list[int]
    groups: dict[str, dict[str, Any]]  # pg name -> {"desc", "ranks"} (union over the ranks' traces)
    edges: set[tuple[int, int]]  # (src, dst) of every p2p transfer with known ends
    p2p_ranks: set[int]  # ranks with any send/recv (ends known or not)
    first_send: dict[int, bool]  # rank -> its first transfer of its first step is a send
    role_groups: dict[str, list[list[int]]] = field(default_factory=dict)
    matched: bool = False  # edges come from transfers without peers, matched across ranks
    unmatched_why: str = ""  # why transfers without peers could not be matched


def evidence(ranks: list[RankOps]) -> Evidence:
    groups: dict[str, dict[str, Any]] = {}
    seen_in: dict[str, str] = {}
    for r in ranks:
        entries = [(str(p.get("pg_name")), p.get("pg_desc"), p.get("ranks")) for p in r.pg_config]
        entries += [(g, inf.get("desc"), inf.get("ranks")) for g, inf in r.group_info.items() if g != "?"]
        for name, desc, members in entries:
            if not isinstance(members, list) or not all(isinstance(x, int) for x in members):
                continue
            old = groups.get(name)
            if old is not None and old["ranks"] != list(members):
                raise LaggardError(
                    f"process groups overlap inconsistently: group {name!r} has ranks {old['ranks']} in "
                    f"{seen_in[name]} and {list(members)} in {r.path}")
            if old is None:
                groups[name] = {"desc": desc, "ranks": list(members)}
                seen_in[name] = r.path
            elif desc and not old["desc"]:
                old["desc"] = desc
    edges: set[tuple[int, int]] = set()
    p2p_ranks: set[int] = set()
    first_send: dict[int, bool] = {}
    for r in ranks:
        me = int(r.rank)  # type: ignore[arg-type]
        kind = r.kind
        send, recv = kind == KIND_SEND, kind == KIND_RECV
        for p in np.unique(r.peer[send]).tolist():
            edges.add((me, int(p)))
        for p in np.unique(r.peer[recv]).tolist():
            edges.add((int(p), me))
        p2p_of_name = np.array([p2p_kind(n) or "" for n in r.names] + [""], dtype=object)
        what = p2p_of_name[r.name]
        rows = np.flatnonzero(what != "")
        if len(rows):
            p2p_ranks.add(me)
            first_step = r.step[rows].min()
            rows = rows[r.step[rows] == first_step]
            first_send[me] = what[rows[np.argmin(r.start_ns[rows])]] == "send"
    return Evidence(ranks=[int(r.rank) for r in ranks], groups=groups, edges=edges,  # type: ignore[arg-type]
                    p2p_ranks=p2p_ranks, first_send=first_send, role_groups=_role_groups(groups))


def role_of(desc: str | None) -> str | None:
    """'pp', 'dp', 'tp' for a process-group description that names exactly one role, else None."""
    if not desc:
        return None
    low = desc.lower()
    words = set(re.split(r"[^a-z0-9]+", low))
    if words & _NOT_A_ROLE:
        return None
    found = {role for role, keys in _ROLE_WORDS.items() if role in words or any(k in low for k in keys)}
    return found.pop() if len(found) == 1 else None


def _role_groups(groups: dict[str, dict[str, Any]]) -> dict[str, list[list[int]]]:
    """Groups by role; those of one role must be disjoint or equal, and a pipeline group shares at
    most one rank with a DP or TP group."""
    out: dict[str, list[list[int]]] = {}
    names: dict[tuple[str, tuple[int, ...]], str] = {}
    for name, g in groups.items():
        role = role_of(g.get("desc"))
        if role is None or len(g["ranks"]) < 2:
            continue
        key = tuple(g["ranks"])
        if key in {tuple(x) for x in out.get(role, [])}:
            continue
        for other in out.get(role, []):
            if set(other) & set(key) and role == "dp":  # e.g. HSDP's replicate and shard groups cross
                out["dp-crossing"] = []
            elif set(other) & set(key):
                raise LaggardError(
                    f"process groups overlap inconsistently: {role} groups {names[(role, tuple(other))]!r} "
                    f"(ranks {other}) and {name!r} (ranks {list(key)}) share rank(s) "
                    f"{sorted(set(other) & set(key))} but differ")
        out.setdefault(role, []).append(list(key))
        names[(role, key)] = name
    if "dp-crossing" in out:  # DP groups of two kinds: no single DP group per rank to check against
        del out["dp-crossing"]
        out.pop("dp", None)
    for other_role in ("dp", "tp"):
        for a in out.get("pp", []):
            for b in out.get(other_role, []):
                both = set(a) & set(b)
                if len(both) > 1:
                    raise LaggardError(
                        f"process groups overlap inconsistently: ranks {sorted(both)} are in one pipeline group "
                        f"({a}) and one {other_role} group ({b}); ranks of one pipeline are on different stages")
    return out
