"""`laggard demo --monitor` (the real demo job, an injected slow worker) streaming into a collector;
the dashboard, loaded in headless Chromium, shows that worker in the heatmap and the top-k list."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")
pytest.importorskip("torch", reason="the demo job needs torch")

from laggard.collectives.launch import free_port  # noqa: E402
from tests.monitor_helpers import Server, sign_in  # noqa: E402

SLOW_RANK = 3


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> Path:
    """A real traced run (2 x 2 gloo processes) streamed live by `laggard demo --monitor`."""
    out = tmp_path_factory.mktemp("demo")
    r = subprocess.run([sys.executable, "-m", "laggard.cli.base", "demo", "--quick", "--out", str(out), "--monitor",
                        "--monitor-port", str(free_port()), "--monitor-linger-s", "0",
                        "--inject", f"slow-worker:rank={SLOW_RANK},factor=2"],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    # the address printed carries no token (sign in on the page with the one printed beside it)
    assert "live dashboard: http://127.0.0.1:" in r.stdout and "?token=" not in r.stdout
    assert "(sign in with the token " in r.stdout
    return out / "monitor.db"


def test_dashboard_shows_the_slow_worker(demo_db, tmp_path):
    from laggard.report.browser import find_chromium, open_page

    exe, why = find_chromium()
    if exe is None:
        pytest.skip(why)
    # the demo's collector is gone: a new one on the same database (restart keeps the data)
    srv = Server(str(demo_db), tmp_path).start()
    try:
        jobs = srv.wait_for(lambda js: js and js[0]["window"] is not None, "/api/v1/jobs")
        job = jobs[0]
        assert job["num_ranks"] == 4 and job["id"].startswith("demo-")
        with open_page(viewport={"width": 1400, "height": 1100}) as page:
            sign_in(page, srv.url)
            page.wait_for_selector("#heatmap rect.cell")
            page.wait_for_selector("#topcur tbody tr")
            page.wait_for_selector("#timeline rect")
            cells = page.eval_on_selector_all(
                "#heatmap rect.cell", "els => els.map(e => [+e.dataset.rank, +e.dataset.slowdown])")
            top = page.eval_on_selector_all("#topcur tbody tr", "els => els.map(e => +e.dataset.rank)")
            title = page.inner_text("#title")
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            if os.environ.get("LAGGARD_SCREENSHOT"):
                shutil.copy(shot, os.environ["LAGGARD_SCREENSHOT"])
    finally:
        srv.stop()
    assert len(cells) == 4
    worst = max(cells, key=lambda c: c[1])
    assert worst[0] == SLOW_RANK, cells
    assert top[0] == SLOW_RANK, top
    assert job["id"] in title
    assert shot.stat().st_size > 10_000
