"""One wording of a finding for every surface (laggard.report.wording): terminal, HTML, dashboard,
alerts and webhooks say the same words, and none shows a raw data structure."""

from __future__ import annotations

import json
import re

import pytest

from laggard.report.wording import CAUSE_WORDS, finding_message, finding_text
from tests.conftest import ND, run_cli

RAW = re.compile(r"[\[{]\s*['\"]|\{'|\"dp_rank\"|'rank':")  # JSON or Python reprs of lists/dicts


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("w") / "a.json"
    found = []
    for trace in ("trace-AR.parquet", "trace-ST.parquet"):
        assert run_cli("analyze", ND / trace, "--json", out, "-q") == 0
        found += json.loads(out.read_text())["findings"]
    return found


def test_every_cause_has_words() -> None:
    from laggard.report.findings import PATTERN  # every cause the diagnosis names has its pattern

    assert set(PATTERN) == set(CAUSE_WORDS)


def test_words_of_real_findings(findings: list[dict]) -> None:
    assert findings
    for f in findings:
        t = finding_text(f)
        assert t.what.startswith(CAUSE_WORDS[f["cause"]])
        for w in f["workers"][:4]:
            assert f"rank {w['rank']} (dp{w['dp_rank']}/pp{w['stage']})" in t.what
        assert t.evidence == f["evidence"] and t.fix == f["fix"] and t.check == f["whatif"]
        msg = finding_message(f, job="j1")
        assert msg.startswith(f"job j1: {t.what}") and "Evidence: " in msg and ". Fix: " in msg
        for text in (msg, *t.lines()):
            assert not RAW.search(text), text


def test_the_raw_check_can_fail() -> None:
    """An alert that writes its workers as raw JSON is caught."""
    old = 'job j: new finding worker (workers [{"dp_rank":1,"stage":1,"rank":3}], stages [1]): fix it'
    assert RAW.search(old)


def test_terminal_and_html_use_the_same_words(findings: list[dict], tmp_path) -> None:
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job
    from laggard.report.html import render_html

    res = analyze(load_job(ND / "trace-AR.parquet"))
    page = render_html(res)
    f = res.diagnosis.findings[0]
    t = finding_text(f.to_json())
    assert f"<strong>{t.cause}</strong>" in page and t.where and t.where in page
    assert run_cli("analyze", ND / "trace-AR.parquet") == 0


def test_new_finding_alert_is_words(findings: list[dict]) -> None:
    """The collector's new_finding alert (log line and webhook message) words the finding, no raw fields."""
    from laggard.monitor.alerts import Rule, RuleState, evaluate_window

    doc = {"slowdown": 1.5, "by_worker": [], "M_W_detail": {}, "findings": findings[:1]}
    alerts = evaluate_window([Rule(id="nf", type="new_finding", windows=1)], RuleState(), "job7", doc)
    assert len(alerts) == 1
    a = alerts[0]
    t = finding_text(findings[0])
    assert a.message == "new finding: " + finding_message(findings[0], job="job7") and not RAW.search(a.message)
    assert a.detail["text"] == t.to_json()
