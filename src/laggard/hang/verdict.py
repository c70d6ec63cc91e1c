"""The verdict: hang, desync, missing ranks, straggling or healthy, with the culprit ranks and evidence.

Rules, in order (the first that applies wins; the others' findings are kept as notes):
1. **desync**: at the earliest (group, seq) where ranks disagree on op, sizes or dtypes, the
   ranks outside the strict majority are the culprits (no majority: said, no culprit guessed);
   hangs and crashes that follow a desync are its consequence.
2. **hang** / **missing-ranks**: a *gap* is a collective of a group that some members entered
   and others never reached. Ranks in a gap wait for the members that never came; a rank blocked
   in a point-to-point call (laggard's dump says where the main thread is: gloo's Flight Recorder
   does not record p2p) waits for its peer. The culprits are the ranks waited for that wait for
   nobody (stuck in compute, exited, dead). When the waits form a cycle, a rank waited for in a
   receive that is not sending is the culprit; else the rank whose pending collective differs from
   what the other ranks called at the same position of their own call sequence. A culprit with
   no dump at all makes the verdict missing-ranks. A rank that never reached a collective without
   being a culprit gets, in that gap's evidence, the chain of waits from it to a culprit (in a
   pipeline: "rank 2 is blocked in recv from rank 1, and rank 1 never posted the send rank 2 waits for").
   A member that did not reach a collective only counts when that collective is still pending on
   the ranks that entered it, or the member was dumped after the others entered it (else its dump
   may just be older: said as undecided). Members without a dump count as never arriving only
   when every member with a dump arrived (else they are unknown).
3. **missing-ranks**: no dump from some ranks, nothing else wrong.
4. **straggling** / **healthy**: everyone completed; a rank that arrives late at collectives
   (creation times of its entries against the median rank's) is a straggler.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from laggard.hang.dumps import Entry, RankDump
from laggard.hang.match import GroupView, first_desync, group_views, lateness, world_size_of
from laggard.hang.tracer_state import add_tracer_entries


@dataclass(kw_only=True, slots=True)
class HangConfig:
    late_s: float = 0.1  # mean lateness that makes a straggler: a gloo collective on one host takes
    # under 1 ms and a busy machine's scheduling jitter tens of ms; a real straggling step, more
    late_ratio: float = 3.0  # ... and this many times the median rank's (a uniformly slow job is no straggler)


@dataclass(kw_only=True, slots=True)
class HangReport:
    verdict: str  # hang | desync | missing-ranks | straggling | healthy
    culprit_ranks: list[int]
    group: str | None = None
    group_ranks: list[int] | None = None
    seq: int | None = None
    op: str | None = None
    sizes: list[Any] | None = None
    evidence: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    world_size: int = 0
    ranks_with_dumps: list[int] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    lateness_s: dict[int, float] = field(default_factory=dict)
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["lateness_s"] = {str(k): v for k, v in self.lateness_s.items()}
        out["ranks"] = {str(k): v for k, v in self.ranks.items()}
        return out


@dataclass(slots=True)
class _Gap:
    view: GroupView
    seq: int
    entry: Entry  # the collective, as an entering rank recorded it
    ahead: list[int]
    lacking: list[int]
    pending: bool


def _where_text(info: dict[str, Any]) -> str:
    w = info.get("where") or {}
    parts: list[str] = []
    state = w.get("state")
    if state in ("p2p_recv", "p2p_send", "p2p"):
        parts.append(f"blocked in {w.get('op', 'p2p')} "
                     f"{'from' if state == 'p2p_recv' else 'with'} rank {w.get('peer')}")
    elif state == "collective":
        parts.append(f"in {w.get('op')} (group {w.get('group', '?')})")
    elif state == "compute":
        parts.append(f"in compute at {w.get('at', '?')}")
    elif state == "data":
        parts.append(f"in data loading at {w.get('at', '?')}")
    last = info.get("last_op")
    if last:
        parts.append(f"last traced op {last.get('name')} ({last.get('kind')})")
    if info.get("tracer_status"):
        parts.append(f"tracer status {info['tracer_status']}")
    return "; ".join(parts)


def _rank_facts(d: RankDump, state: dict[str, Any] | None) -> dict[str, Any]:
    coll = [e for e in d.entries if not e.is_p2p]
    last = max(coll, key=lambda e: e.record_id) if coll else None
    done = [e for e in coll if e.done]
    last_done = max(done, key=lambda e: e.record_id) if done else None
    info: dict[str, Any] = {
        "file": str(d.path), "format": d.fmt, "num_entries": len(d.entries), "wrapped": d.wrapped,
        "dump_reason": d.reason, "dump_unix_ns": d.dump_ns, "step": d.step, "where": d.where,
        "last_entered": None if last is None else {"group": last.group, "seq": last.seq, "op": last.op,
                                                   "done": last.done},
        "last_completed": None if last_done is None else {"group": last_done.group, "seq": last_done.seq,
                                                          "op": last_done.op},
        "last_op": d.last_op,
    }
    if state:
        info["tracer_status"] = state.get("status")
        info["heartbeat_unix_s"] = state.get("heartbeat_unix_s")
        if not info["last_op"]:
            info["last_op"] = state.get("last_op")
    if info["where"] is not None:
        info["where"] = {k: v for k, v in info["where"].items() if k != "stack"}
    return info


def _gaps(views: list[GroupView], dumps: dict[int, RankDump], undecided: list[str]) -> list[_Gap]:
    gaps: list[_Gap] = []
    for v in views:
        known = {r: t for r, t in v.top.items() if t is not None}
        if not known:
            continue
        top = max(known.values())
        behind = [r for r, t in known.items() if t < top]
        missing = [r for r in v.members if r not in dumps]
        if not behind and not missing:
            continue
        seq = min(known[r] + 1 for r in behind) if behind else top
        ahead = [r for r in known if seq in v.entries[r]]
        if not ahead:
            continue
        here = [v.entries[r][seq] for r in ahead]
        pending = any(not e.done for e in here)
        created = min(e.created_ns for e in here)
        lacking: list[int] = []
        for r in behind:
            if known[r] >= seq:
                continue
            seen = dumps[r].dump_ns
            if pending or (seen is not None and seen > created):
                lacking.append(r)
            else:
                undecided.append(f"rank {r} has not reached {here[0].op} seq {seq} of {v.label()}, but that "
                                 "collective completed on the others and rank " f"{r}'s dump may be older")
        if missing and lacking:  # someone present never came: the ranks without a dump are unknown
            undecided.append(f"rank(s) {missing} of {v.label()} have no dump: unknown whether they reached "
                             f"{here[0].op} seq {seq}")
        elif missing and pending:  # (a collective that completed had every member, dump or not)
            lacking = list(missing)
        if lacking:
            gaps.append(_Gap(view=v, seq=seq, entry=here[0], ahead=sorted(ahead), lacking=sorted(lacking),
                             pending=pending))
    return gaps


def _position_key(d: RankDump, e: Entry, views: dict[str, GroupView]) -> tuple:
    v = views.get(e.group)
    return (e.sig, len(v.members) if v else 0)


def _cycle_culprits(cycle: list[int], waits: dict[int, set[int]], p2p: dict[int, int],
                    pending: dict[int, Entry], dumps: dict[int, RankDump], views: dict[str, GroupView]
                    ) -> tuple[list[int], str]:
    # a receive from a rank that is not sending back: that rank moved on without sending
    senders = sorted({p2p[r] for r in cycle if r in p2p and p2p.get(p2p[r]) != r})
    if senders:
        return senders, "waited for in a receive it never sent"
    # the rank whose pending collective differs from what the others called at the same position
    by_pos: dict[int, dict[tuple, int]] = {}
    for r in cycle:
        if r in pending:
            by_pos.setdefault(pending[r].record_id, {})
    for d in dumps.values():
        for e in d.entries:
            if e.record_id in by_pos and not e.is_p2p:
                k = _position_key(d, e, views)
                by_pos[e.record_id][k] = by_pos[e.record_id].get(k, 0) + 1
    odd: list[int] = []
    for r in cycle:
        if r not in pending:
            continue
        counts = by_pos[pending[r].record_id]
        best, n = max(counts.items(), key=lambda kv: kv[1])
        if n * 2 > sum(counts.values()) and _position_key(dumps[r], pending[r], views) != best:
            odd.append(r)
    if odd:
        return sorted(odd), "its pending collective is not the one the other ranks called at that point"
    return [], ""


def _reachable_sinks(waits: dict[int, set[int]]) -> list[int]:
    seen: set[int] = set()
    stack = [r for r in waits if waits[r]]
    while stack:
        r = stack.pop()
        for p in waits.get(r, ()):
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return sorted(r for r in seen if not waits.get(r))


def diagnose(dumps: list[RankDump], states: dict[int, dict[str, Any]] | None = None,
             config: HangConfig | None = None) -> HangReport:
    """The verdict for one job's dumps (one per rank) and, optionally, its tracer states."""
    cfg = config or HangConfig()
    states = states or {}
    from_tracer = [d.rank for d in dumps if add_tracer_entries(d)]
    by_rank = {d.rank: d for d in dumps}
    world, known = world_size_of(dumps)
    views = group_views(by_rank, world)
    vmap = {v.name: v for v in views}
    missing = sorted(set(range(world)) - set(by_rank))
    rep = HangReport(verdict="healthy", culprit_ranks=[], world_size=world, ranks_with_dumps=sorted(by_rank),
                     missing_ranks=missing)
    rep.ranks = {r: _rank_facts(d, states.get(r)) for r, d in sorted(by_rank.items())}
    if from_tracer:
        rep.notes.append(f"Flight Recorder off on rank(s) {from_tracer}: their collectives are the ones laggard's "
                         "tracer counted (the last per group; no sizes, so no desync check)")
    if not known:
        rep.notes.append(f"world size unknown (plain torch dumps): taken as {world} (highest rank + 1)")
    for v in views:
        if not v.members_known:
            rep.notes.append(f"members of group {v.name} inferred from the entries (ranks {v.members}): the dumps "
                             "have no pg_config")
    wrapped = [r for r, d in by_rank.items() if d.wrapped]
    if wrapped:
        rep.notes.append(f"ring buffer wrapped on {len(wrapped)} rank(s) (oldest entries lost); matched by sequence id")
    lat = lateness(views)
    rep.lateness_s = {r: round(statistics.fmean(max(x, 0.0) for x in xs), 6) for r, xs in sorted(lat.items())}

    desync = first_desync(views)
    if desync is not None:  # the earliest cause: what follows (hangs, crashes) comes from it
        _desync(rep, desync)
        return rep
    gaps = _gaps(views, by_rank, rep.undecided)
    if gaps:
        _hang(rep, gaps, by_rank, vmap)
        return rep
    if missing:
        rep.verdict, rep.culprit_ranks = "missing-ranks", missing
        rep.evidence.append(f"no dump from rank(s) {missing} of {world} (dead process, OOM kill, or not collected); "
                            "the other ranks show no collective waiting for them")
        return rep
    _straggle(rep, cfg)
    return rep


