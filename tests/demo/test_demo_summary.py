"""The demo's closing lines on a constructed run (no processes started): with ``--act`` the injected
cause is judged on the steps before the controller's first action, and every before/after figure
comes from one definition of the steps compared, each line naming them."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from laggard.demo import run as demo_run
from laggard.demo.launch import JobConfig, JobResult
from laggard.demo.run import DemoOutput, PreAction, Span, act_lines, around, pre_action, summary_lines
from laggard.groundtruth.inject import parse_injections

# 30 traced steps: 1.0 s before the first shift (end of step 9), 0.5 s up to the second (step 19),
# 0.8 s after it; the controller's own window figures (step_s_before/after) are other numbers
STEPS = [1.0] * 10 + [0.5] * 10 + [0.8] * 10
ACTIONS = [
    {"step": 9, "kind": "rebalance", "ranks": [2], "reason": "slow", "counts": [18, 18, 11, 17],
     "step_s_before": 1.542, "step_s_after": 1.624},
    {"step": 19, "kind": "rebalance", "ranks": [2], "reason": "slower", "counts": [19, 19, 8, 18],
     "step_s_before": 0.9, "step_s_after": 1.1},
    {"step": 19, "kind": "drain", "ranks": [2], "reason": "sick", "step_s_before": 0.9, "step_s_after": 1.1},
]


def _job(actions: list[dict] | None = ACTIONS) -> JobResult:
    ranks = {r: {"step_s": list(STEPS), "loss": 2.5, "actions": actions} for r in range(4)}
    return JobResult(ok=True, wall_s=30.0, ranks=ranks, failures={})


def _cfg() -> JobConfig:
    return JobConfig(dp=4, pp=1, steps=len(STEPS), act=True, actions_path="out/actions.json",
                     injections=parse_injections(["slow-worker:rank=2,factor=1.6"]))


def _analysis(top_rank: int) -> SimpleNamespace:
    others = [r for r in range(4) if r != top_rank]
    return SimpleNamespace(by_worker=[{"rank": r} for r in [top_rank, *others]], by_stage={0: 1.2}, extras={},
                           by_optype={}, launch_slowdown=1.0)


def test_before_and_after_follow_the_actions_that_changed_the_job() -> None:
    before, after = around(STEPS, ACTIONS, 9)
    assert (before.lo, before.hi, before.step_s) == (0, 9, 1.0)
    assert (after.lo, after.hi, after.step_s) == (10, 19, 0.5)
    before, after = around(STEPS, ACTIONS, 19)
    assert (before.label, after.label) == ("steps 10-19", "steps 20-29")
    assert around(STEPS, ACTIONS, 29)[1] is None  # an action at the last step has no steps after it


def test_the_action_lines_and_the_effect_line_agree_and_name_their_steps() -> None:
    lines = act_lines(_job(), _cfg())
    first = next(x for x in lines if x.startswith("    step 9: rebalance"))
    assert first.endswith("step time 1.000 s (steps 0-9) -> 0.500 s (steps 10-19)")
    second = next(x for x in lines if x.startswith("    step 19: rebalance"))
    assert second.endswith("step time 0.500 s (steps 10-19) -> 0.800 s (steps 20-29)")
    drain = next(x for x in lines if x.startswith("    step 19: drain"))
    assert "step time" not in drain  # a drain asks the scheduler; the job ran on unchanged
    effect = lines[-1]
    assert effect == ("  act: after the first shift (step 9), steps 10-29 ran x1.54 faster than steps 0-9: "
                      "1.000 -> 0.650 s (wall, mean over ranks)")
    # the controller's own window figures are not a second definition printed beside these
    assert not any("1.542" in x or "1.624" in x for x in lines)
    # the "before" of the effect line is the first action's "before", figure and steps
    assert re.search(r"1\.000 s \(steps 0-9\)", first) and "than steps 0-9: 1.000" in effect


def test_the_injected_cause_is_judged_on_the_steps_before_the_first_action() -> None:
    pre = PreAction(steps=Span(lo=0, hi=9, step_s=1.0), warmup_steps=3, analysis=_analysis(top_rank=2))
    out = DemoOutput(analysis=_analysis(top_rank=0), paths={}, job=_job(), config=_cfg(), pre_action=pre)
    lines = summary_lines(out)
    where = next(i for i, x in enumerate(lines) if x.startswith("  checks on"))
    assert "steps 0-9 (trace steps 3-12), before the controller's first action" in lines[where]
    assert lines[where + 1] == ("  [found] slow-worker on rank 2: rank 2 should have the highest S_w "
                                "(it is rank 2)")
    assert not any("NOT found" in x for x in lines)


def test_without_an_action_the_whole_trace_is_judged() -> None:
    out = DemoOutput(analysis=_analysis(top_rank=2), paths={}, job=_job(actions=[]), config=_cfg())
    lines = summary_lines(out)
    assert "  [found] slow-worker on rank 2: rank 2 should have the highest S_w (it is rank 2)" in lines
    assert not any(x.startswith("  checks on") for x in lines)


def test_pre_action_analyses_the_trace_steps_up_to_the_first_action(monkeypatch: pytest.MonkeyPatch) -> None:
    import laggard.analysis.pipeline as pipeline
    import laggard.io as io

    asked: list[str | None] = []
    monkeypatch.setattr(io, "load_job", lambda path, steps=None: asked.append(steps) or "job")
    monkeypatch.setattr(pipeline, "analyze", lambda job, diagnose=None: _analysis(top_rank=2))
    pre = pre_action(Path("trace"), _job(), _cfg())
    assert pre is not None and asked == ["3-12"] and pre.trace_steps == (3, 12)
    assert (pre.steps.lo, pre.steps.hi, pre.steps.step_s) == (0, 9, 1.0)
    assert pre_action(Path("trace"), _job(actions=[]), _cfg()) is None
    drain_only = [{**ACTIONS[2], "step": 4}]
    assert pre_action(Path("trace"), _job(actions=drain_only), _cfg()) is None


def test_steps_that_cannot_be_analyzed_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import laggard.io as io

    def fail(path: Path, steps: str | None = None) -> None:
        raise demo_run.LaggardError("too few steps")

    monkeypatch.setattr(io, "load_job", fail)
    pre = pre_action(Path("trace"), _job(), _cfg())
    assert pre is not None and pre.analysis is None
    out = DemoOutput(analysis=_analysis(top_rank=0), paths={}, job=_job(), config=_cfg(), pre_action=pre)
    lines = summary_lines(out)
    assert lines[-1] == "  [check] not judged: trace steps 3-12 could not be analyzed (too few steps)"
