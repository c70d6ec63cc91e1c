"""The live dashboard as readable as the HTML report: a legend of op kinds with fixed colours
and a time axis in ms on the step timeline, labelled rows/columns and a colour scale on the heatmap,
ticks and axis labels on the trend chart, text >= 11 px, and empty states in words (never a raw URL,
HTTP status or JSON). A collector fed synthetic jobs, the dashboard in headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.monitor.push import step_batches  # noqa: E402
from laggard.report.plots import heat_range  # noqa: E402
from laggard.wire.batch import CONTENT_TYPE, encode_batch  # noqa: E402
from tests.monitor_helpers import Server, sign_in  # noqa: E402

WAITING = "waiting for the first complete steps of this job"
RAW = re.compile(r'\{"|\[\{|https?://|/api/v1/|:\s?[45]\d\d\b')

# every visible element holding text: its font size in px, and the page's visible text
_SIZES = """() => [...document.querySelectorAll("body *")].filter(e =>
    [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim()) && e.getClientRects().length
    && getComputedStyle(e).visibility !== "hidden").map(e => [e.textContent.trim().slice(0, 40),
    parseFloat(getComputedStyle(e).fontSize)])"""


def _push(srv: Server, job_id: str, cfg: SynthConfig, *, first_step_only: bool = False) -> None:
    job = synthesize(cfg)
    seqs: dict[int, int] = {}
    first = None
    for step, r, t in step_batches(job):
        first = step if first is None else first
        if first_step_only and step != first:
            break
        seqs[r] = seqs.get(r, -1) + 1
        body = encode_batch(t, job_id=job_id, rank=r, seq=seqs[r], meta=job.meta.to_json())
        assert srv.request("POST", "/api/v1/ops", body, content_type=CONTENT_TYPE)[0] == 200


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash")
    s = Server(str(tmp / "m.db"), tmp, extra=["--window-steps", "4"]).start()
    try:
        _push(s, "jobA", SynthConfig(dp=2, pp=2, microbatches=4, steps=8, seed=3, name="jobA"))
        _push(s, "jobB", SynthConfig(dp=4, pp=2, microbatches=4, steps=8, seed=5, name="jobB"))
        _push(s, "jobC", SynthConfig(dp=2, pp=2, microbatches=4, steps=8, seed=7, name="jobC"), first_step_only=True)
        for j in ("jobA", "jobB"):
            s.wait_for(lambda d: d["window"] is not None, f"/api/v1/jobs/{j}")
        yield s
    finally:
        s.stop()


def _chromium():
    from laggard.report.browser import find_chromium

    exe, why = find_chromium()
    if exe is None:
        pytest.skip(why)


def _open(srv: Server, page, job: str) -> None:
    """The dashboard at ``/?job=`` (its link to one job); a click on the job's row if that did not select it."""
    sign_in(page, srv.url, f"/?job={job}")
    page.wait_for_selector(f'tr.job[data-id="{job}"]')
    if job not in page.inner_text("#title"):
        page.click(f'tr.job[data-id="{job}"]')
    page.wait_for_function(f"document.getElementById('title').textContent.includes('{job}')")


def _view(srv: Server, page, job: str) -> dict:
    """The dashboard opened on ``job`` once its timeline is drawn: what the checks read."""
    _open(srv, page, job)
    page.wait_for_selector("#timeline rect")
    page.wait_for_selector("#heatmap rect.cell")
    page.wait_for_timeout(300)
    return page.evaluate("""() => ({
      legend: [...document.querySelectorAll("#tl-legend [data-kind]")].map(e =>
          [e.dataset.kind, getComputedStyle(e.querySelector(".sw")).backgroundColor]),
      legendText: [...document.querySelectorAll("#tl-legend [data-kind]")].map(e => e.textContent),
      rectFill: Object.fromEntries([...document.querySelectorAll("#timeline rect[data-kind]")].map(e =>
          [e.dataset.kind, getComputedStyle(e).fill])),
      timelineText: [...document.querySelectorAll("#timeline text")].map(e => e.textContent),
      heatText: [...document.querySelectorAll("#heatmap text")].map(e => e.textContent),
      scale: !!document.querySelector("#heatmap-scale linearGradient, #heatmap-scale rect"),
      scaleLo: (document.querySelector("#heatmap-scale .scale-lo") || {}).textContent,
      scaleHi: (document.querySelector("#heatmap-scale .scale-hi") || {}).textContent,
      cells: [...document.querySelectorAll("#heatmap rect.cell")].map(e => [+e.dataset.rank, +e.dataset.slowdown]),
      ytick: [...document.querySelectorAll("#trend text.ytick")].map(e => e.textContent),
      xtick: [...document.querySelectorAll("#trend text.xtick")].map(e => e.textContent),
      trendText: [...document.querySelectorAll("#trend text")].map(e => e.textContent),
      step: +document.getElementById("step").value,
      body: document.body.innerText,
    })""") | {"sizes": page.evaluate(_SIZES)}


