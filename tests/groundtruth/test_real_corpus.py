"""benchmarks/real_corpus.py without running a job: the draw (one seed, every layout and cause, clean
jobs, factors from 1.15x) and the scorer on hand-written analysis documents (right, wrong, silent)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from laggard.demo.launch import JobConfig
from laggard.groundtruth.inject import parse_injections

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rc():
    spec = importlib.util.spec_from_file_location("real_corpus", ROOT / "benchmarks" / "real_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["real_corpus"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_draw_is_one_seed_and_covers_the_corpus(rc):
    plans = rc.plan_corpus(2024, 64)
    assert [p.causes for p in plans] == [p.causes for p in rc.plan_corpus(2024, 64)]
    assert [p.causes for p in plans] != [p.causes for p in rc.plan_corpus(7, 64)]
    assert sum(not p.causes for p in plans) >= 8
    assert {p.layout for p in plans} >= {"dp2xpp2", "dp1xpp3", "dp1xpp4"} and any(p.pp == 1 for p in plans)
    assert all(2 <= p.dp <= 4 for p in plans if p.pp == 1)
    kinds = {c["kind"] for p in plans for c in p.causes}
    assert kinds == set(rc.KINDS)
    assert any(len(p.causes) == 2 for p in plans)
    factors = [c["factor"] for p in plans for c in p.causes if c["factor"] is not None]
    assert min(factors) >= 1.15 and sum(f < 1.25 for f in factors) >= 8
    for p in plans:  # every drawn spec parses and fits its layout (the launcher's own checks)
        JobConfig(dp=p.dp, pp=p.pp, num_layers=2 * p.pp, injections=parse_injections([c["spec"] for c in p.causes]))
        for c in p.causes:
            assert all(0 <= r < p.dp * p.pp for r in c["target"].get("ranks", []))
            if c["kind"] in rc.NEEDS_PIPELINE:
                assert p.pp > 1


def _truth(causes, dp=2, pp=2):
    return {"job": "job000", "clean": not causes, "layout": {"dp": dp, "pp": pp}, "causes": causes}


def _finding(cause, ranks, pp=2, stages=()):
    return {"cause": cause, "workers": [{"rank": r, "dp_rank": r // pp, "stage": r % pp} for r in ranks],
            "stages": list(stages)}


def _doc(*findings, verdict="straggling"):
    return {"ok": True, "doc": {"verdict": verdict, "findings": list(findings)}}


SLOW = {"kind": "slow-worker", "cause": "slow-worker", "spec": "slow-worker:rank=2,factor=1.3", "factor": 1.3,
        "target": {"scope": "rank", "ranks": [2]}}


def test_score_right_and_wrong_rank(rc):
    right = rc.score_job(_truth([SLOW]), _doc(_finding("worker", [2])))
    assert right.hits == [SLOW["spec"]] and not right.misses and not right.extra_ranks
    wrong = rc.score_job(_truth([SLOW]), _doc(_finding("worker", [1])))  # a healthy rank named
    assert wrong.misses == [SLOW["spec"]] and wrong.extra_ranks == [1] and wrong.wrong == ["worker:ranks=[1]"]
    both = rc.score_job(_truth([SLOW]), _doc(_finding("worker", [2, 3])))  # the right rank and a healthy peer
    assert both.misses and both.extra_ranks == [3]
    s = rc.summarize([right, wrong, both], {"job000": _truth([SLOW])})
    assert s["precision"] == pytest.approx(1 / 3) and s["recall"] == pytest.approx(1 / 3)
    assert s["extra_ranks"] == 2 and s["named_ranks"] == 4
    assert s["recall_by_factor"]["1.25-1.50"] == {"named": 1, "causes": 3, "recall": pytest.approx(1 / 3)}


def test_score_targets_of_each_cause(rc):
    heavy = {"kind": "heavy-stage", "cause": "heavy-stage", "spec": "heavy-stage:stage=1,factor=1.5", "factor": 1.5,
             "target": {"scope": "stage", "stage": 1, "ranks": [1, 3]}}
    assert rc.score_job(_truth([heavy]), _doc(_finding("stage-imbalance", [1, 3], stages=[1]))).hits
    assert rc.score_job(_truth([heavy]), _doc(_finding("stage-imbalance", [0, 2], stages=[0]))).misses
    link = {"kind": "slow-link", "cause": "slow-link", "spec": "slow-link:src=1,dst=0,delay_ms=5", "factor": 1.2,
            "target": {"scope": "link", "link": [1, 0], "ranks": [0, 1]}}
    assert rc.score_job(_truth([link]), _doc(_finding("comm", [0, 1]))).hits
    comm_all = rc.score_job(_truth([link]), _doc(_finding("comm", [0, 1, 2, 3])))
    assert comm_all.misses and comm_all.extra_ranks == [2, 3]
    stall = {"kind": "host-stall-bursty", "cause": "host-stall", "spec": "host-stall:rank=3,ms=50,every=4",
             "factor": 1.2, "target": {"scope": "rank", "ranks": [3]}}
    gc = {"kind": "gc-pauses", "cause": "gc-pauses", "spec": "gc-pauses:prob=0.1,pause_ms=50", "factor": 1.2,
          "target": {"scope": "job"}}
    s = rc.score_job(_truth([gc, stall]), _doc(_finding("gc", [0, 1]), _finding("launch-delay", [3])))
    assert len(s.hits) == 2 and not s.extra_ranks  # a job-wide cause's finding may name any rank
    # a slow rank of a pure pipeline is its stage: the stage finding names it
    assert rc.score_job(_truth([{**SLOW, "target": {"scope": "rank", "ranks": [2]}}], dp=1, pp=4),
                        _doc(_finding("stage-imbalance", [2], pp=4, stages=[2]))).hits
    # ...and a slow rank on a heavy stage's one rank is one observable cause there (not with DP replicas)
    on_it = {"kind": "heavy-stage", "cause": "heavy-stage", "spec": "heavy-stage:stage=2,factor=1.27", "factor": 1.27,
             "target": {"scope": "stage", "stage": 2, "ranks": [2]}}
    both = rc.score_job(_truth([SLOW, on_it], dp=1, pp=4), _doc(_finding("stage-imbalance", [2], pp=4, stages=[2])))
    assert len(both.hits) == 2 and not both.misses and not both.wrong
    heavy2 = {**on_it, "target": {"scope": "stage", "stage": 0, "ranks": [0, 2]},
              "spec": "heavy-stage:stage=0,factor=1.27"}
    one = rc.score_job(_truth([SLOW, heavy2]), _doc(_finding("worker", [2])))
    assert len(one.hits) == 1 and one.misses == [heavy2["spec"]]


def test_clean_false_alarm_and_failed_analysis(rc):
    quiet = rc.score_job(_truth([]), _doc(verdict="healthy"))
    alarm = rc.score_job(_truth([]), _doc(_finding("comm", [0, 1])))
    assert not quiet.false_alarm and alarm.false_alarm and alarm.extra_ranks == [0, 1]
    assert alarm.rank_alarm and not quiet.rank_alarm
    stage = rc.score_job(_truth([]), _doc(_finding("unexplained", [], stages=[1])))
    assert stage.false_alarm and not stage.rank_alarm  # a stage named, no rank
    failed = rc.score_job(_truth([SLOW]), {"ok": False, "error": "boom", "seconds": 1.0})
    assert failed.misses == [SLOW["spec"]] and failed.status == "error: boom"
    s = rc.summarize([quiet, alarm], {"job000": _truth([])})
    assert s["clean_false_alarm_rate"] == 0.5 and s["clean_healthy_rate"] == 0.5
    assert rc.summarize([quiet, stage], {"job000": _truth([])})["clean_rank_alarm_rate"] == 0.0


def test_extra_ranks_the_jobs_own_timers_show_slow(rc):
    """An extra rank is confirmed slow only by the job's own CPU timers against its stage's untargeted DP
    peers (>= 1.15x their median): not by a rank that is merely named, not in a pure pipeline (no
    peers), not without the field; the summary counts confirmed ranks right in a second figure only."""
    def truth(cpu, dp=2, pp=2, causes=(SLOW,)):
        return {**_truth(list(causes), dp, pp),
                "measured": {"compute_cpu_ms_by_rank": {str(r): v for r, v in cpu.items()}}}

    # rank 1 (stage 1) named beside the slow rank 2: its peer rank 3 at 100 ms
    slow1 = rc.score_job(truth({0: 100.0, 1: 120.0, 2: 131.0, 3: 100.0}), _doc(_finding("worker", [1, 2])))
    assert slow1.extra_ranks == [1] and slow1.extra_slow_by_own_timers == [1]
    calm1 = rc.score_job(truth({0: 100.0, 1: 110.0, 2: 131.0, 3: 100.0}), _doc(_finding("worker", [1, 2])))
    assert calm1.extra_ranks == [1] and not calm1.extra_slow_by_own_timers
    # rank 0's only stage peer is the targeted rank 2: no reference, nothing confirmed
    assert not rc.score_job(truth({0: 150.0, 1: 100.0, 2: 131.0, 3: 100.0}),
                            _doc(_finding("worker", [0]))).extra_slow_by_own_timers
    pipeline = rc.score_job(truth({0: 100.0, 1: 150.0, 2: 100.0}, dp=1, pp=3, causes=()),
                            _doc(_finding("worker", [1], pp=3)))
    assert pipeline.extra_ranks == [1] and not pipeline.extra_slow_by_own_timers
    old = rc.score_job(_truth([SLOW]), _doc(_finding("worker", [1, 2])))  # a truth file without the field
    assert old.extra_ranks == [1] and not old.extra_slow_by_own_timers
    s = rc.summarize([slow1, calm1], {"job000": _truth([SLOW])})
    assert s["rank_precision"] == 0.5 and s["extra_ranks_slow_by_own_timers"] == 1
    assert s["rank_precision_own_timers"] == 0.75


def test_simulator_figures_read_from_results(rc, tmp_path):
    """Both stored sweeps, each under its own column: the simulator's own noise and the real jobs'."""
    doc = {"benchmarks": {"bench_diagnose_mixed": {"figures": [
        {"name": "mixture (1-4 causes): precision of named causes (x), 200 jobs", "value": 0.99},
        {"name": "mixture (1-4 causes): recall of named causes, 424 causes", "value": 0.97},
        {"name": "mixture (1-4 causes): clean jobs called healthy", "value": 100.0},
        {"name": "mixture, real-job noise (1-4 causes): precision of named causes (x), 100 jobs", "value": 0.74},
        {"name": "mixture, real-job noise (1-4 causes): clean jobs called healthy", "value": 25.0},
        {"name": "single cause on the simulator: recall of named causes, 43 causes", "value": 0.5}]}}}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert rc.load_sibling("corpus_report").simulator_figures(tmp_path / "r.json") == {
        "simulator": {"precision": 0.99, "recall": 0.97, "clean_healthy_rate": 1.0},
        "sim, real noise": {"precision": 0.74, "clean_healthy_rate": 0.25}}
    assert rc.load_sibling("corpus_report").simulator_figures(tmp_path / "missing.json") == {}


def test_recall_by_measured_impact(rc, tmp_path):
    """Jobs with one cause bucketed by their measured impact (impact.json, against the clean twin);
    clean jobs' twins give the noise; jobs with two causes and jobs without a twin are left out."""
    impact = rc.load_sibling("corpus_impact")
    def named():
        return rc.score_job(_truth([SLOW]), _doc(_finding("worker", [2])))

    def missed():
        return rc.score_job(_truth([SLOW]), _doc(verdict="healthy"))

    jobs = {"job000": (named(), 1.31, [SLOW]), "job001": (missed(), 1.03, [SLOW]),
            "job002": (rc.score_job(_truth([]), _doc(verdict="healthy")), 0.98, []),
            "job003": (missed(), 1.5, [SLOW, SLOW]), "job004": (missed(), None, [SLOW])}
    scores, truths = [], {}
    for job, (s, ratio, causes) in jobs.items():
        s.job = job
        scores.append(s)
        truths[job] = {**_truth(causes), "job": job}
        if ratio is not None:
            (tmp_path / job).mkdir()
            (tmp_path / job / "impact.json").write_text(json.dumps({"impact": ratio}))
    out = impact.recall_by_impact(tmp_path, scores, truths)
    assert out["single_cause"] == {"0.00-1.05": {"named": 0, "causes": 1, "recall": 0.0},
                                   "1.25+": {"named": 1, "causes": 1, "recall": 1.0}}
    assert out["clean_twin_ratio"]["n"] == 1 and out["clean_twin_ratio"]["max_abs_dev"] == pytest.approx(0.02)
    assert impact.median_step_ms([100.0, 102.0, 98.0, 500.0]) == 100.0  # the last step writes the profiler trace


