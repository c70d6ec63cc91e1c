"""Posting op batches to a collector (stdlib ``http.client``, one kept-alive connection)."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

from laggard.errors import LaggardError
from laggard.wire.batch import CONTENT_TYPE


class CollectorDown(OSError):
    """The collector cannot be reached or answered 5xx: worth retrying later."""


class Refused(LaggardError):
    """The collector answered 4xx: ``status`` and its one-line reason ``detail``."""

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status, self.detail = status, detail


class Client:
    """Requests to a collector (or relay). ``url`` may name several, comma-separated
    (``http://a:8765,http://b:8765``: collectors sharing one database): a request that cannot reach
    the current one goes to the next, and stays there while it answers."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 10.0) -> None:
        self._targets = [_target(u.strip()) for u in url.split(",") if u.strip()]
        if not self._targets:
            raise LaggardError(f"--url {url!r}: expected http://HOST:PORT")
        self._at = 0  # the target requests go to
        self.token = token
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    @property
    def url(self) -> str:
        """The address requests go to now."""
        https, host, port, prefix = self._targets[self._at]
        return f"{'https' if https else 'http'}://{host}:{port}{prefix}"

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            https, host, port, _ = self._targets[self._at]
            cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
            self._conn = cls(host, port, timeout=self.timeout_s)
        return self._conn

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
                ) -> Any:
        status, data, _ = self.raw(method, path, body, content_type)
        if status >= 500:
            raise CollectorDown(f"collector answered {status}")
        try:
            doc = json.loads(data) if data else None
        except ValueError:
            doc = None
        if status >= 400:
            why = doc.get("detail") if isinstance(doc, dict) else " ".join(data[:200].decode(errors="replace").split())
            raise Refused(f"collector refused {method} {path}: {status} {why}", status, str(why))
        return doc

    def post_batch(self, body: bytes) -> dict[str, Any]:
        return self.request("POST", "/api/v1/ops", body, CONTENT_TYPE)

    def raw(self, method: str, path: str, body: bytes | None, content_type: str | None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
        """One request as is (``request`` reads its answer; the relay passes it through), with
        ``headers`` besides: (status, body, content type); ``CollectorDown`` when the collector
        cannot be reached."""
        headers = dict(headers or {})
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        failed = []
        for _ in self._targets:  # each address once, the current one first
            # a kept-alive connection the server closed: reconnect once; not after a timeout (a server
            # that took the request and did not answer in time is not asked twice as long)
            for attempt in (0, 1):
                conn = self._connection()
                try:
                    conn.request(method, self._targets[self._at][3] + path, body=body, headers=headers)
                    resp = conn.getresponse()
                    return resp.status, resp.read(), resp.getheader("Content-Type") or "application/json"
                except (http.client.HTTPException, OSError) as e:
                    self.close()
                    if attempt or isinstance(e, TimeoutError):
                        failed.append(f"{self._targets[self._at][1]}:{self._targets[self._at][2]}: {e}")
                        break
            self._at = (self._at + 1) % len(self._targets)
        raise CollectorDown("; ".join(failed))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _target(url: str) -> tuple[bool, str, int, str]:
    """(https, host, port, path prefix) of one collector address."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise LaggardError(f"--url {url!r}: expected http://HOST:PORT")
    https = u.scheme == "https"
    return https, u.hostname, u.port or (443 if https else 80), u.path.rstrip("/")
