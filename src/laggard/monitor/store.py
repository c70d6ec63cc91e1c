"""The collector's database: SQLite (default, WAL) or PostgreSQL (a ``postgresql://`` URL, psycopg 3).

What is stored: jobs (metadata, tracing on/off, the runtime controller's kill switch ``act``), op
batches exactly as received (Arrow IPC, keyed by (job, rank, seq): a batch sent twice is stored
once; a relay's pack (``laggard.wire.pack``) once in ``packs``, each of its parts a batch row that
points at its rows there), each job's runtime action log (as the controller last sent it), alert rules
and fired alerts. Every write is committed before the HTTP answer (op batches group-committed: one
transaction for the batches that arrive while the previous one commits), so a restart loses nothing
that was acknowledged. The analysis is not stored: it is recomputed from the batches of the last window
on start. The tables, and the schema version the database records, are ``laggard.monitor.schema``'s
(made or upgraded on open, one collector at a time; a newer laggard's database is refused).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError
from laggard.monitor import schema
from laggard.monitor.shared import SharedTables


@dataclass(kw_only=True, slots=True)
class BatchRow:
    job_id: str
    rank: int
    seq: int
    min_step: int
    max_step: int
    num_ops: int
    body: bytes  # the batch as received; empty for a pack's part
    pack: bytes | None = None  # a pack's part: the pack's body (shared by its parts) ...
    row0: int = 0  # ... and the part's first row in it
    via: str | None = None  # the collector that stored it (laggard.monitor.cluster)


class StoreDown(OSError):
    """The database cannot be reached now (a 503: tracers spool and send again)."""


class _Pending:
    """A request's batches waiting for the group commit that writes them."""

    __slots__ = ("rows", "done", "new", "error")

    def __init__(self, rows: list[BatchRow]) -> None:
        self.rows, self.done, self.new, self.error = rows, False, [], None

    def result(self) -> list[bool]:
        if self.error is not None:
            raise self.error
        return self.new


