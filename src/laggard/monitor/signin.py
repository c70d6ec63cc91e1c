"""Signing in to the dashboard: a token typed into a page once, then a session cookie; never a token in a URL.

A URL is kept in server logs, browser history and Referer headers, so a ``token=`` query is refused
(``token_in_url``) and no printed address carries one. A browser opening ``/`` unsigned gets the
sign-in page; its form posts the token to ``/signin``, which answers with a session cookie
(``laggard_session``: HttpOnly, SameSite=Strict, Secure over TLS, for ``SESSION_S``) and sends the
browser back where it was going. The cookie holds no token: it is the id of the token it was made
with, a random session id and its expiry, signed with a key derived from the collector's own
token (``Sessions``), so collectors sharing a database and a token take each other's sessions, and
a session of a revoked token ends with it (the guard looks its token up on every request).
``/signout`` (the dashboard's button) clears the cookie and ends the session on this collector.
API clients and Prometheus keep sending ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable

from starlette.requests import HTTPConnection
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from laggard.monitor.auth import Principal

COOKIE = "laggard_session"
SESSION_S = 12 * 3600  # a working day: the dashboard asks for the token again the next morning
MAX_FORM_BYTES = 4096

TOKEN_IN_URL = ("a token in the URL is refused: URLs are kept in logs, browser history and Referer headers "
                "(treat a token that was in one as seen, and replace it). API clients: send it in an "
                "'Authorization: Bearer TOKEN' header; the dashboard: open / without it and sign in there")


def token_in_url(query_string: bytes) -> bool:
    """Whether a request's query carries a ``token`` parameter (checked before anything else)."""
    if b"token" not in query_string:  # the ingest path: no parsing
        return False
    return any(k == "token" for k, _ in urllib.parse.parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))


class Sessions:
    """Signed session values: ``token_id.session_id.expiry.signature``; sign-outs remembered until expiry."""

    def __init__(self, main_token: str, ttl_s: float = SESSION_S) -> None:
        self._key = hmac.new(main_token.encode(), b"laggard monitor session v1", hashlib.sha256).digest()
        self.ttl_s = ttl_s
        self._ended: dict[str, float] = {}  # session id -> its expiry (signed out here)
        self._lock = threading.Lock()

    def _sign(self, body: str) -> str:
        mac = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def issue(self, token_id: str) -> tuple[str, int]:
        """(the cookie's value, its expiry in unix seconds) of a new session of ``token_id``."""
        exp = int(time.time() + self.ttl_s)
        body = f"{token_id}.{secrets.token_urlsafe(16)}.{exp}"
        return f"{body}.{self._sign(body)}", exp

    def verify(self, value: str | None) -> str | None:
        """The token id of a valid session value (signed here, not expired, not signed out), else None."""
        if not value or value.count(".") != 3:
            return None
        body, sig = value.rsplit(".", 1)
        if not hmac.compare_digest(sig.encode(), self._sign(body).encode()):
            return None
        token_id, sid, exp = body.split(".")
        if not exp.isdigit() or int(exp) < time.time():
            return None
        with self._lock:
            return None if sid in self._ended else token_id

    def end(self, value: str | None) -> None:
        """Sign out: the session is refused here from now on (its cookie is also cleared)."""
        if self.verify(value) is None:
            return
        _, sid, exp, _ = value.split(".")  # type: ignore[union-attr]
        now = time.time()
        with self._lock:
            self._ended = {s: e for s, e in self._ended.items() if e >= now}
            self._ended[sid] = float(exp)


def wants_page(conn: HTTPConnection) -> bool:
    """A browser asking for a page (HTML), not an API client."""
    return "text/html" in conn.headers.get("accept", "")


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this server only (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    parts = urllib.parse.urlsplit(target)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "token"]
    return parts.path + (f"?{urllib.parse.urlencode(query)}" if query else "")


