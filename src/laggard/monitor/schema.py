"""The collector database's schema: its tables, the version it records, and making or upgrading it once.

A database records the schema version it holds (``laggard_meta``: ``schema_version``, and the
``laggard_version`` that last wrote the schema). Opening one:

* a new database gets every table and the current version;
* one made by an older laggard (a lower version, or none recorded: made before versions were
  recorded) gets what it lacks (tables, columns: its rows take their defaults) and the current version;
* one made by a newer laggard (a higher version), or whose version is not a number (not laggard's),
  is refused with one line (``LaggardError``) and left as it was.

Several collectors started at the same moment on one database make or upgrade it one after the
other, in one transaction each: on PostgreSQL that transaction first takes an advisory lock
(``pg_advisory_xact_lock``, released by its commit; without it concurrent ``CREATE TABLE IF NOT
EXISTS`` race in PostgreSQL's catalog and all but one fail with a duplicate key in ``pg_type``), on
SQLite it is ``BEGIN IMMEDIATE`` (the file's write lock). The ones that come after find the current
version and change nothing.
"""

from __future__ import annotations

from typing import Any

from laggard.errors import LaggardError

# 1: the first recorded version (jobs, batches, packs, rules, alerts, actions);
# 2: API tokens with roles (``tokens``: laggard.monitor.tokens);
# 3: several collectors on one database (``collectors``, ``leases``; batches record the collector
#    that stored them and, on PostgreSQL, their arrival order: laggard.monitor.cluster);
# 4: what a job's lease holder keeps for the next holder (``job_state``, ``hang_reports``:
#    laggard.monitor.shared)
SCHEMA_VERSION = 4
# the advisory lock key of the schema transaction (any fixed bigint: "laggard" in ASCII, then 1)
LOCK_KEY = 0x6C61676761726401

_META = "CREATE TABLE IF NOT EXISTS laggard_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
_TABLES = """
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, meta TEXT NOT NULL, tracing INTEGER NOT NULL,
    created_s DOUBLE PRECISION NOT NULL, act INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS batches (job_id TEXT NOT NULL, rank INTEGER NOT NULL, seq BIGINT NOT NULL,
    min_step BIGINT NOT NULL, max_step BIGINT NOT NULL, num_ops INTEGER NOT NULL,
    received_s DOUBLE PRECISION NOT NULL, body {blob} NOT NULL, PRIMARY KEY (job_id, rank, seq));
CREATE INDEX IF NOT EXISTS batches_step ON batches (job_id, max_step);
CREATE TABLE IF NOT EXISTS packs (pack_id {serial}, body {blob} NOT NULL);
CREATE TABLE IF NOT EXISTS rules (rule_id TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (alert_id {serial}, job_id TEXT NOT NULL, rule_id TEXT NOT NULL,
    created_s DOUBLE PRECISION NOT NULL, message TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS actions (job_id TEXT PRIMARY KEY, log TEXT NOT NULL, updated_s DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (token_id TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, role TEXT NOT NULL,
    job_id TEXT, created_s DOUBLE PRECISION NOT NULL, expires_s DOUBLE PRECISION, revoked_s DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS collectors (collector_id TEXT PRIMARY KEY, url TEXT NOT NULL, settings TEXT NOT NULL,
    seen_s DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS leases (job_id TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_s DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS job_state (job_id TEXT NOT NULL, part TEXT NOT NULL, state TEXT NOT NULL,
    updated_s DOUBLE PRECISION NOT NULL, PRIMARY KEY (job_id, part));
CREATE TABLE IF NOT EXISTS hang_reports (job_id TEXT NOT NULL, request BIGINT NOT NULL, rank INTEGER NOT NULL,
    body {blob} NOT NULL, PRIMARY KEY (job_id, request, rank));
"""
# columns added after a table's first release: (table, column, its definition). A database made by
# an older collector gets them on open; its rows take the default
_ADDED_COLUMNS = (("jobs", "act", "INTEGER NOT NULL DEFAULT 1"), ("batches", "pack_id", "BIGINT"),
                  ("batches", "row0", "INTEGER"), ("batches", "via", "TEXT"))
# PostgreSQL numbers batches in arrival order (a collector reads the ones others stored after it);
# SQLite's rowid does that already


def ensure(conn: Any, *, postgres: bool, where: str) -> int:
    """Make or upgrade the schema of the database ``conn`` is open on (one transaction, serialised
    with other collectors'); the version it held before (0: none recorded). ``where`` names the
    database in the refusal of a newer or unknown version (nothing is changed then)."""
    if postgres:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))  # opens the transaction
    else:
        conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_META)
        row = conn.execute("SELECT value FROM laggard_meta WHERE key = 'schema_version'").fetchone()
        found = _version(row[0] if row else None, where, conn)
        if found < SCHEMA_VERSION:
            ddl = _TABLES.format(blob="BYTEA" if postgres else "BLOB",
                                 serial="BIGSERIAL PRIMARY KEY" if postgres else "INTEGER PRIMARY KEY AUTOINCREMENT")
            for stmt in ddl.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            _add_columns(conn, postgres)
            _record(conn, postgres)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return found


def _version(value: str | None, where: str, conn: Any) -> int:
    if value is None:
        return 0
    if not value.strip().isdigit():
        raise LaggardError(f"{where}: not a laggard monitor database (its schema version is {value!r}); "
                           "pass another --db")
    found = int(value)
    if found > SCHEMA_VERSION:
        row = conn.execute("SELECT value FROM laggard_meta WHERE key = 'laggard_version'").fetchone()
        by = f"laggard {row[0]}" if row else "a newer laggard"
        raise LaggardError(f"{where}: the monitor database has schema version {found}, made by {by}; this laggard "
                           f"knows up to version {SCHEMA_VERSION}: upgrade laggard, or pass another --db")
    return found


def _add_columns(conn: Any, postgres: bool) -> None:
    for table, col, spec in _ADDED_COLUMNS:
        if postgres:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {col} {spec}")
        elif col not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {col} {spec}")
    if postgres:
        conn.execute("ALTER TABLE batches ADD COLUMN IF NOT EXISTS arrival BIGSERIAL")
        conn.execute("CREATE INDEX IF NOT EXISTS batches_arrival ON batches (job_id, arrival)")


def _record(conn: Any, postgres: bool) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:  # the installed distribution's (the package's facade sits above this layer)
        made_by = version("laggard")
    except PackageNotFoundError:
        made_by = "unknown"
    q = ("INSERT INTO laggard_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
    if postgres:
        q = q.replace("?", "%s")
    conn.execute(q, ("schema_version", str(SCHEMA_VERSION)))
    conn.execute(q, ("laggard_version", made_by))


__all__ = ["LOCK_KEY", "SCHEMA_VERSION", "ensure"]
