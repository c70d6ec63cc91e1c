"""The parallel layout of a profiler-traced job: each rank's DP rank, pipeline stage and TP rank.

A PyTorch-profiler trace says nothing about the layout directly; it is read from what the trace
does say, strongest evidence first:

1. **process groups described by their role** (``pg_desc`` in ``distributedInfo.pg_config`` or in
   the collectives' metadata): Megatron's ``PIPELINE_MODEL_PARALLEL_GROUP`` / ``DATA_PARALLEL_GROUP``
   / ``TENSOR_MODEL_PARALLEL_GROUP``, torchtitan's ``mesh_pp`` / ``mesh_dp_*`` / ``mesh_tp``. A
   pipeline group lists its ranks by stage; a TP group by TP rank.
2. **point-to-point transfers** (send/recv peers from the collective metadata or the ``c10d::send``
   / ``c10d::recv_`` calls): ranks joined by transfers form one pipeline, a chain of stages; stage 0
   is the end whose first transfer of a step is a send (the forward activations).
3. **transfers without peers** and undescribed process groups that split the ranks into equal
   parts (e.g. ``dist.new_group`` per stage for the gradient all-reduce): each part is one stage,
   ordered by its lowest rank, and a rank's DP rank is its place in its group.
4. **transfers without peers matched across ranks** by order, counts and timing
   (``laggard.io.kineto.p2p``): the matched pairs form chains, read as in 2.

No transfer at all: a data-parallel job (every rank its own DP rank). Transfers whose structure
cannot be read: the same, with a warning that says why and ``source`` "unknown". ``--layout
dp=D,pp=P[,tp=T]`` (dimensions outermost first, as ranks are numbered) and a rank map file override
the inference; both are checked against the trace (transfers join neighbouring stages of one
pipeline; role groups hold ranks that differ only in their own dimension). Transfers without peers
are then matched along the layout's pipelines (``assign_peers``).

What the traces say is gathered by ``laggard.io.kineto.evidence``; ranks of the job without a trace
are ``laggard.io.kineto.missing``'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from laggard.errors import LaggardError
from laggard.io.kineto.chains import Search, find_chains, match_pipelines
from laggard.io.kineto.evidence import Evidence, evidence
from laggard.io.kineto.p2p import Peerless, apply_pairs
from laggard.io.kineto.rank import RankOps

DIMS = ("dp", "pp", "tp")


@dataclass(kw_only=True, slots=True)
class Layout:
    """Each traced rank's coordinates and how they were found."""

    dp_size: int
    pp_size: int
    tp_size: int
    coords: dict[int, tuple[int, int, int]]  # rank -> (dp, pp, tp)
    how: str  # where the layout comes from, for the user
    inferred: bool = True
    # where it comes from, for programs: "process-groups", "p2p-peers", "p2p-matched", "stage-groups",
    # "data-parallel" (no transfer), "given" (--layout, rank map), "unknown" (cannot infer: flat DP)
    source: str = "unknown"

    def line(self) -> str:
        dims = [f"dp {self.dp_size}", f"pp {self.pp_size}"] + ([f"tp {self.tp_size}"] if self.tp_size > 1 else [])
        return f"{' x '.join(dims)} ({self.how})"

    def to_json(self) -> dict[str, Any]:
        return {"dp": self.dp_size, "pp": self.pp_size, "tp": self.tp_size, "how": self.how, "source": self.source,
                "inferred": self.inferred, "ranks": {str(r): list(c) for r, c in sorted(self.coords.items())}}


# ---------------------------------------------------------------- inference


_GIVE = "every rank is analyzed as its own DP rank (give --layout or --rank-map)"