def page(message: str = "", *, next_url: str = "/", status: int = 401) -> HTMLResponse:
    """The sign-in page: a form posting the token to /signin (the token never goes into a URL)."""
    note = f'<p class="msg">{html.escape(message)}</p>' if message else ""
    return HTMLResponse(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>laggard monitor: sign in</title>"
        "<meta name=viewport content='width=device-width, initial-scale=1'><style>"
        "body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}"
        "header{background:#1d2330;color:#fff;padding:10px 18px;font-size:18px}"
        "main{max-width:560px;margin:40px auto;background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:18px}"
        "input[type=password]{width:100%;box-sizing:border-box;padding:6px;font:inherit}"
        ".msg{color:#b42318;font-weight:600}.muted{color:#6b7280}</style></head>"
        "<body><header>laggard monitor</header><main><h1 style='font-size:18px'>Sign in</h1>" + note +
        "<form method=post action=/signin><label for=token>Token</label> "
        "<input id=token name=token type=password autocomplete=current-password required autofocus>"
        f"<input type=hidden name=next value='{html.escape(safe_next(next_url), quote=True)}'>"
        "<p><button type=submit>Sign in</button></p></form>"
        "<p class=muted>The token is the one <code>laggard monitor serve</code> printed when it first started "
        "(or its <code>--token</code>, or <code>LAGGARD_TOKEN</code>), kept in its token file (beside a SQLite "
        "database, else ~/.config/laggard/monitor.token), or one made by <code>laggard monitor token create</code>. "
        "A session cookie keeps you signed in for 12 hours.</p></main></body></html>", status_code=status)


def refused_token_in_url(conn: HTTPConnection) -> Response:
    """401 for a request with ``?token=``: the sign-in page for a browser, else JSON; both say why."""
    if wants_page(conn) and conn.scope.get("method") == "GET":
        resp: Response = page(TOKEN_IN_URL, next_url=safe_next(conn.url.path + "?" + conn.url.query))
    else:
        resp = JSONResponse({"detail": TOKEN_IN_URL}, status_code=401)
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def _cross_site(conn: HTTPConnection) -> bool:
    """A form posted from another site (login CSRF): its Origin is not this server."""
    origin = conn.headers.get("origin")
    if origin is None:
        return False
    return origin == "null" or urllib.parse.urlsplit(origin).netloc != conn.headers.get("host", "")


async def _form(conn: HTTPConnection, receive: Callable) -> dict[str, str]:
    chunks, size = [], 0
    while True:
        msg = await receive()
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return {}
        chunks.append(chunk)
        if not msg.get("more_body"):
            break
    body = b"".join(chunks).decode("utf-8", "replace")
    if conn.headers.get("content-type", "").startswith("application/json"):
        try:
            d = json.loads(body)
        except ValueError:
            return {}
        return {k: v for k, v in d.items() if isinstance(v, str)} if isinstance(d, dict) else {}
    return dict(urllib.parse.parse_qsl(body, keep_blank_values=True))


def _cookie(resp: Response, conn: HTTPConnection, value: str, max_age: int) -> None:
    resp.set_cookie(COOKIE, value, max_age=max_age, path="/", httponly=True, samesite="strict",
                    secure=conn.url.scheme == "https")


async def sign_in(conn: HTTPConnection, receive: Callable, sessions: Sessions,
                  authenticate: Callable[[str], Principal | str]) -> Response:
    """POST /signin: the token from the form (or JSON) checked; a session cookie, then back to ``next``."""
    as_json = conn.headers.get("content-type", "").startswith("application/json")
    if _cross_site(conn):
        return JSONResponse({"detail": "sign-in from another site refused"}, status_code=403)
    form = await _form(conn, receive)
    who = authenticate(form.get("token", "").strip()) if form.get("token", "").strip() else "no token given"
    if not isinstance(who, Principal):
        why = f"not signed in: {who}"
        return JSONResponse({"detail": why}, status_code=401) if as_json else page(why, next_url=form.get("next", "/"))
    value, exp = sessions.issue(who.token_id)
    resp: Response = (JSONResponse({"signed_in": who.token_id, "role": who.role, "expires_unix_s": exp}) if as_json
                      else RedirectResponse(safe_next(form.get("next")), status_code=303))
    _cookie(resp, conn, value, int(sessions.ttl_s))
    return resp


def sign_out(conn: HTTPConnection, sessions: Sessions) -> Response:
    """POST /signout: the session ended here and its cookie cleared; a browser goes to the sign-in page."""
    if _cross_site(conn):
        return JSONResponse({"detail": "sign-out from another site refused"}, status_code=403)
    sessions.end(conn.cookies.get(COOKIE))
    resp: Response = (RedirectResponse("/signin?signed_out=1", status_code=303) if wants_page(conn)
                      else JSONResponse({"signed_out": True}))
    _cookie(resp, conn, "", 0)
    return resp


__all__ = ["COOKIE", "SESSION_S", "Sessions", "page", "refused_token_in_url", "safe_next", "sign_in", "sign_out",
           "token_in_url", "wants_page"]
