"""The health checks answer while every worker thread of the server is taken (blocking store writes,
requests waiting on another collector): a probe that timed out then would have a healthy collector or
relay restarted. In-process ASGI calls, the server's thread limiter held in full."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

import anyio  # noqa: E402
import anyio.to_thread  # noqa: E402

from laggard.monitor.app import create_app  # noqa: E402
from laggard.monitor.config import MonitorConfig  # noqa: E402
from laggard.monitor.relay import Relay, RelayConfig, relay_app  # noqa: E402
from laggard.monitor.service import Collector  # noqa: E402
from laggard.monitor.store import Store  # noqa: E402
from tests.monitor_helpers import TOKEN  # noqa: E402


async def _get(app, path: str) -> tuple[int, dict]:  # noqa: ANN001
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body)


def _with_threads_taken(app, path: str, *, taken: bool) -> tuple[int, dict]:  # noqa: ANN001
    async def main() -> tuple[int, dict]:
        limiter = anyio.to_thread.current_default_thread_limiter()
        holders = [object() for _ in range(int(limiter.total_tokens))] if taken else []
        for h in holders:
            await limiter.acquire_on_behalf_of(h)
        try:
            with anyio.fail_after(5):
                return await _get(app, path)
        finally:
            for h in holders:
                limiter.release_on_behalf_of(h)

    return anyio.run(main)


@pytest.mark.parametrize("taken", [False, True])
def test_the_collectors_health_check_needs_no_thread(tmp_path, taken: bool) -> None:
    col = Collector(Store(tmp_path / "m.db"), MonitorConfig())
    try:
        assert _with_threads_taken(create_app(col, TOKEN), "/healthz", taken=taken) == (200, {"ok": True})
    finally:
        col.store.close()


@pytest.mark.parametrize("taken", [False, True])
def test_the_relays_health_check_needs_no_thread(taken: bool) -> None:
    relay = Relay("http://127.0.0.1:9", TOKEN, RelayConfig(gather_s=0.0))
    code, doc = _with_threads_taken(relay_app(relay), "/healthz", taken=taken)
    assert code == 200 and doc["ok"] and doc["relay"], doc
