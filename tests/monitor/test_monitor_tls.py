"""TLS where a collector listens beyond loopback: without --tls-cert/--tls-key a non-loopback
--host is refused in one line (exit 2, nothing written) unless --insecure; with them the collector
serves HTTPS for real (a self-signed certificate made here with openssl), which laggard's own client
(``monitor push``) verifies through SSL_CERT_FILE, and the dashboard's session cookie is Secure."""

from __future__ import annotations

import http.client
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.collectives.launch import free_port  # noqa: E402
from tests.monitor_helpers import TOKEN  # noqa: E402

TRACE = Path(__file__).parents[1] / "data" / "ndtimeline" / "trace-AR.parquet"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "config"), "PYTHONUNBUFFERED": "1", **extra}
    env.pop("LAGGARD_TOKEN", None)
    return env


def _laggard(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "laggard.cli.base", *args], capture_output=True, text=True,
                              timeout=120, env=_env(tmp, **env), cwd=tmp)
    except subprocess.TimeoutExpired:
        pytest.fail(f"laggard {' '.join(args)} started instead of failing")


def _refused(r: subprocess.CompletedProcess, tmp: Path, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laggard: error:"), r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    left = sorted(p.name for p in tmp.iterdir() if p.suffix not in (".pem",))
    assert left == [], left  # no database, no token file


@pytest.fixture(scope="module")
def pem(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (openssl, one day)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    d = tmp_path_factory.mktemp("pem")
    cert, key = d / "cert.pem", d / "key.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(cert),
                        "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode:
        pytest.skip(f"openssl cannot make a certificate: {r.stderr.strip()[-200:]}")
    return cert, key


def test_a_non_loopback_address_without_tls_is_refused_unless_insecure(tmp_path, pem):
    db = str(tmp_path / "m.db")
    for host in ("0.0.0.0", "::"):
        r = _laggard(tmp_path, "monitor", "serve", "--db", db, "--host", host, "--port", str(free_port()))
        _refused(r, tmp_path, f"--host {host} is beyond loopback", "--tls-cert", "--insecure")
    r = _laggard(tmp_path, "monitor", "relay", "--host", "0.0.0.0", "--port", str(free_port()), "--token", TOKEN)
    _refused(r, tmp_path, "--host 0.0.0.0 is beyond loopback")
    cert, key = pem
    r = _laggard(tmp_path, "monitor", "serve", "--db", db, "--tls-cert", str(cert), "--port", str(free_port()))
    _refused(r, tmp_path, "--tls-cert and --tls-key go together")
    r = _laggard(tmp_path, "monitor", "serve", "--db", db, "--tls-cert", str(cert),
                 "--tls-key", str(tmp_path / "no.pem"),
                 "--port", str(free_port()))
    _refused(r, tmp_path, "--tls-key", "no such file")
    r = _laggard(tmp_path, "monitor", "serve", "--db", db, "--tls-cert", str(key), "--tls-key", str(key),
                 "--port", str(free_port()))  # a key where the certificate should be
    _refused(r, tmp_path, "cannot serve with them")
    # --insecure: plain HTTP beyond loopback, as asked
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "laggard.cli.base", "monitor", "serve", "--db", db,
                             "--host", "0.0.0.0", "--port", str(port), "--insecure", "--token", TOKEN],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    try:
        assert _wait(lambda: _get(http.client.HTTPConnection("127.0.0.1", port, timeout=5), "/healthz")[0] == 200, proc)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert f"dashboard: http://0.0.0.0:{port}/" in err


def _get(conn: http.client.HTTPConnection, path: str, method: str = "GET", body: str | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, str]:
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.headers, r.read().decode()
    finally:
        conn.close()


def _wait(ready, proc: subprocess.Popen, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read()[-2000:] if proc.stderr else ""
            pytest.fail(f"the server exited with {proc.returncode}: {err}")
        try:
            if ready():
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def test_the_collector_serves_https_with_a_self_signed_certificate(tmp_path, pem):
    cert, key = pem
    port = free_port()
    # bound beyond loopback (all addresses) with TLS: allowed; reached here on 127.0.0.1
    proc = subprocess.Popen([sys.executable, "-m", "laggard.cli.base", "monitor", "serve",
                             "--db", str(tmp_path / "m.db"), "--host", "0.0.0.0", "--port", str(port),
                             "--token", TOKEN, "--tls-cert", str(cert), "--tls-key", str(key)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    ctx = ssl.create_default_context(cafile=str(cert))  # verifying: the certificate and its 127.0.0.1 name

    def https() -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)

    try:
        assert _wait(lambda: _get(https(), "/healthz")[0] == 200, proc)
        assert _get(https(), "/api/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"})[:1] == (200,)
        assert _get(https(), "/api/v1/jobs")[0] == 401
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):  # plain HTTP: no answer
            _get(http.client.HTTPConnection("127.0.0.1", port, timeout=10), "/healthz")
        with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust it refuses it
            _get(http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ssl.create_default_context()),
                 "/healthz")
        # the dashboard's session cookie is Secure over HTTPS
        status, headers, _ = _get(https(), "/signin", "POST", urllib.parse.urlencode({"token": TOKEN}),
                                  {"Content-Type": "application/x-www-form-urlencoded", "Accept": "text/html"})
        assert status == 303 and "secure" in [a.strip().lower() for a in headers["set-cookie"].split(";")]
        # laggard's own client over HTTPS, trusting the certificate through SSL_CERT_FILE
        url = f"https://127.0.0.1:{port}"
        r = _laggard(tmp_path, "monitor", "push", str(TRACE), "--url", url, "--token", TOKEN, "--speed", "0",
                     "--job", "tlsjob", SSL_CERT_FILE=str(cert))
        assert r.returncode == 0 and "pushed" in r.stdout, r.stderr
        status, _, body = _get(https(), "/api/v1/jobs/tlsjob", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and '"num_ops"' in body
        r = _laggard(tmp_path, "monitor", "push", str(TRACE), "--url", url, "--token", TOKEN, "--speed", "0",
                     "--job", "tlsjob2")  # not trusted: one line, exit 2
        assert r.returncode == 2 and "Traceback" not in r.stderr and "SSL_CERT_FILE" in r.stderr, r.stderr
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert f"dashboard: https://0.0.0.0:{port}/" in err and "Traceback" not in err
