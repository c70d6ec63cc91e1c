"""The collector's bearer token: given (``--token`` / ``LAGGARD_TOKEN``) or created once and kept in a 0600 file;
who a request comes from (``Principal``)."""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from laggard.errors import LaggardError


def default_token_path(db: str) -> Path:
    """Beside a SQLite database; under ~/.config/laggard for a PostgreSQL one."""
    if db.startswith(("postgresql://", "postgres://")):
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "laggard"
        return base / "monitor.token"
    return Path(db.removeprefix("sqlite://") + ".token")


def load_or_create(path: Path, given: str | None) -> tuple[str, bool]:
    """(token, created): the given token wins; else the stored one; else a new one written with mode 0600."""
    if given is not None:
        if len(given) < 16:
            raise LaggardError("--token / LAGGARD_TOKEN: use at least 16 characters")
        return given, False
    try:
        if path.exists():
            tok = path.read_text().strip()
            if tok:
                return tok, False
        path.parent.mkdir(parents=True, exist_ok=True)
        tok = secrets.token_urlsafe(32)
        # written whole under a private name, then linked in place only if no file is there yet:
        # collectors started at the same moment (one PostgreSQL database) all end up with one token
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(tok + "\n")
            os.chmod(tmp, 0o600)
            try:
                os.link(tmp, path)
            except FileExistsError:  # another start's, written meanwhile (or an empty file: replaced)
                theirs = path.read_text().strip()
                if theirs:
                    return theirs, False
                os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except OSError as e:
        raise LaggardError(f"{path}: cannot read or write the token file ({e.strerror or e})") from None
    return tok, True


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: the token it showed (directly, or through a dashboard session)."""

    token_id: str  # MAIN: the collector's own token (--token, or the one made at first start)
    role: str  # "ingest" | "read" | "admin"
    job: str | None = None  # an ingest token limited to one job


MAIN = "main"


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return None


def same(a: str, b: str) -> bool:
    """Two tokens compared in constant time."""
    return hmac.compare_digest(a.encode(), b.encode())
