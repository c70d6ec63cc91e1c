"""Hang verdicts in the collector: heartbeats, the ranks' hang reports, and ``laggard hang``'s analysis over them.

A tracer posts a heartbeat every few seconds from its stream thread (``laggard.tracer.stream``):
its step, the ops it has recorded so far (``progress``), the blocking communication its main
thread is in. Heartbeats keep coming while the main thread is blocked, so a hang shows as ranks
that are alive and do not move. ``HangCase.stalled`` is the suspicion: no live rank recorded an
op for ``hang_after_s``, or a rank's heartbeats stopped for that long while others' go on (the
process died or froze). Ranks that closed their tracer are left out.

A suspicion (or an operator's ``POST /jobs/ID/dump``) raises the job's ``dump_request``; every live
tracer answers with its hang report (``POST /jobs/ID/flight``: its Flight Recorder dump and state,
or the state alone). Once every rank of the job has reported, or ``hang_collect_s`` after the
request, the verdict is ``laggard.hang.verdict.diagnose`` over the reports: exactly what
``laggard hang`` computes on the same dumps; a rank that sent nothing is a missing rank. Reports
are held only for the open request, within ``hang_reports_per_job`` and ``hang_report_bytes_per_job``
(the oldest dropped first: counted, and said in the verdict's ``warnings``), and released once the
verdict has them; a report for a decided or superseded request is not kept. The
``laggard hang --json`` document is kept (``GET /jobs/ID/hang``) with a short summary (``published``)
that goes back to the tracers in heartbeat answers (their opt-in abort reads it), to the alert,
the dashboard and the metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError

ALERT_VERDICTS = ("hang", "desync", "missing-ranks")  # verdicts that are an alert (for a suspected hang)
DROPPED_RANKS_SHOWN = 20  # the verdict's warning names the first ranks whose reports were dropped


class BadReport(LaggardError):
    """A hang report or heartbeat the collector cannot use (answered with 422)."""


@dataclass(kw_only=True, slots=True)
class Beat:
    state: dict[str, Any]
    seen_s: float  # when the last heartbeat came
    progress: int  # ops recorded by then
    moved_s: float  # when progress last changed
    closed: bool = False


@dataclass(kw_only=True)
class HangCase:
    """One job's heartbeats, its open request for hang reports and its last verdict."""

    beats: dict[int, Beat] = field(default_factory=dict)
    world_size: int = 0
    request: int = 0  # the dump_request the reports answer (0: none asked)
    requested_s: float = 0.0
    suspected: bool = False  # the request came from a suspected hang (not only an operator)
    reports: dict[int, tuple[Any, int]] = field(default_factory=dict)  # rank -> (RankDump, bytes), oldest first
    report_bytes: int = 0  # the bytes of ``reports``
    dropped: int = 0  # reports dropped over the caps (open request) ...
    dropped_bytes: int = 0  # ... their bytes ...
    dropped_ranks: list[int] = field(default_factory=list)  # ... and the first ranks (DROPPED_RANKS_SHOWN)
    dropped_total: int = 0  # reports dropped over the caps, ever
    decided: int = 0  # the request the last verdict answers
    doc: dict[str, Any] | None = None  # the `laggard hang --json` document of the last verdict
    published: dict[str, Any] | None = None  # its summary (heartbeat answers, alerts, dashboard)

    # ------------------------------------------------------------------ handed to the job's next collector
    def shared(self, dump_request: int) -> dict[str, Any]:
        """What the next collector to hold the job needs to go on where this one is (JSON): the job's
        dump request, the open request and the last verdict (the reports are kept one by one)."""
        return {"dump_request": dump_request, "world_size": self.world_size, "request": self.request,
                "requested_s": self.requested_s, "suspected": self.suspected, "decided": self.decided,
                "doc": self.doc, "published": self.published}

    def restore(self, d: dict[str, Any], reports: list[Any], *, max_reports: int, max_bytes: int) -> None:
        """Go on from what the job's last holder kept (``shared``) and the reports it held for the
        open request (``(RankDump, bytes)``); heartbeats stay this collector's own."""
        self.world_size = max(self.world_size, int(d.get("world_size") or 0))
        if int(d.get("decided") or 0) >= self.decided:
            self.decided, self.doc, self.published = int(d.get("decided") or 0), d.get("doc"), d.get("published")
        if int(d.get("request") or 0) > self.request:
            self.open(int(d["request"]), float(d.get("requested_s") or 0.0), suspected=bool(d.get("suspected")))
            for dump, nbytes in reports:
                self.add_report(self.request, dump, nbytes, max_reports=max_reports, max_bytes=max_bytes)

    # ------------------------------------------------------------------ heartbeats
    def beat(self, rank: int, state: dict[str, Any], now_s: float) -> None:
        prog = state.get("progress")
        prog = prog if isinstance(prog, int) else -1
        ws = state.get("world_size")
        if isinstance(ws, int) and 0 < ws <= 1 << 20:
            self.world_size = max(self.world_size, ws)
        old = self.beats.get(rank)
        moved = now_s if old is None or old.progress != prog else old.moved_s
        self.beats[rank] = Beat(state=state, seen_s=now_s, progress=prog, moved_s=moved,
                                closed=bool(state.get("closed")))

    def last_step(self) -> int:
        return max((b.state.get("step", -1) for b in self.beats.values() if isinstance(b.state.get("step"), int)),
                   default=-1)

    def stalled(self, now_s: float, after_s: float) -> list[dict[str, Any]]:
        """The ranks of a suspected hang ([] if none): every live rank when none moved for ``after_s``,
        else the ranks whose heartbeats stopped that long ago while others' go on."""
        open_ = {r: b for r, b in self.beats.items() if not b.closed}
        if not open_:
            return []
        dead = {r for r, b in open_.items() if now_s - b.seen_s > after_s}
        alive = set(open_) - dead
        if alive and all(now_s - open_[r].moved_s > after_s for r in alive):
            ranks = sorted(open_)
        elif alive and dead:
            ranks = sorted(dead)
        else:
            return []
        out = []
        for r in ranks:
            b = open_[r]
            st = b.state
            out.append({"rank": r, "last_step": st.get("step"), "last_op": st.get("last_op"),
                        "silent_s": round(now_s - b.moved_s, 1), "heartbeat_age_s": round(now_s - b.seen_s, 1),
                        "comm": st.get("comm"), "where": (st.get("where") or {}).get("state")})
        return out

    # ------------------------------------------------------------------ reports and the verdict
    def open(self, request: int, now_s: float, *, suspected: bool) -> None:
        """Reports for ``request`` are wanted from now on (older ones no longer count, and are released)."""
        self.request, self.requested_s, self.suspected = request, now_s, suspected
        self._release()

    def _release(self) -> None:
        self.reports, self.report_bytes = {}, 0
        self.dropped, self.dropped_bytes, self.dropped_ranks = 0, 0, []

    def add_report(self, request: int, dump: Any, nbytes: int, *, max_reports: int, max_bytes: int) -> bool:
        """Hold a rank's report for the open request (False, not held: it answers no open request).
        Beyond ``max_reports`` or ``max_bytes`` the oldest reports are dropped (their ranks count as missing)."""
        if request != self.request or request == 0 or self.decided == request:
            return False
        old = self.reports.pop(dump.rank, None)  # a rank's newer report replaces its older one
        if old is not None:
            self.report_bytes -= old[1]
        self.reports[dump.rank] = (dump, nbytes)
        self.report_bytes += nbytes
        while len(self.reports) > max_reports or self.report_bytes > max_bytes:
            rank = next(iter(self.reports))
            _, n = self.reports.pop(rank)
            self.report_bytes -= n
            self.dropped += 1
            self.dropped_bytes += n
            self.dropped_total += 1
            if len(self.dropped_ranks) < DROPPED_RANKS_SHOWN:  # a bounded list, however many are dropped
                self.dropped_ranks.append(rank)
        return dump.rank in self.reports

    def expected(self) -> int:
        return max(self.world_size, len(self.beats))

    def ready(self, now_s: float, collect_s: float) -> bool:
        """A verdict is due: every rank reported for the open request, ``collect_s`` passed, or every
        tracer of the job closed (the job ended: decided at once over what came, which is then released)."""
        if self.request == 0 or self.decided == self.request:
            return False
        got = len(self.reports) + self.dropped
        closed = bool(self.beats) and all(b.closed for b in self.beats.values())
        return (self.expected() > 0 and got >= self.expected()) or now_s - self.requested_s >= collect_s or closed

    def take(self) -> tuple[list[Any], list[str]]:
        """The reports of the open request and the warnings about them, marking it decided (once, even
        if the analysis then fails: the collector logs it) and releasing them. Under the collector's
        lock; ``decide`` runs outside it."""
        self.decided = self.request
        dumps = [d for d, _ in self.reports.values()]
        warnings = []
        if self.dropped:
            more = " ..." if self.dropped > len(self.dropped_ranks) else ""
            warnings.append(f"{self.dropped} hang report(s) ({self.dropped_bytes / 2**20:.1f} MB) dropped, oldest "
                            f"first, over the collector's per-job limits (hang_reports_per_job, "
                            f"hang_report_bytes_per_job): rank(s) {sorted(self.dropped_ranks)}{more} count as missing")
        self._release()
        return dumps, warnings

    def decide(self, job_id: str, dumps: list[Any], collect_s: float, abort: bool,
               warnings: list[str] | None = None) -> dict[str, Any]:
        """Run ``laggard hang``'s analysis over the reports (``take``); returns the summary."""
        from laggard.hang.verdict import HangReport, diagnose

        if dumps:
            rep = diagnose(dumps)
        else:  # nobody answered: every rank is missing (the job died, or its tracers cannot reach us)
            world = self.expected()
            rep = HangReport(verdict="missing-ranks", culprit_ranks=list(range(world)), world_size=world,
                             missing_ranks=list(range(world)),
                             evidence=[f"no rank sent a hang report within {collect_s:g} s of the request"])
        self.doc = {**rep.to_json(), "warnings": list(warnings or [])}
        self.published = {"job": job_id, "request": self.request, "verdict": rep.verdict,
                          "culprit_ranks": rep.culprit_ranks, "group": rep.group, "group_ranks": rep.group_ranks,
                          "op": rep.op, "seq": rep.seq, "missing_ranks": rep.missing_ranks,
                          "suspected": self.suspected, "abort": bool(abort and self.suspected),
                          "warnings": self.doc["warnings"],
                          "time_unix_s": round(time.time(), 3)}
        return self.published


