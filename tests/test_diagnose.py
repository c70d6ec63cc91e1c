"""Diagnosis: the published traces, a sweep of synthetic scenarios, predicted gains, healthy jobs."""

from __future__ import annotations

import json

import pytest

from laggard.evaluate import confusion, run, scenarios
from tests.conftest import ND, run_cli


def test_st_top_finding_is_last_stage_imbalance(analyses):
    d = analyses["ST"].diagnosis
    assert d.verdict == "straggling"
    top = d.findings[0]
    assert top.cause == "stage-imbalance" and top.stages == [3]
    assert "stage 3" in top.evidence and "laggard partition" in top.fix
    assert 0 < top.score <= 1 and top.gain > 1.1


def test_ar_top_finding_names_only_the_slowed_worker(analyses):
    d = analyses["AR"].diagnosis
    top = d.findings[0]
    assert top.cause == "worker"
    assert [w["rank"] for w in top.workers] == [0]
    assert top.workers[0] == {"rank": 0, "dp_rank": 0, "stage": 0}
    assert top.score > 0.9 and top.gain == pytest.approx(1.97, rel=0.05)
    assert "drain the node of rank 0" in top.fix


def test_findings_in_json_and_terminal(capsys, tmp_path):
    out = tmp_path / "ar.json"
    assert run_cli("analyze", ND / "trace-AR.parquet", "--json", out) == 0
    text = capsys.readouterr().out
    assert "verdict: straggling" in text and "1. worker" in text
    d = json.loads(out.read_text())
    assert d["verdict"] == "straggling" and d["healthy_threshold"] == 1.05
    f = d["findings"][0]
    assert set(f) == {"cause", "workers", "stages", "steps", "evidence", "score", "gain", "fix"}
    # a threshold above the job's slowdown calls it healthy, with no findings
    assert run_cli("analyze", ND / "trace-ST.parquet", "--json", out, "-q", "--healthy-threshold", "1.5") == 0
    d = json.loads(out.read_text())
    assert d["verdict"] == "healthy" and d["findings"] == []
    assert run_cli("analyze", ND / "trace-ST.parquet", "-q", "--healthy-threshold", "0.5") == 2


def test_findings_in_html(tmp_path):
    out = tmp_path / "r.html"
    assert run_cli("analyze", ND / "trace-ST.parquet", "--html", out, "-q") == 0
    html = out.read_text()
    assert html.index("Diagnosis") < html.index("worker slowdown by DP rank and stage")
    assert "stage-imbalance" in html


@pytest.mark.timeout(300)
def test_sweep_of_random_scenarios():
    """60 random scenarios (every cause, 8 to 1,024 workers, strengths above the floors, clean jobs):
    the top finding is the injected cause in >= 95%, clean jobs are healthy in all, and the
    predicted gain is within 10% of the speed-up of regenerating the job without the cause."""
    outcomes = [run(sc) for sc in scenarios(60, seed=7)]
    sizes = [o.scenario.cfg.dp * o.scenario.cfg.pp for o in outcomes]
    assert min(sizes) <= 16 and max(sizes) >= 256
    m = confusion(outcomes)
    assert set(m["healthy"]) == {"healthy"}, m["healthy"]
    correct = sum(o.correct for o in outcomes)
    assert correct >= 0.95 * len(outcomes), m
    gains = [(o.predicted_gain, o.actual_gain) for o in outcomes if o.predicted_gain]
    assert len(gains) >= 40
    for pred, act in gains:
        assert act == pytest.approx(pred, rel=0.10)