def _desync(rep: HangReport, ds: Any) -> None:
    v = ds.group
    rep.verdict, rep.culprit_ranks = "desync", ds.culprits
    rep.group, rep.group_ranks, rep.seq = v.name, v.members, ds.seq
    by_sig: dict[tuple, list[int]] = {}
    for r, sig in sorted(ds.sigs.items()):
        by_sig.setdefault(sig, []).append(r)
    major = max(by_sig.items(), key=lambda kv: len(kv[1]))
    rep.op, rep.sizes = major[0][0], [list(s) for s in major[0][1]]
    for sig, ranks in by_sig.items():
        rep.evidence.append(f"ranks {ranks} called {sig[0]} sizes {[list(s) for s in sig[1]]} dtypes {list(sig[2])} "
                            f"as seq {ds.seq} of {v.label()}")
    if not ds.culprits:
        rep.undecided.append(f"ranks of {v.label()} disagree at seq {ds.seq} with no majority: "
                             "cannot tell which is wrong")


def _hang(rep: HangReport, gaps: list[_Gap], dumps: dict[int, RankDump], vmap: dict[str, GroupView]) -> None:
    waits: dict[int, set[int]] = {}
    pending: dict[int, Entry] = {}
    for g in gaps:
        for r in g.ahead:
            waits.setdefault(r, set()).update(g.lacking)
            e = g.view.entries[r][g.seq]
            if r not in pending or e.created_ns < pending[r].created_ns:
                pending[r] = e
    p2p: dict[int, int] = {}
    for r, d in dumps.items():
        w = d.where or {}
        if str(w.get("state", "")).startswith("p2p") and isinstance(w.get("peer"), int):
            p2p[r] = w["peer"]
            waits.setdefault(r, set()).add(w["peer"])
    for r in list(waits):
        waits[r].discard(r)
    culprits = _reachable_sinks(waits)
    why = "waited for, waiting for nobody"
    if not culprits:
        cycle = sorted(waits)
        culprits, why = _cycle_culprits(cycle, waits, p2p, pending, dumps, vmap)
        if not culprits:
            rep.undecided.append(f"ranks {cycle} wait for each other; cannot tell who broke the order")
    rep.culprit_ranks = culprits
    rep.verdict = "missing-ranks" if culprits and all(c not in dumps for c in culprits) else "hang"
    head = next((g for g in sorted(gaps, key=lambda g: g.entry.created_ns) if set(g.lacking) & set(culprits)), None)
    if head is None and gaps:
        head = min(gaps, key=lambda g: g.entry.created_ns)
    if head is not None:
        rep.group, rep.group_ranks, rep.seq = head.view.name, head.view.members, head.seq
        rep.op, rep.sizes = head.entry.op, [list(s) for s in head.entry.sig[1]]
    for g in gaps:
        state = "still pending" if g.pending else "ended (timeout or error)"
        chains = [c for r in g.lacking if r not in culprits and (c := _chain(r, waits, culprits, gaps, p2p, dumps))]
        rep.evidence.append(f"ranks {g.ahead} entered {g.entry.op} seq {g.seq} of {g.view.label()} ({state}); "
                            f"ranks {g.lacking} never reached it" + (": " + "; ".join(chains) if chains else ""))
    for r in sorted(set(culprits) | {x for g in gaps for x in g.lacking}):
        if r not in dumps:
            rep.evidence.append(f"rank {r}: no dump (dead process, OOM kill, or not collected)")
            continue
        f = rep.ranks[r]
        last = f.get("last_completed")
        lc = f"last completed collective {last['op']} seq {last['seq']} of group {last['group']}" if last else \
            "no completed collective in its buffer"
        extra = _where_text(f)
        rep.evidence.append(f"rank {r}: {lc}" + (f"; {extra}" if extra else "") +
                            (f" ({_never_sent(r, p2p, dumps) or why})" if r in culprits else ""))
    for r, peer in sorted(p2p.items()):
        rep.evidence.append(f"{_hop(r, peer, gaps, p2p, dumps)} (from laggard's dump: gloo's Flight Recorder does "
                            "not record p2p)")