def parse_report(body: bytes) -> Any:
    """A rank's hang report (a Flight Recorder dump, JSON or pickle, or the tracer's state alone):
    ``BadReport`` (one line) when it is not one."""
    from laggard.hang.dumps import parse_dump

    try:
        d = parse_dump(body, Path("hang report"))
    except LaggardError as e:
        raise BadReport(str(e)) from None
    if d.rank_from_name or not isinstance(d.rank, int) or d.rank < 0:
        raise BadReport("hang report: its 'laggard' key names no rank (send what laggard.tracer.flight.report makes)")
    d.path = Path(f"report-rank{d.rank}")
    return d


def parse_beat(body: Any) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
    """(rank, state, meta or None) of a heartbeat; ``BadReport`` when it is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("rank"), int) or isinstance(body["rank"], bool) \
            or body["rank"] < 0:
        raise BadReport('heartbeat: expected {"rank": N, "state": {...}} with a rank >= 0')
    state = body.get("state", {})
    meta = body.get("meta")
    if not isinstance(state, dict) or (meta is not None and not isinstance(meta, dict)):
        raise BadReport("heartbeat: 'state' and 'meta' must be JSON objects")
    return body["rank"], state, meta


def alert_lines(pub: dict[str, Any]) -> str:
    """The alert's message for a published verdict."""
    where = f" at {pub['op']} seq {pub['seq']} of group {pub['group']} (ranks {pub['group_ranks']})" \
        if pub.get("op") is not None else ""
    return (f"job {pub['job']}: {pub['verdict']}, culprit rank(s) {pub['culprit_ranks']}{where}"
            + (f"; no report from rank(s) {pub['missing_ranks']}" if pub.get("missing_ranks") else ""))
