"""The collector's HTTP API (FastAPI): thin routes over ``laggard.monitor.service.Collector``.

Everything but ``/healthz`` needs a bearer token (or, for the dashboard in a browser, the session
cookie of signing in at ``/signin``) whose role allows the request (``laggard.monitor.tokens``); a
token in a URL is refused (``laggard.monitor.guard`` checks every request before these routes).
Errors a client can cause are 4xx with ``{"detail": reason}``.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import orjson
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from laggard.errors import LaggardError
from laggard.monitor import tokens
from laggard.monitor.controls import UnknownJob
from laggard.monitor.forward import Forward
from laggard.monitor.guard import Guard
from laggard.monitor.hangs import BadReport
from laggard.monitor.service import Collector
from laggard.monitor.store import StoreDown
from laggard.wire.batch import BadBatch
from laggard.wire.bundle import BUNDLE_CONTENT_TYPE
from laggard.wire.pack import PACK_CONTENT_TYPE


def create_app(collector: Collector, token: str) -> FastAPI:
    """The collector's app behind its guard: ``token`` is its own (admin; it also signs the dashboard's
    sessions); the tokens made with roles (``laggard.monitor.tokens``) are in its database."""
    from laggard.monitor.signin import Sessions

    app = FastAPI(title="laggard monitor", docs_url=None, redoc_url=None, openapi_url=None)
    access = tokens.RoleAccess(token, collector.store)
    app.add_middleware(Forward, collector=collector)  # inside the guard: a caller is let in first
    app.add_middleware(Guard, access=access, sessions=Sessions(token))
    _error_handlers(app)
    _token_routes(app, collector.store, access)
    _job_routes(app, collector)
    _control_routes(app, collector)
    _hang_routes(app, collector)
    _admin_routes(app, collector)
    return app


def _error_handlers(app: FastAPI) -> None:
    """Errors a client can cause, as 4xx with ``{"detail": reason}``."""
    @app.exception_handler(UnknownJob)
    async def _unknown(_: Request, e: UnknownJob) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=404)

    @app.exception_handler(BadBatch)
    async def _bad_batch(_: Request, e: BadBatch) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=422)

    @app.exception_handler(tokens.Forbidden)
    async def _forbidden(_: Request, e: tokens.Forbidden) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=403)

    @app.exception_handler(BadReport)
    async def _bad_report(_: Request, e: BadReport) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=422)

    @app.exception_handler(StoreDown)
    async def _down(_: Request, e: StoreDown) -> JSONResponse:  # tracers spool and send again
        return JSONResponse({"detail": str(e)}, status_code=503)

    @app.exception_handler(LaggardError)
    async def _bad(_: Request, e: LaggardError) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()))
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": e.detail}, status_code=e.status_code)


def _job_routes(app: FastAPI, collector: Collector) -> None:
    """Ingest and the jobs: their state, analyses and step timelines."""
    # a coroutine: it needs none of the worker threads that blocking store writes and forwarded
    # requests may all hold, so a probe never takes a busy collector for a dead one
    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.post("/api/v1/ops")
    async def ingest(request: Request) -> Response:
        body = await read_body(request, collector.cfg.max_body_bytes)
        # a relay's pack (laggard.wire.pack) or bundle of batches (laggard.wire.bundle), or one tracer's batch
        ctype = request.headers.get("content-type", "")
        take = (collector.ingest_pack if ctype.startswith(PACK_CONTENT_TYPE) else
                collector.ingest_bundle if ctype.startswith(BUNDLE_CONTENT_TYPE) else collector.ingest)
        # a worker thread: the store write blocks until durable; the answer skips FastAPI's encoder.
        # An ingest token limited to one job posts that job's batches only (403)
        ans = await run_in_threadpool(take, body, tokens.only_job(request.scope.get("state")))
        return Response(orjson.dumps(ans), media_type="application/json")

    @app.get("/api/v1/jobs")
    def jobs() -> list[dict[str, Any]]:
        return collector.summaries()

    @app.get("/api/v1/jobs/{job_id}")
    def job(job_id: str) -> dict[str, Any]:
        return collector.detail(job_id)

    @app.get("/api/v1/jobs/{job_id}/analysis")
    def analysis(job_id: str) -> Response:
        win = collector.job(job_id)
        if win.result is None:
            by = collector.cluster.owner_of(job_id)
            if by is not None and not by["this"]:  # its batches may go to the others: its analysis is there
                raise HTTPException(409, f"job {job_id!r} is analyzed by collector {by['collector']} ({by['url']})")
            raise HTTPException(409, f"job {job_id!r} has no complete window yet"
                                + (f" ({win.error})" if win.error else ""))
        from laggard.report.jsonout import dumps

        return Response(dumps(win.result.doc), media_type="application/json")

    @app.get("/api/v1/jobs/{job_id}/timeline")
    def timeline(job_id: str, step: int) -> dict[str, Any]:
        with collector._lock:
            ops = collector.job(job_id).step_timeline(step)
        if not ops:
            raise HTTPException(404, f"step {step} of job {job_id!r} is not in memory (only the current window is)")
        return {"step": step, "ops": ops}


def _control_routes(app: FastAPI, collector: Collector) -> None:
    """What an operator or the runtime controller changes on a job: tracing, the act kill switch, its actions."""
    @app.patch("/api/v1/jobs/{job_id}")
    async def control(job_id: str, request: Request) -> dict[str, Any]:
        d = await read_json(request, collector.cfg.max_body_bytes)
        if (not isinstance(d, dict) or not d or set(d) - {"tracing", "act"}
                or not all(isinstance(v, bool) for v in d.values())):
            raise HTTPException(422, 'expected {"tracing": true|false} and/or {"act": true|false}')
        if "tracing" in d:
            collector.set_tracing(job_id, d["tracing"])
        if "act" in d:  # the runtime controller's kill switch (laggard.mitigate.Controller polls it)
            collector.set_act(job_id, d["act"])
        return {"id": job_id, **d}

    @app.post("/api/v1/jobs/{job_id}/actions")
    async def actions(job_id: str, request: Request) -> dict[str, Any]:
        """The runtime controller's action log, shown on the dashboard."""
        body = await read_json(request, collector.cfg.max_body_bytes)
        return {"id": job_id, "num_actions": await run_in_threadpool(collector.set_actions, job_id, body)}

    @app.get("/api/v1/jobs/{job_id}/actions")
    def get_actions(job_id: str) -> dict[str, Any]:
        """The kill switch and the action log: step, kind, DP ranks, reason, step time before and after."""
        return collector.actions(job_id)


