"""The collector's bearer token: given (``--token`` / ``LAGGARD_TOKEN``) or created once and kept in a 0600 file."""

from __future__ import annotations

import hmac
import os
import secrets
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
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(tok + "\n")
        os.chmod(path, 0o600)
    except OSError as e:
        raise LaggardError(f"{path}: cannot read or write the token file ({e.strerror or e})") from None
    return tok, True


def check(expected: str, authorization: str | None, cookie: str | None = None, query: str | None = None) -> bool:
    """A bearer header, the dashboard's cookie or a ?token= query parameter; compared in constant time."""
    for cand in (authorization.removeprefix("Bearer ").strip() if authorization and authorization.startswith("Bearer ")
                 else None, cookie, query):
        if cand and hmac.compare_digest(cand.encode(), expected.encode()):
            return True
    return False