def _blocked_on(r: int, p2p: dict[int, int]) -> list[int]:
    """The ranks blocked in a p2p call with rank ``r`` that ``r`` is not in a p2p call with."""
    return sorted(a for a, b in p2p.items() if b == r and p2p.get(r) != a)


def _missing_call(a: int, dumps: dict[int, RankDump]) -> str:
    """What rank ``a``'s p2p call needs from its peer: a send for a receive, a receive for a send."""
    return "receive" if str((dumps[a].where or {}).get("state")) == "p2p_send" else "send"


def _never_sent(r: int, p2p: dict[int, int], dumps: dict[int, RankDump]) -> str:
    """Why a rank that p2p calls wait for is the culprit (empty when none waits for it so)."""
    return "; ".join(f"it never posted the {_missing_call(a, dumps)} rank {a} waits for" for a in _blocked_on(r, p2p))


def _hop(a: int, b: int, gaps: list[_Gap], p2p: dict[int, int], dumps: dict[int, RankDump]) -> str:
    """How rank ``a`` waits for rank ``b``: a p2p call (laggard's dump) or a collective gap."""
    if p2p.get(a) == b:
        w = dumps[a].where or {}
        to = {"p2p_recv": "from", "p2p_send": "to"}.get(str(w.get("state")), "with")
        return f"rank {a} is blocked in {w.get('op', 'p2p')} {to} rank {b}"
    g = next((g for g in gaps if a in g.ahead and b in g.lacking), None)
    return f"rank {a} waits for rank {b}" if g is None else \
        f"rank {a} waits in {g.entry.op} seq {g.seq} of group {g.view.name} for rank {b}"


