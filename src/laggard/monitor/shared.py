"""The tables the collectors of one database share (``laggard.monitor.cluster``): who is alive,
who holds each job's lease, and what the holder of a job keeps for the next one: the job's hang
case (its dump request, the open request's reports, the last verdict) and its alert rules' state.

A part of ``laggard.monitor.store.Store``: the same connection, lock and transactions.
"""

from __future__ import annotations

import json
import time
from typing import Any


class SharedTables:
    """Collectors, leases and each job's shared state (a part of ``Store``: ``_read``/``_write``)."""

    # ------------------------------------------------------------------ collectors and leases
    def beat_collector(self, collector_id: str, url: str, settings: str, now_s: float) -> None:
        self._write("INSERT INTO collectors (collector_id, url, settings, seen_s) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (collector_id) DO UPDATE SET url = excluded.url, settings = excluded.settings, "
                    "seen_s = excluded.seen_s", (collector_id, url, settings, now_s))

    def collectors(self, seen_after_s: float) -> list[tuple[str, str, str, float]]:
        """The collectors seen since ``seen_after_s``: (id, url, settings, seen_s)."""
        return self._read("SELECT collector_id, url, settings, seen_s FROM collectors WHERE seen_s > ? "
                          "ORDER BY collector_id", (seen_after_s,))

    def take_lease(self, job_id: str, owner: str, until_s: float, expired_before_s: float) -> bool:
        """Make ``owner`` the job's analyzer until ``until_s`` if the lease is free, its own, or
        expired before ``expired_before_s`` (one statement: of collectors taking it at once, one wins)."""
        return self._write("INSERT INTO leases (job_id, owner, expires_s) VALUES (?, ?, ?) ON CONFLICT (job_id) "
                           "DO UPDATE SET owner = excluded.owner, expires_s = excluded.expires_s "
                           "WHERE leases.owner = excluded.owner OR leases.expires_s < ?",
                           (job_id, owner, until_s, expired_before_s)) > 0

    def renew_leases(self, owner: str, until_s: float) -> set[str]:
        """Extend every lease ``owner`` holds; the jobs it holds."""
        self._write("UPDATE leases SET expires_s = ? WHERE owner = ?", (until_s, owner))
        return {r[0] for r in self._read("SELECT job_id FROM leases WHERE owner = ?", (owner,))}

    def leases(self) -> dict[str, tuple[str, float]]:
        """job -> (owner, expires_s)."""
        return {j: (o, float(e)) for j, o, e in self._read("SELECT job_id, owner, expires_s FROM leases")}

    def release_leases(self, owner: str) -> None:
        """Give up ``owner``'s leases now and leave (a clean stop: another collector takes its jobs at
        its next round)."""
        self._write("UPDATE leases SET expires_s = 0 WHERE owner = ?", (owner,))
        self._write("DELETE FROM collectors WHERE collector_id = ?", (owner,))

    # ------------------------------------------------------------------ what the holder of a job keeps for the next
    def put_job_state(self, job_id: str, part: str, state: dict[str, Any]) -> None:
        """Keep ``part`` ("hang": the job's hang case; "alerts": its rules' state; "summary": its line in
        the job list) of the job's state."""
        self._write("INSERT INTO job_state (job_id, part, state, updated_s) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (job_id, part) DO UPDATE SET state = excluded.state, updated_s = excluded.updated_s",
                    (job_id, part, json.dumps(state), time.time()))

    def job_state(self, job_id: str, part: str) -> dict[str, Any] | None:
        rows = self._read("SELECT state FROM job_state WHERE job_id = ? AND part = ?", (job_id, part))
        return json.loads(rows[0][0]) if rows else None

    def job_states(self, part: str) -> dict[str, dict[str, Any]]:
        """Every job's ``part``: job -> state."""
        rows = self._read("SELECT job_id, state FROM job_state WHERE part = ?", (part,))
        return {j: json.loads(st) for j, st in rows}

    def put_hang_report(self, job_id: str, request: int, rank: int, body: bytes) -> None:
        """A rank's report for the job's open request (a rank's newer report replaces its older one);
        the reports of older requests go (one verdict is open at a time)."""
        with self._transaction():
            self._exec("DELETE FROM hang_reports WHERE job_id = ? AND request < ?", (job_id, request))
            self._exec("INSERT INTO hang_reports (job_id, request, rank, body) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT (job_id, request, rank) DO UPDATE SET body = excluded.body",
                       (job_id, request, rank, body))

    def hang_reports(self, job_id: str, request: int) -> list[bytes]:
        """The reports kept for the job's ``request``, by rank."""
        return [bytes(b) for (b,) in self._read("SELECT body FROM hang_reports WHERE job_id = ? AND request = ? "
                                                "ORDER BY rank", (job_id, request))]

    def drop_hang_reports(self, job_id: str) -> None:
        """The job's verdict has its reports: they go."""
        self._write("DELETE FROM hang_reports WHERE job_id = ?", (job_id,))


__all__ = ["SharedTables"]
