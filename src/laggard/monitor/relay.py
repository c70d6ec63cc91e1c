"""A node's relay (``laggard monitor relay``): its ranks' tracers post here; it posts packs upstream.

Every rank's tracer posts a batch of ops each flush; a 1,024-rank job is ~340 requests a second
into one collector at 1 step/s, and the collector's CPU per request (HTTP, the commit) is twice its
CPU per batch. A relay on each node takes its ranks' batches, checks each as the collector would
(a bad batch is refused to its tracer, not to the node), gathers those that arrive within
``RelayConfig.gather_s`` of the first, and posts them as one pack (``laggard.wire.pack``: their ops
joined in one table, which the collector reads once instead of once per rank).

Nothing is acknowledged early: a tracer's request waits until the collector answered the pack
holding its batch, and gets that batch's own answer (stored, duplicate, tracing paused, dump
request). A relay that dies loses nothing a tracer was told is stored; a collector that is down is
a 503 to every waiting tracer, which spools and retries as it would without a relay. Every other
route (heartbeats, hang reports, the controller's calls) is passed through as is. The relay checks
the collector's token itself: it never forwards for a caller without it. A collector that stops
answering does not stop the relay: a waiting batch holds no thread, a passed-through request one of
a few of its own (``RelayConfig.passthrough_max_waiting``), and the health check answers.

A relay also takes other relays' packs (``submit_pack``) and bundles (``submit_bundle``, what relays
sent before packs), so relays stack: a rack's relay over its nodes' relays sends the collector one
pack for several nodes (fewer, larger requests, ``bench_monitor``). An answer comes back to each
tracer through every relay between.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from laggard.errors import LaggardError
from laggard.monitor.app import read_body
from laggard.monitor.guard import TokenGuard
from laggard.wire.batch import CONTENT_TYPE, BadBatch, Batch, decode_batch, decode_batches
from laggard.wire.bundle import BUNDLE_CONTENT_TYPE, MAX_PARTS, decode_bundle
from laggard.wire.client import Client, CollectorDown, Refused
from laggard.wire.pack import PACK_CONTENT_TYPE, decode_pack, encode_pack

log = logging.getLogger("laggard.monitor.relay")


@dataclass(kw_only=True, slots=True)
class RelayConfig:
    # how long a pack waits for more batches after its first: a node's ranks flush at the same
    # step boundary, within milliseconds of each other; 50 ms gathers them for 50 ms of freshness
    # (a window is re-analyzed every 3 steps of ~1 s)
    gather_s: float = 0.05
    # batches per pack at most: a node's ranks' batches of a flush, or a backlog after an outage
    # (the collector's cap is laggard.wire.bundle.MAX_PARTS)
    max_parts: int = 256
    # bytes per pack at most (its parts' bodies as they came, or their ops' bytes): under the
    # collector's default 32 MiB body limit
    max_bundle_bytes: int = 16 * 2**20
    # the collector's answer, at most (a pack is committed before it is answered)
    upstream_timeout_s: float = 30.0
    # requests passed through (heartbeats, hang reports, the controller's calls) waiting on the
    # collector at once, on threads of their own; more wait their turn. The server's shared threads
    # serve the health check: a collector that stops answering must not take them
    passthrough_max_waiting: int = 16

    def __post_init__(self) -> None:
        if not 0 <= self.gather_s <= 10:
            raise LaggardError(f"relay: gather time must be 0-10 s, got {self.gather_s!r}")
        if not 1 <= self.max_parts <= MAX_PARTS:
            raise LaggardError(f"relay: max_parts must be 1-{MAX_PARTS}, got {self.max_parts!r}")
        if self.max_bundle_bytes < 1 or self.upstream_timeout_s <= 0 or self.passthrough_max_waiting < 1:
            raise LaggardError("relay: max_bundle_bytes, upstream_timeout_s and passthrough_max_waiting must be "
                               "positive")


@dataclass(slots=True)
class _Item:
    """A checked batch waiting for the next pack: its size against ``max_bundle_bytes`` and the
    future its tracer waits on."""

    batch: Batch
    size: int
    fut: Future


@dataclass(slots=True)
class RelayStats:
    batches: int = 0  # batches sent upstream (in packs)
    bundles: int = 0  # packs sent
    refused: int = 0  # batches refused here or by the collector
    down: int = 0  # batches answered 503: the collector was down


class Relay:
    """The gathering and forwarding, HTTP-free (``relay_app`` is the HTTP layer over it)."""

    def __init__(self, upstream: str, token: str, cfg: RelayConfig | None = None) -> None:
        self.cfg = cfg or RelayConfig()
        self.token = token
        self.upstream = upstream
        self._bundler = Client(upstream, token, timeout_s=self.cfg.upstream_timeout_s)
        self._local = threading.local()  # a kept-alive connection per passing-through thread
        self._q: queue.Queue[_Item | None] = queue.Queue()
        self.stats = RelayStats()
        self._thread: threading.Thread | None = None
        self._carry: _Item | None = None  # a batch that did not fit the last pack

    # ------------------------------------------------------------------ batches
    def submit(self, body: bytes) -> Future:
        """Queue a checked batch for the next pack; the future holds the collector's answer for
        it (a dict), or raises ``BadBatch`` / ``Refused`` (4xx) or ``CollectorDown`` (503)."""
        # BadBatch: refused to its own tracer, never part of a pack
        return self._queue(decode_batch(body), len(body))

    def submit_pack(self, body: bytes) -> list[Future]:
        """Another relay's pack: every part checked first (a bad part refuses the pack whole, as the
        collector does, and that relay sends its batches again one by one), then each queued as
        ``submit`` queues a batch; the futures in the pack's order."""
        return [self._queue(b, b.table.nbytes) for b in decode_pack(body)]

    def submit_bundle(self, body: bytes) -> list[Future]:
        """A bundle (``laggard.wire.bundle``), as ``submit_pack`` takes a pack."""
        parts = decode_bundle(body)
        return [self._queue(b, len(p)) for b, p in zip(decode_batches(parts), parts, strict=True)]

    def _queue(self, batch: Batch, size: int) -> Future:
        """Queue a checked batch for the sender thread; its future gets the collector's answer."""
        fut: Future = Future()
        self._q.put(_Item(batch, size, fut))
        return fut

    def start(self) -> Relay:
        self._thread = threading.Thread(target=self._run, name="laggard-relay", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(self.cfg.upstream_timeout_s + 5)
            self._thread = None
        self._bundler.close()

    def _run(self) -> None:
        while True:
            items = self._gather()
            if items is None:
                return
            try:
                self._send(items)
            except Exception as e:  # a bug here must not leave the tracers waiting for ever: each gets a 503
                log.exception("relay: sending %d batch(es) failed", len(items))
                for it in items:
                    if not it.fut.done():
                        it.fut.set_exception(CollectorDown(f"the relay could not send the batch ({e})"))

    def _gather(self) -> list[_Item] | None:
        """The next pack's batches: the first to come, and those within gather_s of it."""
        first, self._carry = self._carry or self._q.get(), None
        if first is None:
            return None
        items, size = [first], first.size
        deadline = time.monotonic() + self.cfg.gather_s
        while len(items) < self.cfg.max_parts:
            wait = deadline - time.monotonic()
            try:
                nxt = self._q.get(timeout=wait) if wait > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._q.put(None)  # close after this pack
                break
            if size + nxt.size > self.cfg.max_bundle_bytes:
                self._carry = nxt  # first in the next pack
                break
            items.append(nxt)
            size += nxt.size
        return items

    def _send(self, items: list[_Item]) -> None:
        """Post one pack; each batch's future gets its own answer. A pack the collector refuses (one
        whose job it no longer takes, say) is sent again batch by batch, so that only the batches at
        fault are refused."""
        try:
            ans = self._bundler.request("POST", "/api/v1/ops", encode_pack([it.batch for it in items]),
                                        PACK_CONTENT_TYPE)
            parts = ans["parts"] if isinstance(ans, dict) else None
            if not isinstance(parts, list) or len(parts) != len(items):
                raise CollectorDown("the collector's answer to a pack does not list its parts")
        except CollectorDown as e:
            self.stats.down += len(items)
            for it in items:
                it.fut.set_exception(e)
            return
        except Refused as e:
            if len(items) > 1:
                for it in items:
                    self._send([it])
                return
            self.stats.refused += 1
            items[0].fut.set_exception(e)
            return
        self.stats.bundles += 1
        self.stats.batches += len(items)
        for it, part in zip(items, parts, strict=True):
            it.fut.set_result(part)

    # ------------------------------------------------------------------ everything else
    def forward(self, method: str, path: str, body: bytes | None, content_type: str | None) -> tuple[int, bytes, str]:
        """One request passed through to the collector: (status, body, content type)."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client(self.upstream, self.token, timeout_s=self.cfg.upstream_timeout_s)
        return client.raw(method, path, body, content_type)


async def _answer_of(fut: Future) -> Any:
    """What the sender thread sets on a batch's future, awaited without holding a thread (a tracer's
    request waits as long as the collector takes to answer its pack); shielded, so that a request
    given up never cancels the future the sender sets."""
    return await asyncio.shield(asyncio.wrap_future(fut))


def relay_app(relay: Relay) -> Any:
    """The relay's HTTP API: ``POST /api/v1/ops`` gathered into packs, every other route passed through."""
    app = FastAPI(title="laggard relay", docs_url=None, redoc_url=None, openapi_url=None)
    limit = relay.cfg.max_bundle_bytes
    waiting: list[anyio.CapacityLimiter] = []  # the passthrough's limit, made in the server's event loop

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:  # no worker thread (as the collector's)
        st = relay.stats
        return {"ok": True, "relay": True, "upstream": relay.upstream, "batches": st.batches, "bundles": st.bundles,
                "refused": st.refused, "down": st.down}

    @app.post("/api/v1/ops")
    async def ops(request: Request) -> Response:
        body = await read_body(request, limit)
        ctype = request.headers.get("content-type", CONTENT_TYPE)
        try:
            if ctype.startswith((PACK_CONTENT_TYPE, BUNDLE_CONTENT_TYPE)):  # another relay's (a rack's relay)
                futs = (relay.submit_pack if ctype.startswith(PACK_CONTENT_TYPE) else relay.submit_bundle)(body)
                ans = {"parts": [await _answer_of(f) for f in futs]}
            else:
                ans = await _answer_of(relay.submit(body))
        except BadBatch as e:
            relay.stats.refused += 1
            return JSONResponse({"detail": str(e)}, status_code=422)  # as the collector answers it
        except Refused as e:
            return JSONResponse({"detail": e.detail}, status_code=e.status)
        except CollectorDown as e:
            return JSONResponse({"detail": f"the collector is down ({e})"}, status_code=503)
        return Response(orjson.dumps(ans), media_type="application/json")

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def passthrough(path: str, request: Request) -> Response:
        body = await read_body(request, limit)
        target = "/" + path + (f"?{request.url.query}" if request.url.query else "")
        if not waiting:
            waiting.append(anyio.CapacityLimiter(relay.cfg.passthrough_max_waiting))
        try:
            status, data, ctype = await anyio.to_thread.run_sync(
                relay.forward, request.method, target, body or None, request.headers.get("content-type"),
                limiter=waiting[0])
        except CollectorDown as e:
            return JSONResponse({"detail": f"the collector is down ({e})"}, status_code=503)
        return Response(data, status_code=status, media_type=ctype)

    return TokenGuard(app, relay.token)
