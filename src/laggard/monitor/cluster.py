"""Several collectors on one database, acting as one service: which of them analyses each job.

Every collector stores every batch it is sent (the database is shared: a batch posted to any of them
is kept) and serves the jobs it has seen. Each job's window analysis, hang checks, alerts and metrics
are made by one collector at a time, the holder of the job's lease (table ``leases``): taken when
free or expired, renewed every ``renew_s`` while the collector runs, given up on a clean stop. The
holder reads the batches of its jobs that other collectors stored (``Store.batches_after``), so its
window is whole wherever the ranks post, and no job's metrics are exported by two collectors.

A collector killed stops renewing: its leases expire after ``lease_s``. An expired lease is taken
first by a collector the job's ranks post to now (they fail over to the next address they were
given), and by any collector once it has been expired for another ``lease_s`` (a job no rank talks
to still gets its idle analyses and hang checks). The new holder rebuilds the job's window from the
database. A collector restarted with the same identity (host and port) takes its own leases back at
once.

Collectors of one database must agree on what decides a lease and a verdict (``agreed``); one that
does not refuses to start. Times are each host's ``time.time()``: hosts kept in step by NTP differ
by far less than a lease.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from laggard.errors import LaggardError


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaseConfig:
    # a killed collector's jobs are analyzed by another within about lease_s + renew_s
    lease_s: float = 15.0
    renew_s: float = 3.0
    # batches another collector stored are read again for this long after they were first seen: a
    # transaction numbers its batches when it inserts them and may commit after a later-numbered one
    pull_margin_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_s < self.lease_s / 2:
            raise LaggardError(f"monitor config: lease renew_s must be positive and under half of lease_s "
                               f"({self.lease_s}), got {self.renew_s!r}")
        if self.pull_margin_s <= 0:
            raise LaggardError("monitor config: lease pull_margin_s must be positive")


@dataclass(slots=True)
class _Pull:
    """Where the holder of a job's lease is in reading the batches other collectors stored."""

    cursor: int  # batches numbered up to here are read for good
    pending: list[tuple[float, int]] = field(default_factory=list)  # (when read, highest number) not yet final
    seen: dict[tuple[int, int], float] = field(default_factory=dict)  # (rank, seq) -> when first held


