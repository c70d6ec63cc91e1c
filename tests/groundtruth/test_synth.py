"""The synthetic generator: every injected cause shows up where it should."""

from __future__ import annotations

import json

import pytest

from laggard.analysis.pipeline import analyze
from laggard.errors import LaggardError
from laggard.groundtruth.inject import parse_injection, parse_injections
from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth
from tests.conftest import run_cli

CFG = dict(dp=4, pp=4, microbatches=8, steps=6, seed=11)


def _run(*specs: str):
    res = synthesize_with_truth(SynthConfig(**CFG), parse_injections(list(specs)))
    return analyze(res.job), res.truth


@pytest.fixture(scope="module")
def clean():
    return _run()[0]


def test_clean_job_is_nearly_ideal(clean):
    assert 1.0 <= clean.slowdown < 1.05
    assert clean.launch_slowdown == pytest.approx(1.0, abs=1e-6)


def test_slow_worker(clean):
    r, truth = _run("slow-worker:rank=6,factor=2")
    assert r.by_worker[0]["rank"] == 6
    assert r.slowdown > clean.slowdown + 0.2
    assert truth["injections"][0]["workers"] == [{"rank": 6, "dp_rank": 1, "stage": 2}]


def test_heavy_last_stage(clean):
    r, truth = _run("heavy-last-stage:factor=2")
    assert max(r.by_stage, key=r.by_stage.get) == 3
    assert r.by_stage[3] > max(r.by_stage[s] for s in range(3)) + 0.2
    assert r.M_S > 0.5 and truth["injections"][0]["stages"] == [3]


def test_seqlen_imbalance(clean):
    r, truth = _run("seqlen-imbalance:sigma=0.5")
    assert r.slowdown > clean.slowdown + 0.1
    top = sorted(r.by_optype, key=r.by_optype.get)[-2:]
    assert set(top) == {"forward-compute", "backward-compute"}
    assert truth["injections"][0]["imbalance"] > 1.1
    toks = r.base.job.column("num_tokens")
    assert toks.max() > toks[toks > 0].min()  # the trace carries the varying token counts


def test_gc_pauses(clean):
    r, truth = _run("gc-pauses:prob=0.05,pause_ms=40")
    assert r.slowdown > clean.slowdown + 0.05
    assert r.by_optype["forward-compute"] > r.by_optype["backward-compute"] + 0.03
    assert truth["injections"][0]["num_pauses"] > 0


def test_slow_link(clean):
    r, _ = _run("slow-link:src=1,dst=2,delay_ms=10")
    assert r.slowdown > clean.slowdown + 0.1
    assert r.by_optype["forward-pp-comm"] > 1.05
    assert max(r.by_stage, key=r.by_stage.get) == 2


def test_launch_delay(clean):
    r, _ = _run("launch-delay:ms=3")
    assert r.launch_slowdown > 1.05  # untraced gaps: measured steps longer than the replay
    assert r.slowdown == pytest.approx(clean.slowdown, rel=0.01)


def test_interleaved_and_tp():
    res = synthesize_with_truth(SynthConfig(dp=2, pp=2, vpp=2, tp=4, microbatches=4, steps=3), [])
    r = analyze(res.job)
    assert r.meta.num_gpus == 16 and r.launch_slowdown == pytest.approx(1.0, abs=1e-6)
    assert sorted({w["rank"] for w in r.by_worker}) == [0, 4, 8, 12]


def test_bad_injections():
    with pytest.raises(LaggardError, match="unknown cause"):
        parse_injection("slow-gpu")
    with pytest.raises(LaggardError, match="not one of"):
        parse_injection("slow-worker:speed=3")
    with pytest.raises(LaggardError, match="factor must be >= 1"):
        parse_injection("slow-worker:factor=0.5")
    with pytest.raises(LaggardError, match="no worker has global rank"):
        synthesize_with_truth(SynthConfig(dp=2, pp=2), parse_injections(["slow-worker:rank=99"]))
    with pytest.raises(LaggardError, match="exchange no p2p"):
        synthesize_with_truth(SynthConfig(dp=2, pp=2), parse_injections(["slow-link:src=0,dst=3"]))
    with pytest.raises(LaggardError, match="no worker has global rank"):
        synthesize_with_truth(SynthConfig(dp=2, pp=2), parse_injections(["launch-delay:rank=4"]))
    with pytest.raises(LaggardError, match="no worker has global rank"):
        synthesize_with_truth(SynthConfig(dp=2, pp=2), parse_injections(["host-stall:rank=4"]))


