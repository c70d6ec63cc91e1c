"""`laggard monitor serve` that cannot start says why in one line, exits 2 and leaves nothing behind.

On a busy port it prints no token and no dashboard address as if it were up, and leaves neither the
database nor the token file behind.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.collectives.launch import free_port  # noqa: E402


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("LAGGARD_TOKEN", None)
    try:
        return subprocess.run([sys.executable, "-m", "laggard.cli.base", "monitor", "serve", *args],
                              capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"monitor serve {' '.join(args)} started instead of failing")


def _failed_cleanly(r: subprocess.CompletedProcess, tmp_path: Path, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laggard: error:"), r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert "token:" not in r.stdout and "dashboard" not in r.stdout + r.stderr
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.name != "afile")
    assert left == [], left


def test_busy_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = _serve(tmp_path, "--db", str(tmp_path / "m.db"), "--port", str(port))
    _failed_cleanly(r, tmp_path, f"cannot listen on 127.0.0.1:{port}", "in use")


def test_unwritable_database(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("a file, not a directory")
    r = _serve(tmp_path, "--db", str(tmp_path / "afile" / "m.db"), "--port", str(free_port()))
    _failed_cleanly(r, tmp_path, str(tmp_path / "afile"))


def test_postgres_url_that_does_not_connect(tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    r = _serve(tmp_path, "--db", f"postgresql://nobody:secret@127.0.0.1:{free_port()}/x", "--port", str(free_port()))
    _failed_cleanly(r, tmp_path, "cannot connect to postgresql://nobody:***@127.0.0.1")
    assert "secret" not in r.stderr


def test_short_token(tmp_path: Path) -> None:
    r = _serve(tmp_path, "--db", str(tmp_path / "m.db"), "--port", str(free_port()), "--token", "short")
    _failed_cleanly(r, tmp_path, "at least 16 characters")


def test_files_it_made_are_removed_but_not_older_ones(tmp_path: Path) -> None:
    """A failed start removes what it created, never a database that was there before."""
    from laggard.monitor.serving import removed_on_failure

    old = tmp_path / "m.db"
    old.write_bytes(b"kept")
    with pytest.raises(RuntimeError), removed_on_failure(str(old)):
        (tmp_path / "m.db.token").write_text("new")
        (tmp_path / "m.db-wal").write_text("new")
        raise RuntimeError("start failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.db"] and old.read_bytes() == b"kept"