def infer_layout(ev: Evidence) -> tuple[Layout, str | None]:
    """The layout the trace shows, and a warning when it falls back to flat DP (why)."""
    ranks = ev.ranks
    pipes: list[list[int]] | None = None
    if ev.role_groups.get("pp"):
        # (the pipelines of ranks left out for a missing stage hold none of the ranks analyzed)
        pipes = [list(p) for p in ev.role_groups["pp"] if set(p) & set(ranks)]
        how, source = ("from process groups described as pipeline groups: " + ", ".join(map(str, pipes[:4])),
                       "process-groups")
        missing = sorted(set(ranks) - {r for p in pipes for r in p})
        pipes += [[r] for r in missing]
    elif ev.edges:
        pipes, why = _chains(ev)
        what = "matched send/recv" if ev.matched else "point-to-point transfers"
        if pipes is None:
            return (flat(ranks, f"{what} do not form pipelines ({why})"),
                    f"cannot infer the pipeline layout: {why}; {_GIVE}")
        if ev.matched:
            how, source = ("from send/recv matched across ranks by order, counts and timing (the trace names no "
                           "peer ranks): pipelines " + ", ".join(map(str, pipes[:4]))), "p2p-matched"
        else:
            how, source = "from point-to-point transfers: pipelines " + ", ".join(map(str, pipes[:4])), "p2p-peers"
    elif ev.p2p_ranks:
        stages = _stage_groups(ev)
        if stages is None:
            why = ("the traces' send/recv carry no peer ranks and no process group splits the ranks into "
                   "equal parts") + (f"; matching them across ranks failed: {ev.unmatched_why}"
                                     if ev.unmatched_why else "")
            return flat(ranks, "send/recv without peers"), f"cannot infer the pipeline layout: {why}; {_GIVE}"
        pipes = [[st[d] for st in stages] for d in range(len(stages[0]))]
        how, source = ("from per-stage process groups " + ", ".join(map(str, stages[:4]))
                       + " (send/recv without peers; stages ordered by lowest rank)"), "stage-groups"
    else:
        return flat(ranks, "no point-to-point transfers: data parallel", source="data-parallel"), None
    if pipes is not None and (len({len(p) for p in pipes}) != 1):
        lens = sorted({len(p) for p in pipes})
        return flat(ranks, "pipelines of unequal length"), (
            f"cannot infer the pipeline layout: the pipelines have {lens} stages; {_GIVE}")
    out = _from_pipelines(pipes, ev, how)
    out.source = source
    return out, None


def flat(ranks: Sequence[int], how: str, *, source: str = "unknown") -> Layout:
    """Every rank its own DP rank (its number: gaps for missing ranks); ``how`` starts with
    "unknown: " when the layout could not be inferred."""
    return Layout(dp_size=len(ranks), pp_size=1, tp_size=1, coords={r: (r, 0, 0) for r in ranks},
                  how=f"unknown: {how}" if source == "unknown" else how, source=source)


def _chains(ev: Evidence) -> tuple[list[list[int]] | None, str]:
    """Connected components of the transfer graph, each a chain ordered from stage 0."""
    nbrs: dict[int, set[int]] = {r: set() for r in ev.ranks}
    for a, b in ev.edges:
        if a == b or a not in nbrs or b not in nbrs:
            continue
        nbrs[a].add(b)
        nbrs[b].add(a)
    seen: set[int] = set()
    pipes: list[list[int]] = []
    for r in ev.ranks:
        if r in seen:
            continue
        comp, todo = [], [r]
        seen.add(r)
        while todo:
            x = todo.pop()
            comp.append(x)
            for y in nbrs[x] - seen:
                seen.add(y)
                todo.append(y)
        ends = sorted(x for x in comp if len(nbrs[x]) <= 1)
        edges = sum(len(nbrs[x]) for x in comp) // 2
        if len(comp) > 1 and (len(ends) != 2 or edges != len(comp) - 1):
            return None, f"ranks {sorted(comp)} exchange transfers but not as a chain of stages"
        start = ends[0]
        if len(comp) > 1 and not ev.first_send.get(start, True) and ev.first_send.get(ends[1], False):
            start = ends[1]  # stage 0 sends first (its forward activations)
        chain, prev = [start], None
        while len(chain) < len(comp):
            nxt = next(iter(nbrs[chain[-1]] - {prev} - set(chain)))
            prev = chain[-1]
            chain.append(nxt)
        pipes.append(chain)
    return pipes, ""


def _stage_groups(ev: Evidence) -> list[list[int]] | None:
    """Undescribed (or DP-described) process groups splitting the ranks into equal parts of 2+."""
    n = len(ev.ranks)
    traced = set(ev.ranks)
    cands = {tuple(sorted(g["ranks"])) for g in ev.groups.values() if 1 < len(g["ranks"]) < n}
    for size in sorted({len(c) for c in cands}):
        parts = sorted((list(c) for c in cands if len(c) == size), key=min)
        if len(parts) * size == n and {r for p in parts for r in p} == traced:
            return parts
    return None


