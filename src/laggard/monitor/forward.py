"""A job's requests answered by the collector that holds its lease (``laggard.monitor.cluster``), as plain ASGI.

The collectors of one database store every batch any of them is sent, but each job is analyzed by
one of them at a time, and its windows, hang case, kill switch and action log live there. So a
request about one job (``/api/v1/jobs/ID`` and below: its detail and analysis, a step's timeline,
the tracers' heartbeats and hang reports, dump requests, the tracing and act switches, the action
log) that comes to another collector is passed to the holder, and the holder's answer passed back:
a tracer, a controller or a browser may talk to any collector and gets the answers of the one that
analyses the job. Ingest, the job list, rules, alerts and metrics stay each collector's own.

The caller was let in here (``laggard.monitor.guard`` runs first) and its credentials go with the
request: the collectors of one database take the same tokens (the database's, and the one each is
started with, which also signs the dashboard's sessions: start them with the same ``--token``). A
holder refusing them is answered 502, saying so. A passed request carries ``X-Laggard-Via`` and is
never passed on again. Where the holder cannot be reached (killed, its lease not expired yet), this
collector answers from what it has; the lease comes here within a lease.

A holder that stops answering (stopped, swapping, wedged: its socket still takes connections) must
not take this collector with it. The requests waiting on holders run on a limiter of their own
(``MonitorConfig.forward_max_waiting``), never the server's shared threads that serve the health
check and the store's readers; one past that limit waits its turn, holding no thread (answered here
instead, a job's heartbeats would not reach its holder, whose hang check would then see ranks go
silent). Every request for a holder that did not answer in ``forward_timeout_s`` is answered here for
``forward_retry_s``, those waiting their turn included: a job's ranks beating to this collector cost
one timeout, not one each.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from laggard.wire.client import Client, CollectorDown

log = logging.getLogger("laggard.monitor")

VIA = "x-laggard-via"  # the collector that passed a request on (it is not passed again)
ANSWERED_BY = "x-laggard-answered-by"  # the holder whose answer this is
_JOB_PATH = re.compile(r"^/api/v1/jobs/([^/]+)(/[^/]+)?$")
_PASSED_HEADERS = (b"authorization", b"cookie", b"content-type")
_TRACER_PATHS = ("/heartbeat", "/flight")  # the job's ranks talk to this collector (cluster.posted)


class Forward:
    """Pass a job's requests to its holder (see the module)."""

    def __init__(self, app: ASGIApp, collector: Any) -> None:
        self.app, self.collector = app, collector
        self._local = threading.local()  # a kept-alive connection per worker thread and holder
        self._limiter: anyio.CapacityLimiter | None = None  # made in the server's event loop, on first use
        self._down_until: dict[str, float] = {}  # holder -> monotonic time before which it is not asked

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        m = _JOB_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if m is None or any(k == VIA.encode() for k, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        job_id, tail = m.group(1), m.group(2) or ""
        cluster = self.collector.cluster
        if tail in _TRACER_PATHS:
            cluster.posted(job_id)
        holder = cluster.holder_url(job_id)
        if holder is None or self._down_until.get(holder, 0.0) > time.monotonic():
            await self.app(scope, receive, send)
            return
        cfg = self.collector.cfg
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(cfg.forward_max_waiting)
        limit = cfg.max_report_bytes if tail == "/flight" else cfg.max_body_bytes
        body = await _body(receive, limit)
        if body is None:
            await _answer(send, 413, b'{"detail": "body over the limit of %d bytes"}' % limit, b"application/json")
            return
        path = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            path += b"?" + scope["query_string"]
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in _PASSED_HEADERS}
        headers[VIA] = cluster.id
        try:
            status, data, ctype = await anyio.to_thread.run_sync(
                self._pass, holder, scope["method"], path.decode("latin-1"), body, headers, limiter=self._limiter)
        except CollectorDown as e:
            now = time.monotonic()
            if self._down_until.get(holder, 0.0) <= now:  # not again for those that waited behind it
                log.info("job %s: its collector %s cannot be reached (%s): its jobs are answered here for %g s",
                         job_id, holder, e, cfg.forward_retry_s)
                self._down_until[holder] = now + cfg.forward_retry_s
            await self.app(scope, _replay(body, receive), send)
            return
        self._down_until.pop(holder, None)
        if status == 401:
            status, ctype = 502, "application/json"
            data = (b'{"detail": "collector %s, which analyses job %s, refused the credentials this collector '
                    b'took: start the collectors of one database with the same --token"}'
                    % (holder.encode(), job_id.encode()))
        await _answer(send, status, data, ctype.encode("latin-1"), holder.encode())

    def _pass(self, holder: str, method: str, path: str, body: bytes, headers: dict[str, str]
              ) -> tuple[int, bytes, str]:
        # checked again here, once the request's turn came: those that waited behind a holder's
        # timeout are answered at once
        if self._down_until.get(holder, 0.0) > time.monotonic():
            raise CollectorDown(f"{holder} did not answer within {self.collector.cfg.forward_timeout_s:g} s")
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        client = clients.get(holder)
        if client is None:
            client = clients[holder] = Client(holder, None, timeout_s=self.collector.cfg.forward_timeout_s)
        return client.raw(method, path, body or None, None, headers=headers)


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, None past ``limit`` bytes."""
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return b"".join(chunks)
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read already, then waits on the connection's."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _answer(send: Send, status: int, data: bytes, ctype: bytes, by: bytes | None = None) -> None:
    headers = [(b"content-type", ctype), (b"content-length", str(len(data)).encode())]
    if by is not None:
        headers.append((ANSWERED_BY.encode(), by))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


__all__ = ["ANSWERED_BY", "VIA", "Forward"]
