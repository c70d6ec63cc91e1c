"""Fewer steps than the diagnosis needs: what one step says on its own
(``laggard.diagnose.onestep``). Real traces cut to one step: a 4-rank DDP profiler job whose rank 2
sleeps 30 ms before every step (tests/data/kineto/ddp_host_stall_a), and clean twins: a 4-rank DDP
profiler job (corpus c64v3_job058p) and a 2-rank DDP Tracer job whose step 7 is the one of its steps
where one rank reached the gradient all-reduce furthest after the other (53 ms of 234; c28_job052)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from laggard.errors import LaggardWarning
from tests.conftest import run_cli

DATA = Path(__file__).parents[1] / "data"
STALL = DATA / "kineto" / "ddp_host_stall_a"
CLEAN = [(DATA / "corpus" / "c64v3_job058p" / "trace", "3"), (DATA / "corpus" / "c28_job052" / "trace", "7")]


def _analyze(path: Path, steps: str):  # noqa: ANN202
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        return analyze(load_job(path, steps=steps))


def test_late_rank_of_one_step_is_named() -> None:
    d = _analyze(STALL, "5").diagnosis
    assert d.verdict == "one step only", (d.verdict, d.reason)
    assert "one step cannot tell a steady straggler from a one-off" in d.reason
    assert [f.cause for f in d.findings] == ["late-arrival"]
    f = d.findings[0]
    assert [w["rank"] for w in f.workers] == [2] and f.confidence == "low" and f.steps == [5]
    (step,) = d.one_step
    assert [a.rank for a in step.arrivals] == [0, 1, 2, 3]
    (late,) = step.late
    # it began the step ~30 ms after the others: the lateness came from before the step
    assert late.rank == 2 and late.late_by_s > 0.02 and late.entry_s > 0.8 * late.late_by_s, late
    assert late.caused_wait_s > 3 * 0.02 and "began the step" in late.before, late
    others = [a for a in step.arrivals if a.rank != 2]
    assert all(a.waited_s > 0.02 for a in others) and step.arrivals[2].waited_s == 0


@pytest.mark.parametrize(("path", "steps"), CLEAN, ids=["ddp4-profiler", "ddp2-tracer"])
def test_no_rank_late_names_none(path: Path, steps: str) -> None:
    d = _analyze(path, steps).diagnosis
    assert d.verdict == "one step only" and d.findings == [], [f.evidence for f in d.findings]
    (step,) = d.one_step
    assert step.late == [] and len(step.arrivals) >= 2


def test_two_steps_each_read(tmp_path: Path) -> None:
    assert run_cli("--no-cache", "analyze", STALL, "--steps", "5,6", "--json", tmp_path / "a.json", "-q") == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["verdict"] == "few steps only"
    assert [s["step"] for s in doc["one_step"]] == [5, 6] and all(s["late"][0]["rank"] == 2 for s in doc["one_step"])
    (f,) = doc["findings"]
    assert f["cause"] == "late-arrival" and f["steps"] == [5, 6] and [w["rank"] for w in f["workers"]] == [2]


def test_terminal_report(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from laggard.report.terminal import print_summary

    print_summary(_analyze(STALL, "5"), Console(width=80, highlight=False, color_system=None))
    out = " ".join(capsys.readouterr().out.split())  # (rich wraps the text at 80 columns)
    assert "verdict: one step only" in out and "late arrival (one step): rank 2" in out, out
    assert "began the step" in out and "arrived +ms" in out, out


def test_one_worker_is_still_not_enough() -> None:
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        job = load_job(STALL / "rank0.json.gz", steps="5")
        d = analyze(job).diagnosis
    assert d.verdict == "not enough to judge" and not d.one_step