class Store(SharedTables):
    """One connection guarded by a lock; op batches from concurrent requests are group-committed."""

    def __init__(self, url: str | Path) -> None:
        self.url = str(url)
        self._lock = threading.Lock()  # the connection
        self._group = threading.Condition(threading.Lock())  # the group-commit queue
        self._queue: list[_Pending] = []
        self._committing = False
        self.is_postgres = self.url.startswith(("postgresql://", "postgres://"))
        self._lost = False  # the PostgreSQL connection broke: the next transaction connects again
        if self.is_postgres:
            try:
                import psycopg
            except ImportError:
                raise LaggardError("a postgresql:// database needs psycopg: pip install 'laggard[monitor]'") from None
            self.where = _redact(self.url)
            try:
                self._conn: Any = psycopg.connect(self.url, autocommit=False)
            except psycopg.Error as e:
                raise LaggardError(f"cannot connect to {_redact(self.url)}: {str(e).strip().splitlines()[0]}") from None
        else:
            path = Path(self.url.removeprefix("sqlite://"))
            self.where = str(path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
                self._conn.execute("PRAGMA journal_mode=WAL")
                # NORMAL in WAL mode: a committed transaction survives a process crash (not a power cut)
                self._conn.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error as e:
                raise LaggardError(f"{path}: cannot open the monitor database ({e})") from None
        try:  # the tables, made or upgraded once however many collectors start at the same moment
            self.schema_found = schema.ensure(self._conn, postgres=self.is_postgres, where=self.where)
        except LaggardError:
            self._conn.close()
            raise
        except Exception as e:  # psycopg.Error, sqlite3.Error: the database refused the schema
            self._conn.close()
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise LaggardError(f"{self.where}: cannot create the monitor's tables ({why})") from None

    # ------------------------------------------------------------------ plumbing
    def _sql(self, q: str) -> str:
        return q.replace("?", "%s") if self.is_postgres else q

    def _exec(self, q: str, args: tuple = ()) -> Any:
        return self._conn.execute(self._sql(q), args)

    @contextlib.contextmanager
    def _transaction(self, *, read: bool = False) -> Iterator[Any]:
        """One transaction on the connection, under its lock: committed, or rolled back on an error.
        A PostgreSQL connection that broke (the server went down) raises ``StoreDown`` and is made
        again by the next transaction, so a collector carries on once the database is back. SQLite
        reads run outside a transaction (each statement sees the last commit)."""
        with self._lock:
            conn = self._connected()
            if not self.is_postgres and not read:
                conn.execute("BEGIN")
            try:
                yield conn
                if self.is_postgres or not read:
                    conn.commit()  # (a PostgreSQL read: ends its transaction)
            except Exception as e:
                with contextlib.suppress(Exception):  # a broken connection cannot roll back: it is made again
                    conn.rollback()
                if self.is_postgres and (conn.closed or conn.broken):
                    self._lost = True
                    raise StoreDown(f"{self.where}: the database is down ({_first_line(e)})") from None
                raise

    def _connected(self) -> Any:
        """The connection, made again after it broke (under the lock)."""
        if self._lost:
            import psycopg

            try:
                conn = psycopg.connect(self.url, autocommit=False)
            except psycopg.Error as e:
                raise StoreDown(f"{self.where}: the database is down ({_first_line(e)})") from None
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn, self._lost = conn, False
        return self._conn

    def _write(self, q: str, args: tuple = ()) -> int:
        with self._transaction():
            return self._exec(q, args).rowcount

    def _read(self, q: str, args: tuple = ()) -> list[tuple]:
        with self._transaction(read=True):
            return self._exec(q, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ------------------------------------------------------------------ jobs
    def add_job(self, job_id: str, meta: dict[str, Any]) -> None:
        self._write("INSERT INTO jobs (job_id, meta, tracing, created_s) VALUES (?, ?, 1, ?) ON CONFLICT DO NOTHING",
                    (job_id, json.dumps(meta), time.time()))

    def jobs(self) -> list[tuple[str, dict[str, Any], bool]]:
        return [(j, json.loads(m), bool(t)) for j, m, t in
                self._read("SELECT job_id, meta, tracing FROM jobs ORDER BY created_s")]

    def job(self, job_id: str) -> tuple[dict[str, Any], bool] | None:
        """The job's (meta, tracing), None when unknown."""
        rows = self._read("SELECT meta, tracing FROM jobs WHERE job_id = ?", (job_id,))
        return (json.loads(rows[0][0]), bool(rows[0][1])) if rows else None

    def set_tracing(self, job_id: str, on: bool) -> bool:
        return self._write("UPDATE jobs SET tracing = ? WHERE job_id = ?", (1 if on else 0, job_id)) > 0

    # ------------------------------------------------------------------ runtime actions
    def set_act(self, job_id: str, on: bool) -> bool:
        """The job's kill switch for runtime actions (False: its controllers stop acting)."""
        return self._write("UPDATE jobs SET act = ? WHERE job_id = ?", (1 if on else 0, job_id)) > 0

    def set_actions(self, job_id: str, actions: list[dict[str, Any]]) -> None:
        """The job's action log, replacing the one stored (the controller sends all of it each time:
        an action's step time after is filled in later)."""
        self._write("INSERT INTO actions (job_id, log, updated_s) VALUES (?, ?, ?) ON CONFLICT (job_id) "
                    "DO UPDATE SET log = excluded.log, updated_s = excluded.updated_s",
                    (job_id, json.dumps(actions), time.time()))

    def act_states(self) -> dict[str, tuple[bool, list[dict[str, Any]]]]:
        """Per job: (its kill switch, its action log) as stored."""
        rows = self._read("SELECT j.job_id, j.act, a.log FROM jobs j LEFT JOIN actions a ON a.job_id = j.job_id")
        return {j: (bool(act), json.loads(log) if log is not None else []) for j, act, log in rows}

    # ------------------------------------------------------------------ batches
    def add_batch(self, b: BatchRow) -> bool:
        """Store a batch; False when (job, rank, seq) was stored before (a retry): nothing changes."""
        return self.add_batches([b])[0]

    def add_batches(self, rows: list[BatchRow]) -> list[bool]:
        """Store batches (a relay's bundle) in one transaction; per batch, False when (job, rank,
        seq) was stored before (a retry): nothing changes for it.

        Returns once the batches are committed. Group commit: batches arriving from several request
        threads while a commit is under way are written together in the next transaction, by
        whichever of their threads comes first (no extra thread, no timer: a lone request commits at
        once); each caller still returns only after the transaction holding its batches committed."""
        mine = _Pending(rows)
        with self._group:
            self._queue.append(mine)
            while not mine.done and self._committing:
                self._group.wait()
            if mine.done:
                return mine.result()
            self._committing = True  # this thread commits everything queued, its own batch included
            group, self._queue = self._queue, []
        try:
            try:
                new = self._insert_batches([r for p in group for r in p.rows])
                at = 0
                for p in group:
                    p.new, at = new[at:at + len(p.rows)], at + len(p.rows)
            except Exception as e:  # every batch of the failed transaction fails alike
                for p in group:
                    p.error = e
        finally:
            with self._group:
                for p in group:
                    p.done = True
                self._committing = False
                self._group.notify_all()
        return mine.result()

    def _insert_batches(self, rows: list[BatchRow]) -> list[bool]:
        q = self._sql("INSERT INTO batches (job_id, rank, seq, min_step, max_step, num_ops, received_s, body, pack_id, "
                      "row0, via) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING")
        now = time.time()
        with self._transaction() as conn:
            packs: dict[int, int] = {}  # id of a pack's body -> its pack_id
            new = [conn.execute(q, (b.job_id, b.rank, b.seq, b.min_step, b.max_step, b.num_ops, now, b.body,
                                    self._pack_id(b.pack, packs), b.row0 if b.pack is not None else None,
                                    b.via)).rowcount > 0 for b in rows]
            self._drop_unused_packs(rows, new, packs)
        return new

    def _pack_id(self, pack: bytes | None, packs: dict[int, int]) -> int | None:
        """The id of ``pack``'s row, inserted on its first part (in the open transaction)."""
        if pack is None:
            return None
        pid = packs.get(id(pack))
        if pid is None:
            if self.is_postgres:
                pid = self._conn.execute("INSERT INTO packs (body) VALUES (%s) RETURNING pack_id",
                                         (pack,)).fetchone()[0]
            else:
                pid = self._conn.execute("INSERT INTO packs (body) VALUES (?)", (pack,)).lastrowid
            packs[id(pack)] = pid
        return pid

    def _drop_unused_packs(self, rows: list[BatchRow], new: list[bool], packs: dict[int, int]) -> None:
        """Remove the packs none of whose parts was new (a pack sent again): no row points at them."""
        used = {id(b.pack) for b, n in zip(rows, new, strict=True) if n and b.pack is not None}
        for key, pid in packs.items():
            if key not in used:
                self._exec("DELETE FROM packs WHERE pack_id = ?", (pid,))

    _BATCH_COLS = "b.rank, b.seq, b.min_step, b.max_step, b.num_ops, b.body, b.pack_id, b.row0, p.body"

    def batches_since(self, job_id: str, min_max_step: int) -> list[BatchRow]:
        """The job's batches holding a step from ``min_max_step`` on, by rank and seq (a pack's parts
        share one bytes object of its body)."""
        return self._batch_rows(job_id, self._read(
            f"SELECT {self._BATCH_COLS} FROM batches b LEFT JOIN packs p ON p.pack_id = b.pack_id "
            "WHERE b.job_id = ? AND b.max_step >= ? ORDER BY b.rank, b.seq", (job_id, min_max_step)))

    def arrival_mark(self, job_id: str) -> int:
        """The arrival number of the job's latest stored batch (0: none)."""
        col = "arrival" if self.is_postgres else "rowid"
        return int(self._read(f"SELECT COALESCE(MAX({col}), 0) FROM batches WHERE job_id = ?", (job_id,))[0][0])

    def batches_after(self, job_id: str, arrival: int, not_via: str) -> list[tuple[int, BatchRow]]:
        """The job's batches another collector than ``not_via`` stored after arrival number
        ``arrival``: (their arrival number, row), in arrival order."""
        col = "b.arrival" if self.is_postgres else "b.rowid"
        rows = self._read(f"SELECT {col}, {self._BATCH_COLS} FROM batches b LEFT JOIN packs p ON p.pack_id = b.pack_id "
                          f"WHERE b.job_id = ? AND {col} > ? AND (b.via IS NULL OR b.via <> ?) ORDER BY {col}",
                          (job_id, arrival, not_via))
        return list(zip([int(r[0]) for r in rows], self._batch_rows(job_id, [r[1:] for r in rows]), strict=True))

    @staticmethod
    def _batch_rows(job_id: str, rows: list[tuple]) -> list[BatchRow]:
        packs: dict[int, bytes] = {}
        out = []
        for r, s, a, b, n, body, pid, row0, pack in rows:
            if pid is not None and pid not in packs:
                packs[pid] = bytes(pack)
            out.append(BatchRow(job_id=job_id, rank=r, seq=s, min_step=a, max_step=b, num_ops=n, body=bytes(body),
                                pack=packs.get(pid) if pid is not None else None, row0=row0 or 0))
        return out

    def rank_progress(self, job_id: str) -> list[tuple[int, int, int, int]]:
        """Per rank: (rank, number of batches, number of ops, last step)."""
        return [tuple(int(x) for x in r) for r in self._read(
            "SELECT rank, COUNT(*), SUM(num_ops), MAX(max_step) FROM batches WHERE job_id = ? GROUP BY rank "
            "ORDER BY rank", (job_id,))]

    def num_ops(self, job_id: str) -> int:
        rows = self._read("SELECT COALESCE(SUM(num_ops), 0) FROM batches WHERE job_id = ?", (job_id,))
        return int(rows[0][0])

    # ------------------------------------------------------------------ rules, settings, alerts
    def rules(self) -> list[dict[str, Any]] | None:
        rows = self._read("SELECT spec FROM rules ORDER BY rule_id")
        return [json.loads(s) for (s,) in rows] if rows else None

    def set_rules(self, rules: list[dict[str, Any]]) -> None:
        with self._transaction():
            self._exec("DELETE FROM rules")
            for r in rules:
                self._exec("INSERT INTO rules (rule_id, spec) VALUES (?, ?)", (r["id"], json.dumps(r)))

    def add_alert(self, job_id: str, rule_id: str, message: str, detail: dict[str, Any]) -> None:
        self._write("INSERT INTO alerts (job_id, rule_id, created_s, message, detail) VALUES (?, ?, ?, ?, ?)",
                    (job_id, rule_id, time.time(), message, json.dumps(detail)))

    def alerts(self, job_id: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        q = "SELECT job_id, rule_id, created_s, message, detail FROM alerts"
        args: tuple = ()
        if job_id is not None:
            q += " WHERE job_id = ?"
            args = (job_id,)
        rows = self._read(q + " ORDER BY alert_id DESC LIMIT ?", (*args, limit))
        return [{"job": j, "rule": r, "time_unix_s": t, "message": m, "detail": json.loads(d)}
                for j, r, t, m, d in rows]

    # ------------------------------------------------------------------ API tokens (laggard.monitor.tokens)
    TOKEN_COLUMNS = "token_id, role, job_id, created_s, expires_s, revoked_s"

    def add_token(self, token_id: str, digest: str, role: str, job_id: str | None, expires_s: float | None) -> None:
        """A new token, stored by its digest only (the token itself is shown once, never kept)."""
        self._write("INSERT INTO tokens (token_id, digest, role, job_id, created_s, expires_s) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (token_id, digest, role, job_id, time.time(), expires_s))

    def token_rows(self, *, digest: str | None = None, token_id: str | None = None) -> list[tuple]:
        """Tokens as (``TOKEN_COLUMNS``): the one of ``digest`` or ``token_id``, else all by creation."""
        if digest is not None:
            return self._read(f"SELECT {self.TOKEN_COLUMNS} FROM tokens WHERE digest = ?", (digest,))
        if token_id is not None:
            return self._read(f"SELECT {self.TOKEN_COLUMNS} FROM tokens WHERE token_id = ?", (token_id,))
        return self._read(f"SELECT {self.TOKEN_COLUMNS} FROM tokens ORDER BY created_s, token_id")

    def revoke_token(self, token_id: str) -> bool:
        """Revoke a token (kept, marked); False when there is no such token or it was revoked before."""
        return self._write("UPDATE tokens SET revoked_s = ? WHERE token_id = ? AND revoked_s IS NULL",
                           (time.time(), token_id)) > 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _redact(url: str) -> str:
    """A database URL without its password (for error lines)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':', 1)[0]}:***@{host}"
    return url