def _from_pipelines(pipes: list[list[int]], ev: Evidence, how: str) -> Layout:
    """DP/TP coordinates of the pipelines: TP from groups described as tensor parallel, else one
    DP rank per pipeline, in the order of their first-stage ranks."""
    pipes = sorted(pipes, key=lambda p: p[0])
    tp_of: dict[int, tuple[int, int]] = {}  # rank -> (tp group index, tp rank)
    for gi, g in enumerate(ev.role_groups.get("tp", [])):
        for t, r in enumerate(g):
            tp_of[r] = (gi, t)
    tp_size = 1
    if tp_of and all(p[0] in tp_of for p in pipes):
        sizes = {len(g) for g in ev.role_groups["tp"]}
        tp_size = sizes.pop() if len(sizes) == 1 else 1
    coords: dict[int, tuple[int, int, int]] = {}
    if tp_size > 1:
        dp_of_group = {gi: d for d, gi in enumerate(dict.fromkeys(tp_of[p[0]][0] for p in pipes))}
        for p in pipes:
            gi, t = tp_of[p[0]]
            for s, r in enumerate(p):
                coords[r] = (dp_of_group[gi], s, t)
        how += "; tensor parallel from groups described as such"
    else:
        for d, p in enumerate(pipes):
            for s, r in enumerate(p):
                coords[r] = (d, s, 0)
    return Layout(dp_size=len(pipes) // tp_size, pp_size=len(pipes[0]), tp_size=tp_size, coords=coords, how=how)


# ---------------------------------------------------------------- overrides


def parse_layout(spec: str, ranks: Sequence[int]) -> Layout:
    """``dp=2,pp=2[,tp=T]``: sizes, outermost dimension first (rank = ((dp * P) + pp) * T + tp)."""
    dims: list[tuple[str, int]] = []
    for part in spec.split(","):
        key, _, val = part.strip().partition("=")
        key = key.strip().lower()
        if key not in DIMS or not val.strip().isdigit() or int(val) < 1:
            raise LaggardError(f"--layout {spec!r}: expected dp=D,pp=P[,tp=T] with positive integers, "
                               f"got {part.strip()!r}")
        if key in dict(dims):
            raise LaggardError(f"--layout {spec!r}: {key} is given twice")
        dims.append((key, int(val)))
    sizes = dict(dims)
    total = int(np.prod([v for _, v in dims]))
    if total != len(ranks):
        raise LaggardError(f"--layout {spec!r}: {' x '.join(str(v) for _, v in dims)} = {total} ranks, but the "
                           f"traces hold {len(ranks)} rank(s)")
    coords: dict[int, tuple[int, int, int]] = {}
    for i, r in enumerate(sorted(ranks)):
        c: dict[str, int] = {}
        rest = i
        for key, size in reversed(dims):
            rest, c[key] = divmod(rest, size)
        coords[r] = (c.get("dp", 0), c.get("pp", 0), c.get("tp", 0))
    return Layout(dp_size=sizes.get("dp", 1), pp_size=sizes.get("pp", 1), tp_size=sizes.get("tp", 1), coords=coords,
                  how=f"from --layout {spec}", inferred=False, source="given")


def read_rank_map(path: str | Path, ranks: Sequence[int]) -> Layout:
    """A YAML/JSON mapping rank -> {dp, pp[, tp]} (optionally under a ``ranks:`` key)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise LaggardError(f"{p}: cannot read the rank map ({e.strerror or e})") from None
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except (ValueError, Exception) as e:  # yaml.YAMLError and json errors: one line
        raise LaggardError(f"{p}: not a valid rank map "
                           f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if isinstance(data, dict) and isinstance(data.get("ranks"), dict):
        data = data["ranks"]
    if not isinstance(data, dict) or not data:
        raise LaggardError(f"{p}: a rank map is a mapping rank -> {{dp: D, pp: P[, tp: T]}}")
    coords: dict[int, tuple[int, int, int]] = {}
    for k, v in data.items():
        try:
            r = int(k)
        except (TypeError, ValueError):
            raise LaggardError(f"{p}: {k!r} is not a rank number") from None
        if not isinstance(v, dict) or not {"dp", "pp"} <= set(v) or set(v) - set(DIMS) or not all(
                isinstance(v[d], int) and not isinstance(v[d], bool) and v[d] >= 0 for d in v):
            raise LaggardError(f"{p}: rank {r}: expected {{dp: D, pp: P[, tp: T]}} with non-negative integers, "
                               f"got {v!r}")
        coords[r] = (v["dp"], v["pp"], v.get("tp", 0))
    extra, missing = sorted(set(coords) - set(ranks)), sorted(set(ranks) - set(coords))
    if extra:
        raise LaggardError(f"{p}: the rank map contradicts the trace: rank(s) {extra[:8]} are not in the traces "
                           f"(ranks {sorted(ranks)[:8]}{' ...' if len(ranks) > 8 else ''})")
    if missing:
        raise LaggardError(f"{p}: the rank map has no entry for traced rank(s) {missing[:8]}")
    sizes = [max(c[i] for c in coords.values()) + 1 for i in range(3)]
    seen: dict[tuple[int, int, int], int] = {}
    for r, c in sorted(coords.items()):
        if c in seen:
            raise LaggardError(f"{p}: ranks {seen[c]} and {r} are both at dp{c[0]}/pp{c[1]}/tp{c[2]}")
        seen[c] = r
    if int(np.prod(sizes)) != len(ranks):
        raise LaggardError(f"{p}: the map spans dp {sizes[0]} x pp {sizes[1]} x tp {sizes[2]} = {int(np.prod(sizes))} "
                           f"places but the traces hold {len(ranks)} rank(s)")
    return Layout(dp_size=sizes[0], pp_size=sizes[1], tp_size=sizes[2], coords=coords, how=f"from rank map {p.name}",
                  inferred=False, source="given")


def check_layout(layout: Layout, ev: Evidence) -> None:
    """A given layout must agree with the trace: transfers join neighbouring stages of one pipeline
    (same DP and TP rank), and a role group's ranks differ only in that role's dimension."""
    c = layout.coords
    source = layout.how.removeprefix("from ")
    for a, b in sorted(ev.edges):
        if a in c and b in c and (c[a][0] != c[b][0] or c[a][2] != c[b][2] or abs(c[a][1] - c[b][1]) != 1):
            raise LaggardError(
                f"{source} contradicts the trace: rank {a} sends to rank {b}, but the layout puts them at "
                f"{_where(c[a])} and {_where(c[b])} "
                "(point-to-point transfers join neighbouring stages of one pipeline)")
    keep = {"pp": (0, 2), "dp": (1, 2), "tp": (0, 1)}  # coordinates a role group's ranks share
    for role, groups in ev.role_groups.items():
        for g in groups:
            shared = {tuple(c[r][i] for i in keep[role]) for r in g if r in c}
            if len(shared) > 1:
                raise LaggardError(
                    f"{source} contradicts the trace: ranks {g} form a {role} group, but the layout puts them at "
                    + ", ".join(_where(c[r]) for r in g if r in c))


def _where(c: tuple[int, int, int]) -> str:
    return f"dp{c[0]}/pp{c[1]}" + (f"/tp{c[2]}" if c[2] else "")


def resolve_layout(ranks: list[RankOps], *, spec: str | None = None, rank_map: str | Path | None = None,
                   pl: Peerless | None = None) -> tuple[Layout, list[str], Search | None]:
    """The layout to use (given, else inferred), the warnings to issue, and the chains found by
    matching transfers without peers (``pl``) when the layout was inferred from them."""
    if spec is not None and rank_map is not None:
        raise LaggardError("give --layout or --rank-map, not both")
    ev = evidence(ranks)
    if spec is not None or rank_map is not None:
        layout = parse_layout(spec, ev.ranks) if spec is not None else read_rank_map(rank_map, ev.ranks)  # type: ignore[arg-type]
        check_layout(layout, ev)
        return layout, [], None
    search = None
    if pl is not None and not ev.role_groups.get("pp") and not ev.edges and _stage_groups(ev) is None:
        search = find_chains(pl)
        ev.matched, ev.edges, ev.unmatched_why = bool(search.chains), search.edges, search.why
    layout, warn = infer_layout(ev)
    if layout.pp_size > 1 or layout.tp_size > 1:
        try:
            check_layout(layout, ev)
        except LaggardError as e:
            return flat(ev.ranks, "inconsistent evidence"), [
                f"cannot infer the pipeline layout: {str(e).split('contradicts the trace: ', 1)[-1]}; {_GIVE}"], None
    return layout, [warn] if warn else [], search


def pipelines(layout: Layout) -> list[list[int]]:
    """The layout's pipelines, each its ranks by stage (none when pp is 1)."""
    if layout.pp_size < 2:
        return []
    by: dict[tuple[int, int], dict[int, int]] = {}
    for r, (d, s, t) in layout.coords.items():
        by.setdefault((d, t), {})[s] = r
    return [[st[s] for s in sorted(st)] for _, st in sorted(by.items())]


def assign_peers(ranks: list[RankOps], layout: Layout, pl: Peerless | None, search: Search | None = None
                 ) -> tuple[int, list[str]]:
    """Send/recv without peer ranks, matched along the layout's pipelines by order, counts and
    timing (``laggard.io.kineto.p2p``) and labelled as if the trace had named the peers. Returns
    how many ops (transfer ends) were matched, and a warning saying how many were not and why."""
    if pl is None:
        return 0, []
    pairs, why = match_pipelines(pl, pipelines(layout), search)
    apply_pairs(ranks, pairs)
    matched = 2 * pairs.num_transfers
    left = pl.num_ops - matched
    if not left:
        return matched, []
    if why:
        reason = why[0] + (f" (and {len(why) - 1} more pipeline(s))" if len(why) > 1 else "")
    elif search is not None and search.why:
        reason = search.why
    else:
        reason = "the layout has no pipeline stages to pair them along (give --layout or --rank-map)"
    return matched, [f"{left} point-to-point transfer(s) without source/destination ranks are not matched across "
                     f"ranks: {reason}"]
