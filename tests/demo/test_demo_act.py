"""`laggard demo --act`: the runtime controller on the real demo job.

dp 4 x pp 1 with rank 2 slowed 1.6x, with and without the controller, in one launch: the controller
acts within 30 steps on rank 2, the global batch keeps its rows, and the loss curve is the one
without the controller. Timings are not asserted (4 ranks share 2 busy cores):
benchmarks/bench_act.py measures the speed-up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laggard.demo.launch import JobConfig, run_jobs
from laggard.groundtruth.inject import parse_injections

pytestmark = pytest.mark.timeout(300)

SPEC = "slow-worker:rank=2,factor=1.6"
STEPS = 30


def _cfg(**kw) -> JobConfig:  # noqa: ANN003
    return JobConfig.quick(dp=4, pp=1, steps=STEPS, injections=parse_injections([SPEC]), **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("act")
    cfgs = {"off": _cfg(), "act": _cfg(act=True, actions_path=str(base / "actions.json"))}
    res = dict(zip(cfgs, run_jobs(list(cfgs.values())), strict=True))
    assert all(r.ok for r in res.values()), {k: r.failures for k, r in res.items()}
    return {"res": res, "actions": json.loads((base / "actions.json").read_text())}


def test_the_controller_shifts_rows_off_the_slow_rank_within_30_steps(runs: dict) -> None:
    acts = runs["actions"]
    first = acts[0]
    assert first["kind"] == "rebalance" and 2 in first["ranks"] and first["step"] < 30
    assert sum(first["counts"]) == 64 and first["counts"][2] == min(first["counts"]) < 16
    assert all(a["kind"] == "rebalance" for a in acts), "a slow rank throughout: nothing to undo, nothing to drain"
    assert set(first) >= {"step", "kind", "ranks", "reason", "step_s_before", "step_s_after"}
    ranks = runs["res"]["act"].ranks
    assert all(r["actions"] == ranks[0]["actions"] for r in ranks.values()), "the same decisions on every rank"


def test_the_loss_curve_is_the_one_without_the_controller(runs: dict) -> None:
    off = runs["res"]["off"].ranks[3]["losses"]
    on = runs["res"]["act"].ranks[3]["losses"]
    assert len(off) == len(on) == STEPS
    # the same global batch and update; only the float summation order differs (the loss moves by
    # ~0.05 from step to step)
    assert max(abs(a - b) for a, b in zip(off, on, strict=True)) < 1e-3
    assert on[-1] < on[0]


@pytest.mark.timeout(240)
def test_laggard_demo_act_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import run_cli

    out = tmp_path / "demo"
    assert run_cli("demo", "--quick", "--act", "--dp", "4", "--pp", "1", "--steps", "20", "--out", out,
                   "--no-screenshot", "--inject", SPEC) == 0
    text = capsys.readouterr().out
    acts = json.loads((out / "actions.json").read_text())
    assert acts and acts[0]["kind"] == "rebalance" and 2 in acts[0]["ranks"]
    assert acts[0]["counts"][2] == min(acts[0]["counts"])
    assert f"actions: {out / 'actions.json'}" in text and "rebalance DP ranks [" in text
    assert "act: after the first shift (step " in text and " ran x" in text
