"""No token in a URL: the dashboard signs in on a page and keeps an HttpOnly, SameSite=Strict
session cookie that holds no token; ``?token=`` is refused saying why; API clients keep the bearer
header; signing out ends the session. Against a real ``monitor serve`` process (and Chromium)."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from tests.monitor_helpers import TOKEN, Server, sign_in  # noqa: E402

HTML = "text/html,application/xhtml+xml"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("signin")
    s = Server(str(tmp / "m.db"), tmp).start()
    try:
        yield s
    finally:
        s.stop()


def _call(srv: Server, method: str, path: str, body: str | None = None, **headers: str):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    h = {k.replace("_", "-"): v for k, v in headers.items()}
    if body is not None:
        h.setdefault("Content-Type", "application/x-www-form-urlencoded")
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read().decode()
    conn.close()
    return r.status, r.headers, data


def _form(token: str, next_url: str = "/") -> str:
    return urllib.parse.urlencode({"token": token, "next": next_url})


def _session(headers) -> str:
    """The session cookie's value of a Set-Cookie answer."""
    cookie = headers["set-cookie"]
    return cookie.split(";", 1)[0].split("=", 1)[1]


def test_a_token_in_the_url_is_refused_saying_why_even_with_a_good_header(srv):
    for path in ("/api/v1/jobs?token=" + TOKEN, "/metrics?token=" + TOKEN, "/?job=x&token=" + TOKEN):
        status, _, body = _call(srv, "GET", path, Authorization=f"Bearer {TOKEN}")
        detail = json.loads(body)["detail"]
        assert status == 401 and "token in the URL is refused" in detail and "Authorization: Bearer" in detail, body
    # a browser: the sign-in page, saying why
    status, headers, body = _call(srv, "GET", f"/?token={TOKEN}", Accept=HTML)
    assert status == 401 and headers["content-type"].startswith("text/html")
    assert "token in the URL is refused" in body and "action=/signin" in body and TOKEN not in body
    assert "set-cookie" not in headers  # the URL's token signs nobody in
    # what serve printed at start: the dashboard's address, no token
    log = srv.log.read_text()
    assert f"dashboard: http://127.0.0.1:{srv.port}/ (sign in with the token)" in log and TOKEN not in log


def test_sign_in_sets_a_strict_httponly_session_cookie_without_the_token(srv):
    status, headers, body = _call(srv, "GET", "/", Accept=HTML)  # not signed in: the page
    assert status == 401 and "action=/signin" in body and 'name=token type=password' in body
    status, headers, _ = _call(srv, "POST", "/signin", _form(TOKEN, "/?job=abc"), Accept=HTML)
    assert status == 303 and headers["location"] == "/?job=abc"
    cookie = headers["set-cookie"]
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "path", "max-age"} <= attrs and "samesite=strict" in cookie.lower(), cookie
    assert "secure" not in attrs  # plain HTTP on loopback; over TLS it is Secure
    value = _session(headers)
    assert TOKEN not in value and value.startswith("main.")
    for path in ("/", "/api/v1/jobs", "/metrics"):
        status, _, _ = _call(srv, "GET", path, Cookie=f"laggard_session={value}")
        assert status == 200, path
    # a forged or altered session is refused
    forged = value[:-2] + ("AA" if not value.endswith("AA") else "BB")
    assert _call(srv, "GET", "/api/v1/jobs", Cookie=f"laggard_session={forged}")[0] == 401
    assert _call(srv, "GET", "/api/v1/jobs", Cookie=f"laggard_session={TOKEN}")[0] == 401  # the raw token is no cookie
    # the API keeps its bearer header
    assert srv.request("GET", "/api/v1/jobs")[0] == 200
    status, body = srv.request("GET", "/metrics")
    assert status == 200 and "laggard_" in body


def test_a_wrong_token_a_foreign_site_and_an_outside_next_are_refused(srv):
    status, headers, body = _call(srv, "POST", "/signin", _form("wrong-token-0123456789"), Accept=HTML)
    assert status == 401 and "not signed in: missing or wrong bearer token" in body and "set-cookie" not in headers
    status, headers, _ = _call(srv, "POST", "/signin", _form(TOKEN), Origin="https://evil.example")
    assert status == 403 and "set-cookie" not in headers
    status, headers, _ = _call(srv, "POST", "/signin", _form(TOKEN, "//evil.example/x"),
                               Origin=f"http://127.0.0.1:{srv.port}")
    assert status == 303 and headers["location"] == "/"
    status, headers, body = _call(srv, "POST", "/signin", json.dumps({"token": TOKEN}), Content_Type="application/json")
    assert status == 200 and json.loads(body)["role"] == "admin" and "laggard_session=" in headers["set-cookie"]


def test_sign_out_ends_the_session(srv):
    _, headers, _ = _call(srv, "POST", "/signin", _form(TOKEN), Accept=HTML)
    value = _session(headers)
    assert _call(srv, "GET", "/api/v1/jobs", Cookie=f"laggard_session={value}")[0] == 200
    status, headers, _ = _call(srv, "POST", "/signout", "", Accept=HTML, Cookie=f"laggard_session={value}")
    assert status == 303 and headers["location"] == "/signin?signed_out=1"
    assert "max-age=0" in headers["set-cookie"].lower()
    status, _, body = _call(srv, "GET", "/api/v1/jobs", Cookie=f"laggard_session={value}")  # the old cookie, replayed
    assert status == 401 and "session ended" in json.loads(body)["detail"]
    assert _call(srv, "GET", "/signin?signed_out=1", Accept=HTML)[2].count("signed out") >= 1


def test_the_dashboard_signs_in_on_its_page_and_out_with_its_button(srv):
    from laggard.report.browser import find_chromium, open_page

    exe, why = find_chromium()
    if exe is None:
        pytest.skip(why)
    with open_page() as page:
        page.goto(srv.url + "/?job=somejob")
        assert page.title() == "laggard monitor: sign in"
        page.fill("#token", "wrong-token-0123456789")
        with page.expect_navigation():
            page.click("button[type=submit]")
        assert "not signed in" in page.inner_text("main")
        sign_in(page, srv.url, "/?job=somejob")
        assert page.url == srv.url + "/?job=somejob" and page.title() == "laggard monitor"
        page.wait_for_function("document.getElementById('status').textContent !== ''")
        assert "not signed in" not in page.inner_text("#status")  # its API calls went through on the cookie
        assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads the session
        cookies = page.context.cookies()
        assert [c["name"] for c in cookies] == ["laggard_session"] and cookies[0]["httpOnly"]
        assert cookies[0]["sameSite"] == "Strict" and TOKEN not in cookies[0]["value"]
        with page.expect_navigation():
            page.click("#signout button")
        assert "signed out" in page.inner_text("main") and page.context.cookies() == []
        page.goto(srv.url + "/")
        assert page.title() == "laggard monitor: sign in"
