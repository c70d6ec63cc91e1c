"""benchmarks/generalize.py without running a program: the draw (one seed per half, clean twins, the
kinds each family takes, the factor buckets) and the scorer on hand-written analysis documents (a right
answer, a finding naming a healthy rank, a clean twin that names a rank)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gz():
    spec = importlib.util.spec_from_file_location("generalize", ROOT / "benchmarks" / "generalize.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["generalize"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_draw_is_one_seed_with_a_clean_twin_for_every_job(gz):
    jobs = gz.plan("tuning", 60, 6)
    assert [j.args for j in jobs] == [j.args for j in gz.plan("tuning", 60, 6)]
    assert [j.args for j in jobs] != [j.args for j in gz.plan("tuning", 61, 6)]
    assert {j.family for j in jobs} == {f.name for f in gz.FAMILIES if f.half == "tuning"}
    assert not {j.family for j in gz.plan("evaluation", 60, 6)} & {j.family for j in jobs}
    by_name = {j.job: j for j in jobs}
    injected = [j for j in jobs if not j.clean]
    assert len(injected) == 6 * 4 and len(jobs) == 2 * len(injected)
    for j in injected:
        fam = gz.FAMILY[j.family]
        twin = by_name[j.twin]
        assert twin.clean and twin.twin_of == j.job and twin.seed == j.seed
        assert twin.args == [a if a != j.kind else "none" for a in j.args]  # the same flags, --inject none
        assert j.kind != "stage" or fam.pp > 1
        assert all(0 <= r < fam.nproc for r in j.targets) and j.targets
        if j.kind == "stage":
            assert j.targets == fam.stage_ranks(j.stage)
        if j.kind == "data" and fam.data_ranks:
            assert j.targets[0] in fam.data_ranks
        if j.kind in gz.FACTOR_KINDS:
            assert 1.1 <= j.factor <= 2.0 and j.bucket == gz.bucket_of(j.factor)
        if j.kind in ("host", "data"):
            assert 0.15 * fam.step_ms <= j.ms <= fam.step_ms
        assert j.harder == (j.kind == "cpu")
    kinds = [j.kind for j in injected]
    assert kinds.count("device") >= 2 * 4 - 1  # twice as likely: two of each family's shuffled six or seven
    buckets = [j.bucket for j in injected if j.bucket]
    assert max(buckets.count(b) for b in set(buckets)) - min(buckets.count(b) for b in set(buckets)) <= 4


def _truth(kind="device", targets=(2,), job="ddp_mlp-01-device", family="ddp_mlp", factor=1.4):
    return {"job": job, "family": family, "half": "tuning", "kind": kind, "targets": list(targets),
            "factor": None if kind == "none" else factor, "bucket": None if kind == "none" else gz_bucket(factor),
            "harder": kind == "cpu", "twin_of": "x" if kind == "none" else None}


def gz_bucket(f):
    return "1.25-1.50" if 1.25 <= f < 1.5 else "1.50-2.00" if f >= 1.5 else "1.10-1.25"


def _doc(*findings, verdict="straggling", nproc=4, pp=1):
    return {"doc": {"verdict": verdict, "slowdown": 1.2, "findings": list(findings),
                    "by_worker": [{"rank": r, "dp_rank": r // pp, "stage": r % pp, "slowdown": 1.0}
                                  for r in range(nproc)]}}


def _f(cause, ranks=(), stages=(), pattern="persistent"):
    return {"cause": cause, "workers": [{"rank": r} for r in ranks], "stages": list(stages), "gain": 1.1,
            "targets": [{"pattern": pattern}] if ranks or stages else []}


def test_a_right_answer_scores_right(gz):
    row = gz.score_job(_truth(), _doc(_f("worker", [2])))
    assert row["right"] and row["first_right"] and row["hit"]
    assert row["named"] == [2] and row["named_targets"] == [2]
    host = gz.score_job(_truth("host", [1]), _doc(_f("launch-delay", [1])))
    assert host["right"]
    data = gz.score_job(_truth("data", [0]), _doc(_f("comm"), _f("data-loading", [0])))
    assert not data["right"] and data["hit"]  # named, but not first
    # a stage finding names its stage's ranks through by_worker: dp 2 x pp 2, stage 1 is ranks 1 and 3
    stage = gz.score_job(_truth("stage", [1, 3]), _doc(_f("stage-imbalance", stages=[1]), pp=2))
    assert stage["right"] and stage["named"] == [1, 3]
    # in a pure pipeline a slow rank is its stage: the stage finding names exactly it
    pure = gz.score_job(_truth("device", [2]), _doc(_f("stage-imbalance", stages=[2]), pp=4))
    assert pure["right"]


def test_a_finding_naming_a_healthy_rank_is_wrong(gz):
    row = gz.score_job(_truth(), _doc(_f("worker", [1])))
    assert not row["right"] and not row["hit"] and row["named"] == [1] and row["named_targets"] == []
    assert "wanted" in row["why"]
    wrong_cause = gz.score_job(_truth(), _doc(_f("comm", [2])))
    assert not wrong_cause["hit"] and wrong_cause["named_targets"] == [2]  # the rank is right, the cause is not
    extra = gz.score_job(_truth(), _doc(_f("worker", [1, 2])))
    assert not extra["hit"]  # exactly the target: a finding naming two ranks is another diagnosis
    # a stage finding over a dp x pp stage names both its ranks: not the one slow rank
    assert not gz.score_job(_truth("device", [1]), _doc(_f("stage-imbalance", stages=[1]), pp=2))["hit"]


def test_a_clean_twin_naming_a_rank_is_wrong(gz):
    clean = _truth("none", [], job="ddp_mlp-01-clean")
    named = gz.score_job(clean, _doc(_f("worker", [3])))
    assert not named["right"] and named["named"] == [3] and not named["noise_only"]
    quiet = gz.score_job(clean, _doc(_f("unexplained"), _f("launch-delay")))
    assert quiet["right"] and quiet["named"] == []
    healthy = gz.score_job(clean, _doc(verdict="healthy"))
    assert healthy["right"]
    noise = gz.score_job(clean, _doc(_f("worker", [3], pattern="noise")))
    assert not noise["right"] and noise["noise_only"]
    failed = gz.score_job(clean, {"error": "exit 2: cannot tell its format"})
    assert failed["status"] == "error" and not failed["right"]


def test_figures(gz):
    rows = [gz.score_job(_truth(), _doc(_f("worker", [2]))),  # right: 1 named, a target
            gz.score_job(_truth(factor=1.15), _doc(_f("worker", [1]))),  # wrong: 1 named, healthy
            gz.score_job(_truth("cpu", [0], factor=1.6), _doc(_f("worker", [0]))),
            gz.score_job(_truth("none", [], job="a-clean"), _doc(_f("worker", [3]))),  # a clean twin naming a rank
            gz.score_job(_truth("none", [], job="b-clean"), _doc(verdict="healthy"))]
    f = gz.figures(rows)
    assert f["precision_named_ranks"] == pytest.approx(2 / 4)
    assert f["recall"] == pytest.approx(2 / 3) and f["recall_not_harder"] == pytest.approx(1 / 2)
    assert f["recall_harder"] == 1.0 and f["recall_device_ge_1_25"] == 1.0 and f["device_ge_1_25_jobs"] == 1
    assert f["recall_by_bucket"]["1.10-1.25"] == {"hit": 0, "jobs": 1, "recall": 0.0}
    assert f["first_right"] == pytest.approx(2 / 3)
    assert f["clean_no_rank"] == 0.5 and f["clean_healthy_or_noise"] == 0.5
    assert f["clean_verdicts"] == {"straggling": 1, "healthy": 1}


def test_the_worst_s_w_counts_only_alone_and_on_the_target(gz):
    def doc(sw):
        d = _doc(_f("worker", [2]))
        d["doc"]["by_worker"] = [{"rank": r, "dp_rank": r, "stage": 0, "slowdown": v} for r, v in enumerate(sw)]
        return d

    rows = [gz.score_job(_truth(targets=(2,)), doc([1.1, 1.1, 1.4, 1.1])),  # the target, alone
            gz.score_job(_truth(targets=(2,)), doc([1.3, 1.3, 1.3, 1.3])),  # a tie: no answer
            gz.score_job(_truth(targets=(1,)), doc([1.1, 1.2, 1.4, 1.1])),  # another rank
            gz.score_job(_truth("stage", [1, 3]), doc([1.0, 1.3, 1.0, 1.3])),  # two targets: not counted
            gz.score_job(_truth("none", [], job="a-clean"), doc([1.1, 1.2, 1.1, 1.1]))]
    assert rows[0]["sw_worst"] == [2] and rows[1]["sw_worst"] == [0, 1, 2, 3]
    assert gz.figures(rows)["sw_worst_is_target"] == pytest.approx(1 / 3)


def test_step_times_are_read_where_two_ranks_wrote_on_one_line(gz, tmp_path):
    # the ranks share one pipe: a clean fsdp_short twin's log held both ranks' lines as one
    half = tmp_path / "tuning"
    for job, text in (("f-00-clean", "[step-times] rank 1: median 10.5 ms over 23 steps[step-times] rank 0: "
                                     "median 10.4 ms over 23 steps\nlaggard: the trace is in x\n"),
                      ("f-00-device", "[step-times] rank 0: median 15.6 ms over 23 steps\n"
                                      "[step-times] rank 1: median 15.75 ms over 23 steps\n")):
        (half / job).mkdir(parents=True)
        (half / job / "output.log").write_text(text)
    assert gz._step_times(half / "f-00-clean" / "output.log") == {"0": 10.4, "1": 10.5}
    twin = {"job": "f-00-clean", "kind": "none", "step_times_ms": {}}
    (half / "f-00-clean" / "truth.json").write_text(__import__("json").dumps(twin))
    truth = {"job": "f-00-device", "kind": "device", "twin": "f-00-clean", "step_times_ms": {}}
    assert gz.realized(truth, half) == pytest.approx(15.75 / 10.5)
