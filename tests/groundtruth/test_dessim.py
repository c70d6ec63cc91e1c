"""The independent discrete-event simulator: its own physics, its traces, its ground truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

import laggard
from laggard.cli.base import main
from laggard.errors import LaggardError
from laggard.groundtruth.dessim import (
    SimConfig,
    parse_cause,
    simulate,
    simulate_with_truth,
    to_job,
    write_kineto,
)
from laggard.groundtruth.dessim.schedule import stage_order


def test_schedule_runs_every_microbatch_once_forward_before_backward():
    for pp, mb, vpp in ((4, 8, 1), (4, 8, 2), (2, 4, 3), (8, 8, 1)):
        for s in range(pp):
            order = stage_order(s, pp, mb, vpp)
            fwd = [(i.microbatch, i.chunk) for i in order if i.forward]
            bwd = [(i.microbatch, i.chunk) for i in order if not i.forward]
            assert sorted(fwd) == sorted(bwd) == sorted((m, c) for m in range(mb) for c in range(vpp))
            for k, it in enumerate(order):
                if not it.forward:
                    assert order.index(it._replace(forward=True)) < k


def test_clean_1f1b_step_time_matches_the_pipeline_formula():
    # (m + p - 1) * (t_f + t_b) + collectives and optimizer: the bubble is (p - 1) microbatch slots
    sim = simulate(SimConfig(dp=2, pp=4, microbatches=8, jitter=0.0, skew_s=0.0))
    compute = (8 + 4 - 1) * 30e-3
    assert compute < sim.mean_step_s < compute + 25e-3


def test_same_seed_same_job_and_causes_do_not_shift_other_draws():
    cfg = SimConfig(dp=2, pp=2, microbatches=4, steps=2, seed=3)
    a, b = simulate(cfg), simulate(cfg)
    assert a.cols["start_s"] == b.cols["start_s"]
    slow = simulate(cfg, [parse_cause("slow-worker:rank=0,factor=2")])
    # rank 3's (dp 1, stage 1) compute durations are the same draws with or without the cause
    def durs(s):
        c = s.cols
        return [e - st for r, k, st, e in zip(c["rank"], c["kind"], c["start_s"], c["end_s"], strict=True)
                if r == 3 and k == "compute"]
    assert np.allclose(durs(a), durs(slow), rtol=1e-9, atol=0)


def test_slow_worker_truth_is_a_real_speedup():
    cfg = SimConfig(dp=4, pp=2, microbatches=4, steps=2)
    t = simulate_with_truth(cfg, [parse_cause("slow-worker:rank=5,factor=2")])
    assert t.causes[0].gain > 1.3
    assert t.slowdown == pytest.approx(t.causes[0].gain)


def test_hidden_cause_has_no_standalone_gain():
    # the slow link (dp 0) is hidden behind the slower worker (dp 2): fixing it alone gains nothing
    t = simulate_with_truth(SimConfig(dp=4, pp=4, steps=2), [
        parse_cause("slow-link:src=1,dst=2,delay_ms=5"), parse_cause("slow-worker:rank=9,factor=1.5")])
    assert t.causes[0].gain < 1.01 < t.causes[1].gain


@pytest.mark.parametrize("causes", [[], ["slow-worker:rank=5,factor=1.5"], ["gc-pauses:prob=0.1,pause_ms=40"],
                                    ["slow-link:src=1,dst=2,delay_ms=8", "heavy-stage:stage=3,factor=1.5"]])
def test_replay_fidelity_within_5_percent(causes):
    """laggard's replay of the simulator's trace reproduces the simulated step times."""
    sim = simulate(SimConfig(dp=4, pp=4, vpp=1, steps=3), [parse_cause(c) for c in causes])
    res = laggard.analyze(to_job(sim), diagnose=False)
    assert res.T_s == pytest.approx(sim.mean_step_s, rel=0.05)
    assert np.mean(res.step_measured_s) == pytest.approx(sim.mean_step_s, rel=0.01)


def test_fidelity_with_interleaved_schedule():
    sim = simulate(SimConfig(dp=2, pp=4, vpp=2, steps=2))
    res = laggard.analyze(to_job(sim), diagnose=False)
    assert res.T_s == pytest.approx(sim.mean_step_s, rel=0.05)


def test_kineto_export_reads_back(tmp_path):
    sim = simulate(SimConfig(dp=2, pp=2, microbatches=4, steps=2))
    paths = write_kineto(sim, tmp_path)
    assert len(paths) == 4
    job = laggard.load_job(tmp_path)
    assert sorted(np.unique(job.column("rank")).tolist()) == [0, 1, 2, 3]
    assert set(np.unique(job.column("step")).tolist()) == {0, 1}
    # every collective and p2p transfer of the simulation is there, matched across ranks
    n_comm = sum(k != "compute" for k in sim.cols["kind"])
    kinds = job.column("kind")
    assert int((kinds != "compute").sum()) == n_comm
    res = laggard.analyze(job, diagnose=False)
    assert res.slowdown < 1.1


@pytest.mark.parametrize("pp,cause", [(2, "heavy-stage:stage=1,factor=2"), (4, "heavy-stage:stage=3,factor=1.5"),
                                      (4, "slow-worker:rank=5,factor=1.5")])
def test_gpu_pipeline_profiler_trace_gives_the_simulators_attribution(tmp_path, pp, cause):
    # a GPU pipeline job as torch.profiler records it: kernel names say nothing of the phase (the
    # launching CPU op does), 1F1B runs one microbatch's backward and the next one's forward with
    # no transfer between them. Ground truth: the simulator's own op table of the same run.
    sim = simulate(SimConfig(dp=2, pp=pp, microbatches=8, steps=3), [parse_cause(cause)])
    write_kineto(sim, tmp_path)
    truth = laggard.analyze(to_job(sim), diagnose=False)
    res = laggard.analyze(laggard.load_job(tmp_path), diagnose=False)
    assert sorted(res.by_stage) == list(range(pp))
    for s in range(pp):
        assert res.by_stage[s] == pytest.approx(truth.by_stage[s], rel=0.03), s
    assert res.slowdown == pytest.approx(truth.slowdown, rel=0.03)
    # every stage has one forward and one backward segment per microbatch
    t = laggard.load_job(tmp_path).table.to_pandas()
    n = t[t["kind"] == "compute"].groupby(["pp_rank", "name"]).size().unstack()
    assert (n["gpu-forward"] == 8 * 3 * 2).all() and (n["gpu-backward"] == 8 * 3 * 2).all()


@pytest.mark.parametrize("spec,msg", [("bogus", "unknown kind"), ("slow-worker:rank=a", "not a valid value"),
                                      ("slow-worker:factor=0.5", "factor must be >= 1"), ("gc-pauses:prob=2", "prob"),
                                      ("slow-link:src=1,dst=1", "must differ"), ("gc-pauses:speed=1", "is not one of")])
def test_bad_cause_specs(spec, msg):
    with pytest.raises(LaggardError, match=msg):
        parse_cause(spec)


def test_bad_layouts():
    with pytest.raises(LaggardError, match="no rank 99"):
        simulate(SimConfig(dp=2, pp=2), [parse_cause("slow-worker:rank=99")])
    with pytest.raises(LaggardError, match="neighbouring"):
        simulate(SimConfig(dp=2, pp=4), [parse_cause("slow-link:src=0,dst=5")])
    with pytest.raises(LaggardError, match="multiple of --pp"):
        SimConfig(pp=4, vpp=2, microbatches=6)


def test_cli_writes_trace_truth_and_kineto(tmp_path, capsys):
    out = tmp_path / "job"
    rc = main(["dessim", str(out), "--dp", "2", "--pp", "2", "--microbatches", "4", "--steps", "2",
               "--inject", "slow-worker:rank=1,factor=2", "--kineto"])
    assert rc == 0
    truth = json.loads((out / "truth.json").read_text())
    assert truth["causes"][0]["gain"] > 1.2 and truth["expected_findings"] == ["worker"]
    assert len(list((out / "kineto").glob("rank*.json"))) == 4
    assert main(["analyze", str(out)]) == 0
    assert main(["dessim", str(out), "--inject", "nope"]) == 2
    assert "unknown kind" in capsys.readouterr().err


@pytest.mark.parametrize("old, new", [("slow-worker:ranks=3+9,factor=1.5", "slow-worker:rank=3+9,factor=1.5"),
                                      ("seq-imbalance:sigma=0.5", "seqlen-imbalance:sigma=0.5"),
                                      ("gc:prob=0.05,pause_ms=50", "gc-pauses:prob=0.05,pause_ms=50")])
def test_one_inject_syntax_old_spellings_warn(old: str, new: str) -> None:
    """The simulator reads what `synth`/`demo --inject` write; its old spellings still work, said once."""
    import warnings

    from laggard.errors import LaggardWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", LaggardWarning)
        c = parse_cause(new)
    assert c.spec() == new
    with pytest.warns(LaggardWarning, match="old spelling"):
        assert parse_cause(old) == c


def test_dessim_cause_flag_is_the_old_name_of_inject(tmp_path, capsys) -> None:
    from tests.conftest import run_cli

    assert run_cli("dessim", tmp_path / "a", "--dp", "2", "--pp", "2", "--steps", "2", "--no-truth",
                   "--cause", "slow-worker:rank=1,factor=2") == 0
    assert "--cause is the old name of --inject" in capsys.readouterr().err