def _hang_routes(app: FastAPI, collector: Collector) -> None:
    """Hangs: dump requests, the tracers' heartbeats and hang reports, and the verdict."""
    @app.post("/api/v1/jobs/{job_id}/dump")
    def dump(job_id: str) -> dict[str, Any]:
        """Ask the job's tracers for their hang reports (Flight Recorder dumps): the verdict follows at .../hang."""
        return {"id": job_id, "dump_request": collector.request_dump(job_id)}

    @app.post("/api/v1/jobs/{job_id}/heartbeat")
    async def heartbeat(job_id: str, request: Request) -> Response:
        """A tracer's heartbeat (laggard.tracer.stream): its step and op; answered with the job's state."""
        d = await read_json(request, collector.cfg.max_body_bytes)
        ans = await run_in_threadpool(collector.heartbeat, job_id, d)
        return Response(orjson.dumps(ans), media_type="application/json")

    @app.post("/api/v1/jobs/{job_id}/flight")
    async def flight(job_id: str, request: Request, request_no: int = Query(0, alias="request")) -> dict[str, Any]:
        """A rank's hang report for dump request ``request``: its Flight Recorder dump and tracer state
        (JSON or pickle)."""
        collector.job(job_id)  # 404 before reading the body
        body = await read_body(request, collector.cfg.max_report_bytes)
        return await run_in_threadpool(collector.add_report, job_id, request_no, body)

    @app.get("/api/v1/jobs/{job_id}/hang")
    def hang(job_id: str) -> Response:
        """The last hang verdict: the `laggard hang --json` document of the ranks' reports."""
        doc = collector.job(job_id).hangs.doc
        if doc is None:
            raise HTTPException(404, f"job {job_id!r} has no hang verdict yet (POST .../dump asks for one)")
        return Response(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS), media_type="application/json")


def _admin_routes(app: FastAPI, collector: Collector) -> None:
    """Alert rules, alerts, Prometheus metrics and the dashboard."""
    @app.get("/api/v1/rules")
    def rules() -> list[dict[str, Any]]:
        return [r.to_json() for r in collector.rules]

    @app.put("/api/v1/rules")
    async def put_rules(request: Request) -> list[dict[str, Any]]:
        return [r.to_json() for r in collector.set_rules(await read_json(request, collector.cfg.max_body_bytes))]

    @app.get("/api/v1/alerts")
    def alerts(job: str | None = None) -> list[dict[str, Any]]:
        return collector.store.alerts(job)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(collector.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/", response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(resources.files("laggard.monitor").joinpath("dashboard.html").read_text())


def _token_routes(app: FastAPI, store: Any, access: tokens.RoleAccess) -> None:
    """``/api/v1/tokens`` (admin): list (GET), make (POST ``{"role", "job"?, "expires_days"?}``: the token
    is in this answer only), revoke (DELETE .../ID); a change here counts at once."""
    @app.get("/api/v1/tokens")
    def tokens_list() -> list[dict[str, Any]]:
        return [t.to_json() for t in tokens.listed(store)]

    @app.post("/api/v1/tokens")
    async def tokens_create(request: Request) -> dict[str, Any]:
        d = await read_json(request, 4096)
        if not isinstance(d, dict) or set(d) - {"role", "job", "expires_days"} or not isinstance(d.get("role"), str):
            raise LaggardError('expected {"role": "ingest"|"read"|"admin", "job": ID?, "expires_days": N?}')
        days = d.get("expires_days")
        if days is not None and (isinstance(days, bool) or not isinstance(days, int | float)):
            raise LaggardError("expires_days: a number of days")
        token, row = tokens.create(store, d["role"], d.get("job"), days)
        access.forget()
        return {"token": token, **row.to_json()}

    @app.delete("/api/v1/tokens/{token_id}")
    def tokens_revoke(token_id: str) -> dict[str, Any]:
        row = tokens.revoke(store, token_id)
        access.forget()
        return row.to_json()


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) past ``limit`` bytes, declared or streamed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {int(declared)} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"body over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON (400 when it is not)."""
    body = await read_body(request, limit)
    try:
        return json.loads(body)
    except ValueError as e:
        raise HTTPException(400, f"body is not JSON ({e})") from None


__all__ = ["create_app", "read_body", "read_json"]
