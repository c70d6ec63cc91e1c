"""Several causes and several stragglers at once, with ground truth from the independent simulator."""

from __future__ import annotations

import pytest

import laggard
from laggard.diagnose import DiagnoseConfig
from laggard.groundtruth.dessim import SimConfig, parse_cause, simulate, simulate_with_truth, to_job


def _diagnose(causes: list[str], dp: int = 8, pp: int = 4, **kw):
    sim = simulate(SimConfig(dp=dp, pp=pp, steps=3, **kw), [parse_cause(c) for c in causes])
    return laggard.analyze(to_job(sim)).diagnosis


def _named(d) -> dict[str, list[int]]:
    return {f.cause: sorted(w["rank"] for w in f.workers) for f in d.findings}


def test_slow_link_plus_slow_worker_both_named():
    d = _diagnose(["slow-link:src=1,dst=2,delay_ms=10", "slow-worker:rank=9,factor=1.5"])
    got = _named(d)
    assert got["worker"] == [9] and got["comm"] == [1, 2], got
    assert "from rank 1 to rank 2" in next(f for f in d.findings if f.cause == "comm").evidence
    # each hides the other: alone neither fix gains much, together they remove the whole slowdown
    assert d.combined_share > 0.9 and d.interaction > 0.2
    assert sum(f.share for f in d.findings) == pytest.approx(d.combined_share, abs=0.02)


def test_two_slow_workers_both_named():
    assert _named(_diagnose(["slow-worker:rank=5+22,factor=1.5"])) == {"worker": [5, 22]}


@pytest.mark.parametrize("ranks", [[3, 9, 22, 28], [4, 5, 6, 7], [1, 5, 9, 13]])
def test_four_slow_workers_all_named(ranks):
    """Scattered, one DP rank (every stage of dp 1), one stage (stage 1 of four DP ranks)."""
    spec = "slow-worker:rank=" + "+".join(map(str, ranks)) + ",factor=1.5"
    assert _named(_diagnose([spec])) == {"worker": ranks}


def test_eight_slow_workers_all_named():
    ranks = [0, 6, 9, 15, 18, 20, 27, 29]
    spec = "slow-worker:rank=" + "+".join(map(str, ranks)) + ",factor=1.6"
    assert _named(_diagnose([spec])) == {"worker": ranks}


def test_single_cause_mode_stops_after_the_first_finding():
    sim = simulate(SimConfig(dp=8, pp=4, steps=3), [parse_cause("slow-link:src=1,dst=2,delay_ms=10"),
                                                    parse_cause("slow-worker:rank=9,factor=1.5")])
    d = laggard.analyze(to_job(sim), config=DiagnoseConfig(single_cause=True)).diagnosis
    assert [f.cause for f in d.findings] == ["worker"]
    assert d.unexplained > 0.15 and d.unexplained_by  # the link's part is said to be unexplained


def test_gains_match_the_simulators_truth():
    """Predicted gain of fixing each cause vs the simulator's own speed-up of running without it."""
    truth = simulate_with_truth(SimConfig(dp=4, pp=4, steps=3), [parse_cause("heavy-stage:stage=2,factor=1.6"),
                                                                 parse_cause("gc-pauses:prob=0.08,pause_ms=40")])
    d = laggard.analyze(to_job(truth.sim)).diagnosis
    by_cause = {f.cause: f for f in d.findings}
    assert set(by_cause) == {"stage-imbalance", "gc"}
    for ct in truth.causes:
        f = by_cause[{"heavy-stage": "stage-imbalance", "gc": "gc"}[ct.cause.kind]]
        assert f.gain == pytest.approx(ct.gain, rel=0.10), (ct.cause.spec(), f.gain, ct.gain)


def test_a_wrong_answer_fails_the_truth_check():
    """Check the check: the sweep's scorer rejects a diagnosis that names the wrong worker."""
    from laggard.groundtruth.evaluate_mixed import score_job

    truth = simulate_with_truth(SimConfig(dp=4, pp=2, steps=3), [parse_cause("slow-worker:rank=5,factor=1.8")])
    d = laggard.analyze(to_job(truth.sim)).diagnosis
    ok = score_job(truth, d)
    assert ok.true_pos == 1 and ok.false_pos == 0 and ok.false_neg == 0
    d.findings[0].workers = [{"rank": 4, "dp_rank": 2, "stage": 0}]
    bad = score_job(truth, d)
    assert bad.true_pos == 0 and bad.false_pos == 1 and bad.false_neg == 1


def test_clean_simulated_jobs_are_healthy():
    for seed in range(3):
        sim = simulate(SimConfig(dp=4, pp=4, steps=3, seed=seed))
        assert laggard.analyze(to_job(sim)).diagnosis.verdict == "healthy"


def test_small_mixture_sweep_meets_its_targets():
    """A few jobs of the sweep (held-out seed, small jobs, 1-4 causes each, truth from the simulator):
    fails when a detector regresses (checked: with sequence.detect returning no candidate, recall
    falls to 0.65 and it fails; on the diagnosis before the fixes for hidden causes, recall 0.88)."""
    from laggard.groundtruth.evaluate_mixed import by_kind, mixed_scenarios, run_mixed, summary

    outs = [run_mixed(sc) for sc in mixed_scenarios(12, seed=31, large_share=0.0, clean_every=6, factor_floor=1.5)]
    s = summary(outs)
    assert s["num_causes"] >= 20 and s["clean_healthy"] == 1.0, s
    # measured: precision 1.0, recall 1.0, gain error P90 7% (26 required causes; before the fixes
    # for hidden causes: 0.96, 0.88); the 200-job figure is the bench
    assert s["precision"] >= 0.95 and s["recall"] >= 0.95, (s, by_kind(outs))
    assert s["gain_err_median"] <= 0.05 and s["gain_err_p90"] <= 0.10, s
    # the single-cause baseline names at most one cause per job: far from it
    assert summary(outs, "single")["recall"] < 0.75
