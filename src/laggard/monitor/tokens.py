"""API tokens with roles: ``ingest``, ``read`` and ``admin``, kept hashed in the collector's database.

* **ingest** (a training job's tracers, relays, runtime controller): post op batches, heartbeats and
  hang reports, and the job's runtime action log; read that job's state (what the controller
  polls: its kill switch). With a job (``--job``) only that job's, batches of another job refused.
* **read** (people, dashboards, Prometheus): every page, API read and ``/metrics``; no change.
* **admin**: also what changes the collector: alert rules, tracing and the kill switch (``PATCH``),
  hang dump requests, and tokens (``/api/v1/tokens``). The collector's own token (``--token``, or
  the one made at its first start) is always admin.

A request outside its token's role is 403 with the reason; a revoked or expired token is 401 (and
so are the dashboard sessions signed in with it). A token is shown once when made (``laggard monitor
token create``, or ``POST /api/v1/tokens``) and stored as its SHA-256 only (it is 32 random bytes:
no dictionary to try). Several collectors on one database share the tokens; a token made or revoked
elsewhere (the CLI writes the database directly) counts on a running collector within
``CACHE_S`` (its lookups are cached that long, so the ingest path does not query the database on
every request).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from laggard.errors import LaggardError
from laggard.monitor.auth import MAIN, Principal, same
from laggard.monitor.guard import NO_TOKEN

ROLES = ("ingest", "read", "admin")
CACHE_S = 2.0
PREFIX = "lgk_"  # a laggard token made here (easy to spot in a leaked file or a secret scanner)

_JOB_POST = re.compile(r"^/api/v1/jobs/(?P<job>[^/]+)/(?:heartbeat|flight|actions)$")
_JOB_GET = re.compile(r"^/api/v1/jobs/(?P<job>[^/]+)(?:/actions)?$")


class Forbidden(Exception):
    """A request its token's role does not allow (403), found past the guard (the jobs of posted batches)."""


@dataclass(frozen=True, slots=True)
class TokenRow:
    token_id: str
    role: str
    job_id: str | None
    created_s: float
    expires_s: float | None
    revoked_s: float | None

    def state(self, now: float | None = None) -> str:
        if self.revoked_s is not None:
            return "revoked"
        if self.expires_s is not None and self.expires_s <= (time.time() if now is None else now):
            return "expired"
        return "active"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.token_id, "role": self.role, "job": self.job_id, "created_unix_s": self.created_s,
                "expires_unix_s": self.expires_s, "revoked_unix_s": self.revoked_s, "state": self.state()}


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(store: Any, role: str, job: str | None = None, expires_days: float | None = None) -> tuple[str, TokenRow]:
    """A new token of ``role`` (for ``job`` only, expiring after ``expires_days``): (the token, its row)."""
    from laggard.wire.batch import valid_job_id

    if role not in ROLES:
        raise LaggardError(f"--role {role}: one of {', '.join(ROLES)}")
    if job is not None:
        if role != "ingest":
            raise LaggardError("--job limits an ingest token to one job; read and admin tokens see every job")
        job = valid_job_id(job)
    if expires_days is not None and not (0 < expires_days < 100 * 365):
        raise LaggardError(f"--expires {expires_days:g}: days, more than 0 (and under a century)")
    token_id = "tk" + secrets.token_hex(5)
    token = PREFIX + secrets.token_urlsafe(32)
    expires_s = time.time() + expires_days * 86400 if expires_days is not None else None
    store.add_token(token_id, digest(token), role, job, expires_s)
    rows = store.token_rows(token_id=token_id)
    return token, TokenRow(*rows[0])


def listed(store: Any) -> list[TokenRow]:
    return [TokenRow(*r) for r in store.token_rows()]


def revoke(store: Any, token_id: str) -> TokenRow:
    """Revoke ``token_id``; one clear error when there is no such token (or it was revoked before)."""
    rows = store.token_rows(token_id=token_id)
    if not rows:
        raise LaggardError(f"no token {token_id!r} (laggard monitor token list shows the ids)")
    if not store.revoke_token(token_id):
        raise LaggardError(f"token {token_id} was revoked before")
    return TokenRow(*store.token_rows(token_id=token_id)[0])


class RoleAccess:
    """The collector's tokens (``laggard.monitor.guard.Access``): its own (admin) and the stored ones."""

    def __init__(self, main_token: str, store: Any) -> None:
        self.main, self.store = main_token, store
        self._cache: dict[tuple[str, str], tuple[float, TokenRow | None]] = {}
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Drop the cached lookups (a token was made or revoked here: it counts at once)."""
        with self._lock:
            self._cache.clear()

    def _row(self, kind: str, key: str) -> TokenRow | None:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get((kind, key))
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        rows = self.store.token_rows(**{kind: key})
        row = TokenRow(*rows[0]) if rows else None
        with self._lock:
            if len(self._cache) > 10_000:  # bounded: unknown tokens are cached too
                self._cache.clear()
            self._cache[(kind, key)] = (now, row)
        return row

    @staticmethod
    def _principal(row: TokenRow | None) -> Principal | str:
        if row is None:
            return NO_TOKEN
        state = row.state()
        if state != "active":
            return f"token {row.token_id} is {state}"
        return Principal(token_id=row.token_id, role=row.role, job=row.job_id)

    def authenticate(self, token: str) -> Principal | str:
        if same(token, self.main):
            return Principal(token_id=MAIN, role="admin")
        if not token.startswith(PREFIX):
            return NO_TOKEN
        return self._principal(self._row("digest", digest(token)))

    def by_id(self, token_id: str) -> Principal | str:
        if token_id == MAIN:
            return Principal(token_id=MAIN, role="admin")
        return self._principal(self._row("token_id", token_id))

    def authorize(self, who: Principal, method: str, path: str) -> str | None:
        return authorize(who, method, path)


def authorize(who: Principal, method: str, path: str) -> str | None:
    """Why ``who``'s role may not make this request (403), or None."""
    if who.role == "admin":
        return None
    if path == "/api/v1/tokens" or path.startswith("/api/v1/tokens/"):
        return f"managing tokens needs an admin token (token {who.token_id} is {who.role})"
    reading = method in ("GET", "HEAD")
    if who.role == "read":
        return None if reading else (f"token {who.token_id} is a read token: {method} {path} changes the collector "
                                     "and needs an admin token")
    if method == "POST" and path == "/api/v1/ops":
        return None  # the batches' jobs are checked as they are decoded (Forbidden)
    m = (_JOB_POST if method == "POST" else _JOB_GET if reading else None)
    found = m.match(path) if m is not None else None
    if found is not None:
        job = urllib.parse.unquote(found["job"])
        if who.job is not None and job != who.job:
            return f"token {who.token_id} may post for job {who.job!r} only, not {job!r}"
        return None
    return (f"token {who.token_id} is an ingest token: it posts batches, heartbeats, hang reports and its job's "
            f"actions; {method} {path} needs a read token (to read) or an admin one (to change)")


def only_job(scope_state: dict[str, Any] | None) -> str | None:
    """The job an ingest request's token is limited to (None: any)."""
    who = (scope_state or {}).get("principal")
    return who.job if isinstance(who, Principal) and who.role == "ingest" else None


__all__ = ["CACHE_S", "ROLES", "Forbidden", "RoleAccess", "TokenRow", "authorize", "create", "listed",
           "only_job", "revoke"]
