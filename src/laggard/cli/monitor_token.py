"""``laggard monitor token create|list|revoke``: the collector's API tokens with roles, in its database.

Light at import; each command opens the database the collector uses (``--db``, as ``monitor serve``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, short_help="API tokens with roles: create, list, revoke.", help=(
    "API tokens with roles, stored hashed in the collector's database. ingest: post batches, heartbeats, hang "
    "reports and the job's action log (one job's with --job); read: every page, API read and /metrics; admin: also "
    "rules, tracing and kill switches, dump requests and tokens. The collector's own token (--token of monitor "
    "serve, or the one made at its first start) is always admin. A revoked or expired token is refused (401); a "
    "running collector sees a token made or revoked here within 2 seconds."))

Db = Annotated[str, typer.Option("--db", help="The collector's database: its SQLite file, or a postgresql:// URL.")]


def _store(db: str):  # noqa: ANN202 - thin CLI glue
    from laggard.errors import LaggardError
    from laggard.monitor.store import Store

    if not db.startswith(("postgresql://", "postgres://")):
        p = Path(db.removeprefix("sqlite://"))
        if not p.is_file():
            raise LaggardError(f"--db {db}: no such database file (the one `laggard monitor serve --db` uses)")
    return Store(db)


def _when(t: float | None) -> str:
    import time

    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


@app.command()
def create(
    db: Db,
    role: Annotated[str, typer.Option("--role", help="ingest, read or admin.")],
    job: Annotated[str | None, typer.Option("--job", help="An ingest token for this job only.")] = None,
    expires: Annotated[float | None, typer.Option("--expires", help="Days until it expires (default: never).")] = None,
) -> None:
    """Make a token: printed once on stdout (only its SHA-256 is stored); its id and role on stderr."""
    from laggard.errors import LaggardError
    from laggard.monitor.tokens import create as make

    if expires is not None and not math.isfinite(expires):
        raise LaggardError(f"--expires {expires}: a finite number of days")
    store = _store(db)
    try:
        token, row = make(store, role, job, expires)
    finally:
        store.close()
    typer.echo(token)
    typer.echo(f"token {row.token_id}: role {row.role}" + (f", job {row.job_id}" if row.job_id else "")
               + (f", expires {_when(row.expires_s)}" if row.expires_s else "")
               + " (shown once: keep it; `laggard monitor token revoke " + row.token_id + "` ends it)", err=True)


@app.command("list")
def list_tokens(db: Db) -> None:
    """The tokens made: id, role, job, created, expires, state (active, expired, revoked); never the tokens."""
    from laggard.monitor.tokens import listed

    store = _store(db)
    try:
        rows = listed(store)
    finally:
        store.close()
    if not rows:
        typer.echo("no tokens made (the collector's own token is not listed: it is in its token file)", err=True)
        return
    typer.echo(f"{'id':<13} {'role':<7} {'job':<24} {'created':<17} {'expires':<17} state")
    for t in rows:
        typer.echo(f"{t.token_id:<13} {t.role:<7} {t.job_id or '-':<24} {_when(t.created_s):<17} "
                   f"{_when(t.expires_s):<17} {t.state()}")


@app.command()
def revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (from `token list`), not the token.")],
    db: Db,
) -> None:
    """Revoke a token: refused from now on (running collectors: within 2 seconds), with its dashboard sessions."""
    from laggard.monitor.tokens import revoke as end

    store = _store(db)
    try:
        row = end(store, token_id)
    finally:
        store.close()
    typer.echo(f"revoked {row.token_id} (role {row.role})")


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="token")
