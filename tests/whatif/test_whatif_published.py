"""Acceptance: laggard reproduces the published what-if analysis of both NDTimeline traces."""

from __future__ import annotations

import math

import numpy as np
import pytest

COMPUTE_TYPES = ("forward-compute", "backward-compute", "optimizer", "gc")


@pytest.mark.parametrize("name", ["ST", "AR"])
def test_matches_published_analysis(name, analyses, expected):
    got, exp = analyses[name].to_json(), expected[name]
    assert got["slowdown"] == pytest.approx(exp["slowdown"], rel=0.01)
    for key in ("by_dp_rank", "by_stage"):
        assert set(got[key]) == set(exp[key])
        for k, v in exp[key].items():
            assert got[key][k] == pytest.approx(v, rel=0.01), (key, k)
    for t in COMPUTE_TYPES:
        assert got["by_optype"][t] == pytest.approx(exp["by_optype"][t], rel=0.01), t
    assert abs(got["M_W"] - exp["M_W"]) <= 0.03
    assert abs(got["M_S"] - exp["M_S"]) <= 0.03


@pytest.mark.parametrize("name", ["ST", "AR"])
def test_matches_beyond_the_acceptance_floor(name, analyses, expected):
    """Every op type, per-step slowdown and replay fidelity agree too (same method, same data)."""
    got, exp = analyses[name].to_json(), expected[name]
    assert set(got["by_optype"]) == set(exp["by_optype"])
    for k, v in exp["by_optype"].items():
        assert got["by_optype"][k] == pytest.approx(v, rel=1e-3), k
    assert set(got["per_step"]) == set(exp["per_step"])
    for k, v in exp["per_step"].items():
        assert got["per_step"][k] == pytest.approx(v, rel=1e-3), k
    assert got["launch_slowdown"] == pytest.approx(exp["launch_slowdown"], rel=1e-3)
    for k, v in exp["step_time_ideal"].items():
        assert got["step_time_ideal"][k] == pytest.approx(v, rel=1e-4)


def test_json_contract(analyses):
    d = analyses["AR"].to_json()
    for key in (
        "slowdown", "waste", "T_s", "T_ideal_s", "launch_slowdown", "num_workers", "num_steps", "num_ops",
        "by_optype", "by_dp_rank", "by_stage", "by_worker", "per_step", "M_W", "M_S", "meta",
    ):
        assert key in d, key
    assert d["num_workers"] == 16 and d["num_steps"] == 44 and d["num_ops"] == 117_216
    assert d["waste"] == pytest.approx(1 - 1 / d["slowdown"])
    assert d["T_s"] / d["T_ideal_s"] == pytest.approx(d["slowdown"])
    assert all(isinstance(k, str) for m in ("by_dp_rank", "by_stage", "per_step") for k in d[m])
    assert {"dp", "pp", "tp", "vpp", "world_size"} <= set(d["meta"])
    assert d["meta"]["world_size"] == 64 and d["gpu_hours_wasted"] > 0
    w = d["by_worker"][0]
    assert set(w) == {"dp_rank", "stage", "rank", "slowdown"}


def test_worker_scores_find_the_slowed_worker(analyses):
    ar = analyses["AR"]
    assert ar.by_worker[0]["rank"] == 0  # AR: worker dp0/pp0 was artificially slowed
    assert ar.fixed_workers == [0]
    st = analyses["ST"]
    assert max(st.by_stage, key=st.by_stage.get) == 3  # ST: the last stage is the bottleneck
    assert math.isclose(st.M_S, 1.2193, rel_tol=0.01)


def test_per_worker_slowdown_is_min_of_dp_and_stage(analyses):
    r = analyses["ST"]
    for w in r.by_worker:
        assert w["slowdown"] == pytest.approx(min(r.by_dp_rank[w["dp_rank"]], r.by_stage[w["stage"]]))
    s = np.array([w["slowdown"] for w in r.by_worker])
    assert (np.diff(s) <= 0).all()