def _chain(start: int, waits: dict[int, set[int]], culprits: list[int], gaps: list[_Gap], p2p: dict[int, int],
           dumps: dict[int, RankDump]) -> str:
    """Why a rank that is no culprit never reached a collective: the shortest chain of waits from it
    to a culprit, each hop named (empty when no chain leads to one)."""
    prev: dict[int, int] = {start: start}
    todo, end = [start], None
    while todo and end is None:
        a = todo.pop(0)
        for b in sorted(waits.get(a, ())):
            if b not in prev:
                prev[b] = a
                if b in culprits:
                    end = b
                    break
                todo.append(b)
    if end is None:
        return ""
    path = [end]
    while path[-1] != start:
        path.append(prev[path[-1]])
    path.reverse()
    hops = [_hop(a, b, gaps, p2p, dumps) for a, b in zip(path, path[1:], strict=False)]
    last = path[-2]
    if p2p.get(last) == end and p2p.get(end) != last:
        hops.append(f"rank {end} never posted the {_missing_call(last, dumps)} rank {last} waits for")
    elif end not in dumps:
        hops.append(f"rank {end} left no dump")
    return hops[0] if len(hops) == 1 else ", ".join(hops[:-1]) + ", and " + hops[-1]


def _straggle(rep: HangReport, cfg: HangConfig) -> None:
    lat = rep.lateness_s
    if not lat:
        rep.evidence.append("every rank completed every collective in its buffer")
        return
    med = statistics.median(lat.values())
    late = sorted(r for r, x in lat.items() if x >= cfg.late_s and x >= cfg.late_ratio * max(med, 1e-9))
    if late:
        rep.verdict, rep.culprit_ranks = "straggling", late
        for r in late:
            rep.evidence.append(f"rank {r} arrives at collectives {lat[r] * 1e3:.0f} ms after the median rank on "
                                f"average (median rank: {med * 1e3:.1f} ms); all collectives completed: run "
                                "`laggard analyze` on the trace for the cause")
    else:
        rep.evidence.append(f"every collective completed; no rank late by {cfg.late_s * 1e3:.0f} ms on average")