def _readable(v: dict) -> None:
    small = [(t, px) for t, px in v["sizes"] if px < 11]
    assert not small, f"text under 11 px: {small[:10]}"
    assert not RAW.search(v["body"]), f"raw URL / status / JSON shown: {RAW.search(v['body'])!r}"


def test_dashboard_views_are_labelled(srv, tmp_path: Path):
    _chromium()
    from laggard.report.browser import open_page

    views = {}
    with open_page(viewport={"width": 1400, "height": 1300}) as page:
        for job in ("jobA", "jobB"):
            views[job] = _view(srv, page, job)
            page.screenshot(path=str(tmp_path / f"dash-{job}.png"), full_page=True)
    for job, v in views.items():
        # timeline: a legend of exactly the op kinds present, coloured like the bars; a time axis in ms
        st, tl = srv.request("GET", f"/api/v1/jobs/{job}/timeline?step={v['step']}")
        assert st == 200
        kinds = {o["kind"] for o in tl["ops"]}
        assert {k for k, _ in v["legend"]} == kinds, (job, v["legend"], kinds)
        for k, c in v["legend"]:
            assert v["rectFill"][k] == c, (job, k)
        # in words: "send (point-to-point)", not the op table's code "p2p_send"
        assert not [t for t in v["legendText"] if "_" in t], v["legendText"]
        assert any("point-to-point" in t or "collective" in t for t in v["legendText"]), v["legendText"]
        assert any("ms" in t for t in v["timelineText"]), v["timelineText"]
        assert sum(bool(re.fullmatch(r"\d+(\.\d+)?", t)) for t in v["timelineText"]) >= 2, v["timelineText"]
        # heatmap: a label per DP rank and stage, the colour scale with its range
        dp, pp = (2, 2) if job == "jobA" else (4, 2)
        assert len(v["cells"]) == dp * pp
        for lab in [f"dp{i}" for i in range(dp)] + [f"pp{i}" for i in range(pp)] + ["stage"]:
            assert lab in v["heatText"], (job, lab, v["heatText"])
        assert v["scale"]
        # the scale starts at 1 (no slowdown), not at the smallest S_w, and spans at least the report's
        # (laggard.report.plots): a mild slowdown everywhere reads pale, not white to red
        lo, hi = heat_range([s for _, s in v["cells"]])
        assert (v["scaleLo"], v["scaleHi"]) == (f"{lo:.3f}", f"{hi:.3f}"), (v["scaleLo"], v["scaleHi"], v["cells"])
        assert v["scaleLo"] == "1.000"
        # trend: >= 3 y ticks, x ticks, both axes named
        assert len(v["ytick"]) >= 3 and len(v["xtick"]) >= 2, (v["ytick"], v["xtick"])
        assert "step" in v["trendText"] and any(t.startswith("S") for t in v["trendText"])
        _readable(v)
    # one kind, one colour, whichever job shows it
    a, b = dict(views["jobA"]["legend"]), dict(views["jobB"]["legend"])
    assert "compute" in a and a["compute"] == b["compute"]
    assert all(a[k] == b[k] for k in a.keys() & b.keys())


def test_dashboard_before_the_first_window_says_so(srv, tmp_path: Path):
    _chromium()
    from laggard.report.browser import open_page

    st, d = srv.request("GET", "/api/v1/jobs/jobC")
    assert st == 200 and d["window"] is None and d["num_ops"] > 0
    with open_page(viewport={"width": 1400, "height": 1100}) as page:
        _open(srv, page, "jobC")
        page.wait_for_timeout(2500)  # one more poll: nothing raw shows up late
        page.screenshot(path=str(tmp_path / "dash-jobC.png"), full_page=True)
        v = {"body": page.evaluate("document.body.innerText"), "sizes": page.evaluate(_SIZES)}
        shown = page.evaluate("""() => [...document.querySelectorAll("#timeline-empty, #heatmap-empty, #trend-empty")]
                                  .filter(e => !e.hidden).map(e => e.textContent)""")
    assert WAITING in v["body"], v["body"]
    assert len(shown) == 3 and all(WAITING in s for s in shown), shown
    _readable(v)