def test_a_launch_delay_on_one_rank_delays_only_its_computes():
    cfg = SynthConfig(dp=2, pp=2, steps=3)
    spec = parse_injection("launch-delay:rank=2,ms=3")
    assert spec.spec() == "launch-delay:ms=3,rank=2" and parse_injection("launch-delay").spec() == "launch-delay:ms=5"
    one = synthesize_with_truth(cfg, [spec])
    assert one.truth["injections"][0]["ranks"] == [2]
    gaps = analyze(one.job, diagnose=False).to_json()["untraced_gaps"]["per_rank_s_per_step"]
    # 3 ms before each of rank 2's 16 computes a step (a forward and a backward per microbatch), none elsewhere
    assert gaps["2"] == pytest.approx(16 * 3e-3, rel=0.05) and max(gaps["0"], gaps["1"], gaps["3"]) < 1e-3, gaps


def test_cli_writes_trace_and_truth(tmp_path, capsys):
    out = tmp_path / "syn"
    assert run_cli("synth", "--dp", 2, "--pp", 2, "--steps", 3, "--inject", "slow-worker:rank=1,factor=3",
                   "--out", out) == 0
    truth = json.loads((out / "truth.json").read_text())
    assert truth["injections"][0]["cause"] == "slow-worker"
    assert run_cli("analyze", out, "--json", tmp_path / "a.json", "-q") == 0
    d = json.loads((tmp_path / "a.json").read_text())
    assert d["by_worker"][0]["rank"] == 1
    assert run_cli("synth", "--out", out, "--inject", "gc-pauses:prob=2") == 2
    assert "prob must be between 0 and 1" in capsys.readouterr().err


def test_new_cause_parse_rules():
    """host-stall and heavy-stage: the same syntax as the other causes; defaults filled in."""
    stall = parse_injection("host-stall:rank=3,ms=12.5,every=4")
    assert stall.params == {"rank": 3, "ms": 12.5, "every": 4}
    assert stall.spec() == "host-stall:rank=3,ms=12.5,every=4"
    assert parse_injection("host-stall:rank=1").params == {"rank": 1, "ms": 20.0, "every": 1}
    assert parse_injection("heavy-stage:stage=2,factor=1.15").params == {"stage": 2, "factor": 1.15}
    assert parse_injection("slow-worker:rank=1,factor=1.15")["factor"] == 1.15
    with pytest.raises(LaggardError, match="every must be >= 1"):
        parse_injection("host-stall:every=0")
    with pytest.raises(LaggardError, match="every must be a non-negative integer"):
        parse_injection("host-stall:every=1.5")
    with pytest.raises(LaggardError, match="stage must be a non-negative integer"):
        parse_injection("heavy-stage:stage=-1")
    with pytest.raises(LaggardError, match="factor must be >= 1"):
        parse_injection("heavy-stage:factor=0.9")
    # host stalls may hit several ranks; a stage is heavy once
    assert len(parse_injections(["host-stall:rank=0", "host-stall:rank=2,every=3"])) == 2
    with pytest.raises(LaggardError, match="heavy-stage given more than once"):
        parse_injections(["heavy-stage:stage=0", "heavy-stage:stage=1"])


def test_heavy_stage(clean):
    r, truth = _run("heavy-stage:stage=1,factor=2")
    assert max(r.by_stage, key=r.by_stage.get) == 1
    assert truth["injections"][0]["stages"] == [1]
    with pytest.raises(LaggardError, match="pipeline stages"):
        synthesize_with_truth(SynthConfig(dp=2, pp=2), parse_injections(["heavy-stage:stage=2"]))


def test_host_stall():
    res = synthesize_with_truth(SynthConfig(**CFG), parse_injections(["host-stall:rank=5,ms=20,every=2"]))
    rec = res.truth["injections"][0]
    assert rec["ranks"] == [5] and rec["steps"] == [0, 2, 4]
    t = res.job.table.to_pydict()
    ops = [(st, s0, s0 + d, n, mb) for r, st, s0, d, n, mb in zip(t["rank"], t["step"], t["start_ns"], t["dur_ns"],
                                                                   t["name"], t["microbatch"], strict=True) if r == 5]
    for step in range(CFG["steps"]):
        first = min(s0 for st, s0, _, n, mb in ops if st == step and n == "forward-compute" and mb == 0)
        idle_ms = (first - max(e for st, _, e, _, _ in ops if st == step and e <= first)) / 1e6
        # the stall is untraced time right before the first forward, in every second step only
        assert idle_ms == pytest.approx(20.0, abs=0.01) if step % 2 == 0 else idle_ms < 1.0