class Cluster:
    """This collector's membership and leases in the shared database."""

    def __init__(self, store: Any, cfg: LeaseConfig, collector_id: str, url: str, agreed: dict[str, Any]) -> None:
        self.store, self.cfg, self.id, self.url = store, cfg, collector_id, url
        self.agreed = json.dumps({**agreed, "lease_s": cfg.lease_s}, sort_keys=True)
        self.held: set[str] = set()
        self.owners: dict[str, tuple[str, float]] = {}  # job -> (holder, lease expiry), as of the last round
        self.urls: dict[str, str] = {}  # collector -> its address, as of the last round
        self._traffic: dict[str, float] = {}  # job -> when its ranks last posted here
        self._next_round = 0.0
        self.pulls: dict[str, _Pull] = {}
        self.others = True  # whether other collectors share the database (each round says)

    def join(self) -> None:
        """Check the live collectors agree with this one's settings (else one line), and say it is here."""
        now = time.time()
        for cid, url, settings, _ in self.store.collectors(now - self.cfg.lease_s):
            if cid != self.id and settings != self.agreed:
                theirs, mine = json.loads(settings), json.loads(self.agreed)
                diff = ", ".join(f"{k}={theirs.get(k)!r} there, {mine.get(k)!r} here"
                                 for k in sorted(set(theirs) | set(mine)) if theirs.get(k) != mine.get(k))
                raise LaggardError(f"collector {cid} ({url}) on this database runs with other settings ({diff}): "
                                   "start every collector of one database with the same ones")
        self.store.beat_collector(self.id, self.url, self.agreed, now)

    def posted(self, job_id: str) -> None:
        """The job's ranks posted here (a batch, a heartbeat, a report)."""
        self._traffic[job_id] = time.monotonic()

    def claim(self, job_id: str) -> bool:
        """Take the job's lease now if it is free (a job first seen here) or expired."""
        now = time.time()
        if self.store.take_lease(job_id, self.id, now + self.cfg.lease_s, now):
            self.held.add(job_id)
            self.owners[job_id] = (self.id, now + self.cfg.lease_s)
            return True
        self.owners.update(self.store.leases())  # whose it is, for the job's views before the next round
        return False

    def owns(self, job_id: str) -> bool:
        return job_id in self.held

    def owner_of(self, job_id: str) -> dict[str, Any] | None:
        """Which collector analyses the job (as of the last round), for the job's views."""
        o = self.owners.get(job_id)
        if o is None:
            return None
        return {"collector": o[0], "url": self.urls.get(o[0], ""), "this": o[0] == self.id}

    def holder_url(self, job_id: str) -> str | None:
        """The address of the other collector whose lease on the job is live (as of the last round),
        which answers for the job; None where this collector holds it, or nobody does now."""
        o = self.owners.get(job_id)
        if o is None or o[0] == self.id or job_id in self.held or o[1] < time.time():
            return None
        return self.urls.get(o[0]) or None

    def round(self, known: list[str]) -> tuple[list[str], list[str]] | None:
        """Every ``renew_s``: say this collector is alive, renew its leases, take expired ones (and
        those of ``known`` jobs no collector ever held: a database of a laggard before leases). The
        jobs it took and those it lost (another holds them: this one stalled past its lease); None
        when no round was due."""
        mono = time.monotonic()
        if mono < self._next_round:
            return None
        self._next_round = mono + self.cfg.renew_s
        now = time.time()
        until = now + self.cfg.lease_s
        self.store.beat_collector(self.id, self.url, self.agreed, now)
        before = set(self.held)
        self.held = self.store.renew_leases(self.id, until)
        self.owners = self.store.leases()
        self.urls = {c[0]: c[1] for c in self.store.collectors(now - self.cfg.lease_s)}
        # alone on the database (no other collector seen for a lease): nothing to read from the others
        self.others = any(c != self.id for c in self.urls)
        recent = {j for j, t in self._traffic.items() if mono - t < self.cfg.lease_s}
        for job_id, (owner, expires_s) in self.owners.items():
            if owner == self.id or job_id in self.held:
                continue
            # the collector the job's ranks post to first; any collector a lease later
            after = now if job_id in recent else now - self.cfg.lease_s
            if expires_s < after and self.store.take_lease(job_id, self.id, until, after):
                self.held.add(job_id)
                self.owners[job_id] = (self.id, until)
        for job_id in known:
            if job_id not in self.owners and self.store.take_lease(job_id, self.id, until, now):
                self.held.add(job_id)
        for job_id in self.held:
            self.owners[job_id] = (self.id, until)
        return sorted(self.held - before), sorted(before - self.held)

    def leave(self) -> None:
        """A clean stop: the others may take this collector's jobs at their next round."""
        self.store.release_leases(self.id)
        self.held.clear()

    # ------------------------------------------------------------------ the batches others stored
    def start_pull(self, job_id: str, mark: int, loaded: list[tuple[int, int]]) -> None:
        """The window was rebuilt from the batches up to arrival ``mark`` (or later ones too, those
        ``loaded``: (rank, seq))."""
        now = time.monotonic()
        self.pulls[job_id] = _Pull(cursor=mark, seen=dict.fromkeys(loaded, now))

    def pull(self, job_id: str) -> list[Any]:
        """The job's batches other collectors stored that this one does not hold yet (``BatchRow``)."""
        st = self.pulls.get(job_id)
        if st is None or not self.others:
            return []
        now = time.monotonic()
        top = self.store.arrival_mark(job_id)  # (its own batches too: the cursor passes them by)
        rows = self.store.batches_after(job_id, st.cursor, self.id) if top > st.cursor else []
        out = []
        for _, row in rows:
            key = (row.rank, row.seq)
            if key not in st.seen:
                st.seen[key] = now
                out.append(row)
        st.pending.append((now, top))
        final = [m for t, m in st.pending if now - t >= self.cfg.pull_margin_s]
        if final:
            st.cursor = max(st.cursor, *final)
            st.pending = [(t, m) for t, m in st.pending if now - t < self.cfg.pull_margin_s]
            horizon = now - 2 * self.cfg.pull_margin_s
            st.seen = {k: t for k, t in st.seen.items() if t >= horizon}
        return out

    def drop(self, job_id: str) -> None:
        self.pulls.pop(job_id, None)


__all__ = ["Cluster", "LeaseConfig"]
