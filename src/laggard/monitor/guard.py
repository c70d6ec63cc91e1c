"""Who may call the collector (or a relay): the request's token checked before any route runs, as plain ASGI.

Starlette's ``BaseHTTPMiddleware`` costs a task group and a body stream per request on the ingest
path; this is one check of a header. In order:

1. a ``token=`` query is refused (401 saying why: ``laggard.monitor.signin``), on every path;
2. ``/healthz`` is open; ``/signin`` (the page and its form) and ``/signout`` are the dashboard's;
3. the caller is the ``Authorization: Bearer`` token's, else the dashboard session cookie's token's;
   none (or a wrong, revoked or expired one): 401 with the reason (a browser asking for a page
   gets the sign-in page);
4. the token's role must allow the request (``Access.authorize``), else 403 with the reason.

The caller (``laggard.monitor.auth.Principal``) is left in ``scope["state"]["principal"]`` for the
routes. A route's unexpected exception is logged and answered 500 without a traceback.
"""

from __future__ import annotations

import logging
from typing import Protocol

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from laggard.monitor import signin
from laggard.monitor.auth import MAIN, Principal, bearer, same

NO_TOKEN = "missing or wrong bearer token"


class Access(Protocol):
    """The tokens a server takes, and what each may do."""

    def authenticate(self, token: str) -> Principal | str:
        """The token's caller, or why it is refused (a 401)."""

    def by_id(self, token_id: str) -> Principal | str:
        """A session's token's caller (it may have been revoked since), or why not."""

    def authorize(self, who: Principal, method: str, path: str) -> str | None:
        """Why ``who`` may not make this request (a 403), or None."""


class OneToken:
    """One token, allowed everything: a relay's (the collector's token, which it asks of its tracers)."""

    def __init__(self, token: str) -> None:
        self.token = token

    def authenticate(self, token: str) -> Principal | str:
        return Principal(token_id=MAIN, role="admin") if same(token, self.token) else NO_TOKEN

    def by_id(self, token_id: str) -> Principal | str:
        return Principal(token_id=MAIN, role="admin") if token_id == MAIN else NO_TOKEN

    def authorize(self, who: Principal, method: str, path: str) -> str | None:
        return None


class Guard:
    """The checks above around ``app``; ``sessions`` None: no dashboard sign-in (a relay)."""

    def __init__(self, app: ASGIApp, access: Access, sessions: signin.Sessions | None = None) -> None:
        self.app, self.access, self.sessions = app, access, sessions

    def _caller(self, conn: HTTPConnection) -> Principal | str:
        tok = bearer(conn.headers.get("authorization"))
        if tok is not None:
            return self.access.authenticate(tok)
        if self.sessions is not None:
            value = conn.cookies.get(signin.COOKIE)
            token_id = self.sessions.verify(value)
            if token_id is not None:
                return self.access.by_id(token_id)
            if value:
                return "the dashboard session ended (signed out or expired): sign in again"
        return NO_TOKEN

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if signin.token_in_url(scope.get("query_string", b"")):
            await signin.refused_token_in_url(HTTPConnection(scope))(scope, receive, send)
            return
        path = scope["path"]
        if path == "/healthz":
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        if self.sessions is not None and path in ("/signin", "/signout"):
            await (await self._signin(conn, receive))(scope, receive, send)
            return
        try:
            who = self._caller(conn)
        except OSError as e:  # the tokens' database is down (StoreDown): a caller retries later
            await JSONResponse({"detail": f"cannot check the token now ({e})"}, status_code=503)(scope, receive, send)
            return
        if not isinstance(who, Principal):
            await self._unauthorized(conn, who)(scope, receive, send)
            return
        why = self.access.authorize(who, scope["method"], path)
        if why is not None:
            await JSONResponse({"detail": why}, status_code=403)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = who
        await self._guarded(scope, receive, send)

    async def _signin(self, conn: HTTPConnection, receive: Receive) -> Response:
        assert self.sessions is not None
        method = conn.scope["method"]
        if conn.url.path == "/signin" and method == "GET":
            out = "signed_out" in conn.query_params
            return signin.page("signed out" if out else "", next_url=conn.query_params.get("next", "/"), status=200)
        if method != "POST":
            return JSONResponse({"detail": f"{conn.url.path} takes POST"}, status_code=405, headers={"Allow": "POST"})
        if conn.url.path == "/signin":
            return await signin.sign_in(conn, receive, self.sessions, self._reader)
        return signin.sign_out(conn, self.sessions)

    def _reader(self, token: str) -> Principal | str:
        """The caller of a token typed into the sign-in page, if it may read the dashboard."""
        who = self.access.authenticate(token)
        if isinstance(who, Principal):
            why = self.access.authorize(who, "GET", "/")
            if why is not None:
                return f"{why} (the dashboard needs a read or admin token)"
        return who

    def _unauthorized(self, conn: HTTPConnection, why: str) -> Response:
        if self.sessions is not None and conn.scope["method"] == "GET" and signin.wants_page(conn):
            query = f"?{conn.url.query}" if conn.url.query else ""
            resp: Response = signin.page("" if why == NO_TOKEN else why, next_url=conn.url.path + query)
        else:
            resp = JSONResponse({"detail": why}, status_code=401)
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:  # a bug must not look like a client error, but must not leak a traceback
            logging.getLogger("laggard.monitor").error("request failed", exc_info=e)
            if started:
                raise
            await JSONResponse({"detail": "internal error (logged by the collector)"},
                               status_code=500)(scope, receive, send)


def TokenGuard(app: ASGIApp, token: str) -> Guard:  # noqa: N802 (what relays have always called)
    """``app`` behind one bearer token, no dashboard sign-in (a relay)."""
    return Guard(app, OneToken(token))


__all__ = ["NO_TOKEN", "Access", "Guard", "OneToken", "TokenGuard"]
