"""Starting the collector service without half-starting it (``laggard monitor serve``).

The port is bound before anything is written, so a busy port is one line and nothing else; the
database and the token file are created only after that, and removed again when the start fails
later (an unwritable directory, a PostgreSQL URL that does not connect, a token too short), so a
failed start leaves the directory as it was. The bound socket is handed to uvicorn: nobody can take
the port between the check and the start.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError
from laggard.monitor.auth import default_token_path


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening (what uvicorn would bind), or one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # as uvicorn does: a collector restarted at once may reuse its port (TIME_WAIT), never a live one
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        why = "in use (another collector? pick another --port)" if e.errno in (98, 48) else (e.strerror or str(e))
        raise LaggardError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def files_of(db: str) -> list[Path]:
    """The files a start writes for ``db``: the SQLite file and its WAL/SHM, and the token file."""
    out = [default_token_path(db)]
    if not db.startswith(("postgresql://", "postgres://")):
        p = Path(db.removeprefix("sqlite://"))
        out += [p, p.with_name(p.name + "-wal"), p.with_name(p.name + "-shm")]
    return out


@contextlib.contextmanager
def removed_on_failure(db: str) -> Iterator[None]:
    """Remove the files of ``db`` that the block created, when the block fails."""
    before = {p for p in files_of(db) if p.exists()}
    try:
        yield
    except BaseException:
        for p in files_of(db):
            if p not in before:
                with contextlib.suppress(OSError):
                    p.unlink()
        raise


def open_collector(db: str, host: str, port: int, token: str | None, cfg: Any, webhooks: list[str], *,
                   https: bool) -> tuple[Any, socket.socket, str, bool, str]:
    """The collector ``laggard monitor serve`` runs, started in the order the module says: (the
    collector, its bound socket, its token, whether the token was made now, its address)."""
    from laggard.monitor import auth
    from laggard.monitor.service import Collector
    from laggard.monitor.store import Store

    token_path = auth.default_token_path(db)
    if token is not None:
        auth.load_or_create(token_path, token)  # checks it; writes nothing
    sock = listen(host, port)  # before anything is written: a busy port leaves nothing behind
    try:
        with removed_on_failure(db):
            store = Store(db)
            try:
                tok, created = auth.load_or_create(token_path, token)
            except BaseException:
                store.close()
                raise
    except BaseException:
        sock.close()
        raise
    scheme = "https" if https else "http"
    base = f"{scheme}://{host}:{port}"
    # the address the other collectors of the database pass a job's requests to (laggard.monitor.forward)
    reach = base if host not in ("0.0.0.0", "::", "") else f"{scheme}://{socket.getfqdn()}:{port}"
    try:  # one id per host and port: a restarted collector takes its jobs back at once
        collector = Collector(store, cfg, webhooks=webhooks, identity=(f"{os.uname().nodename}:{port}", reach))
    except BaseException:
        store.close()
        sock.close()
        raise
    return collector, sock, tok, created, base


__all__ = ["files_of", "listen", "open_collector", "removed_on_failure"]