def test_generate_only_some_jobs_in_parallel_resumes(rc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--only / --parallel: the chosen jobs of the draw, each run once, a failure recorded, and a
    second call skipping what is there (run_one stands in for the real job here)."""
    calls: list[tuple[str, bool]] = []

    def fake_run_one(plan, job_dir, steps, seed, on_step, profiler=True):  # noqa: ANN001
        calls.append((plan.job_id, profiler))
        job_dir.mkdir(parents=True, exist_ok=True)
        if plan.job_id == "job003":
            (job_dir / "failed.json").write_text("{}")
            return None
        (job_dir / "truth.json").write_text(json.dumps({"job": plan.job_id}))
        return {"job": plan.job_id}

    monkeypatch.setattr(rc, "run_one", fake_run_one)
    only = {"job001", "job003", "job005", "job007"}
    out = rc.generate(tmp_path, seed=2026, num_jobs=8, only=only, parallel=3, profiler=False)
    assert sorted(out["done"]) == ["job001", "job005", "job007"] and out["failed"] == ["job003"]
    assert sorted(calls) == sorted((j, False) for j in only)
    again = rc.generate(tmp_path, seed=2026, num_jobs=8, only=only, parallel=3, profiler=False)
    assert sorted(again["skipped"]) == sorted(only) and not again["done"]
    with pytest.raises(SystemExit):  # another draw in the same directory
        rc.generate(tmp_path, seed=7, num_jobs=8, only=only)
