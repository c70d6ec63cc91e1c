"""The real demo job: multi-process training traced end to end, injected stragglers found where they
should be, a rank that dies mid-run, an unwritable trace directory, and `laggard demo`.

Few, small runs (the job starts its ranks from a fork server that has imported torch once); the
assertions are about where stragglers show, never about timings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laggard.demo.launch import JobConfig, run_jobs
from laggard.groundtruth.inject import parse_injections
from laggard.tracer import check_trace

pytestmark = pytest.mark.timeout(300)

STEPS = 12


def _cfg(trace: Path | None, *inject: str, **kw) -> JobConfig:  # noqa: ANN003
    kw.setdefault("steps", STEPS)
    return JobConfig.quick(injections=parse_injections(list(inject)),
                           trace_dir=str(trace) if trace is not None else None, **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Clean, slow-worker, heavy-last-stage and an unwritable trace directory, in one launch of 2 x 2 ranks."""
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    base = tmp_path_factory.mktemp("demo")
    blocker = base / "not-a-dir"
    blocker.write_text("")
    cfgs = {
        "clean": _cfg(base / "clean"),
        "slow": _cfg(base / "slow", "slow-worker:rank=3,factor=2"),
        "heavy": _cfg(base / "heavy", "heavy-last-stage:factor=4"),
        "unwritable": _cfg(blocker / "trace", steps=2),
    }
    results = run_jobs(list(cfgs.values()))
    out = {}
    for (name, cfg), res in zip(cfgs.items(), results, strict=True):
        assert res.ok, (name, res.failures)
        job = load_job(cfg.trace_dir) if name != "unwritable" else None
        out[name] = {"cfg": cfg, "result": res, "job": job, "analysis": analyze(job) if job is not None else None}
    return out


def test_the_traced_job_is_complete_and_replays_faithfully(runs: dict) -> None:
    r = runs["clean"]
    a, job = r["analysis"], r["job"]
    traced = sorted(set(job.column("step").tolist()))
    assert traced == list(range(3, 3 + STEPS))  # every step traced; steps 0-2 were the warm-up, untraced
    # the analysis's own warm-up check (laggard.engine.warmup, tested on its own) may take the first
    # steps that a busy host slowed by 1.5x (CI, beside other real jobs): how many is timing, not this
    # test's question; that it takes a leading run of them, within its cap, and keeps the rest is
    skipped = a.extras["warmup_steps_skipped"]
    assert a.num_workers == 4 and len(skipped) <= STEPS // 2 and skipped + a.steps == traced, (skipped, a.steps)
    meta = job.meta
    assert (meta.dp_size, meta.pp_size, meta.world_size) == (2, 2, 4)
    names = set(job.table.column("name").to_pylist())
    assert {"forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send",
            "backward-recv", "grads-all-reduce", "optimizer-clip-main-grad", "optimizer", "data-wait"} <= names
    rows = job.table.to_pylist()
    fwd = [x for x in rows if x["name"] == "forward-compute"]
    assert all(x["num_tokens"] == 4 * 96 and sum(x["seq_lens"]) == 4 * 96 for x in fwd)
    assert {(x["dp_rank"], x["pp_rank"]) for x in rows} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    # a warm-up step skipped is said in one warning, and only then; nothing else is warned
    said = [w for w in a.warnings if w.startswith("skipped ") and "warm-up step" in w]
    assert len(said) == len(skipped[:1]) and [w for w in a.warnings if w not in said] == [], a.warnings
    assert check_trace(r["cfg"].trace_dir) == []
    # everything the ranks do in a step is traced: replayed and measured step times agree
    assert 0.95 < a.launch_slowdown < 1.15
    losses = [x["loss"] for x in r["result"].ranks.values() if x["loss"] is not None]
    assert losses and all(0 < v < 6 for v in losses)  # it trains (ln 256 = 5.5 at the start)


def test_a_slow_worker_is_found(runs: dict) -> None:
    clean, slow = runs["clean"]["analysis"], runs["slow"]["analysis"]
    assert slow.by_worker[0]["rank"] == 3  # the highest S_w
    s_w = {w["rank"]: w["slowdown"] for w in slow.by_worker}
    assert s_w[3] > max(v for k, v in s_w.items() if k != 3) + 0.03
    # well above the clean run (which straggles too: four ranks share two busy cores)
    clean_w = {w["rank"]: w["slowdown"] for w in clean.by_worker}
    assert s_w[3] > clean_w[3] + 0.1 and slow.slowdown > clean.slowdown + 0.05


def test_a_heavy_last_stage_is_found(runs: dict) -> None:
    clean, heavy = runs["clean"]["analysis"], runs["heavy"]["analysis"]
    assert max(heavy.by_stage, key=heavy.by_stage.get) == 1
    assert heavy.by_stage[1] > clean.by_stage[1] + 0.1


def test_an_unwritable_trace_directory_does_not_stop_training(runs: dict) -> None:
    r = runs["unwritable"]
    assert r["result"].ok and all(len(x["step_s"]) == 2 for x in r["result"].ranks.values())


@pytest.mark.timeout(180)
def test_a_rank_that_dies_mid_run(tmp_path: Path) -> None:
    import warnings

    from laggard.analysis.pipeline import analyze
    from laggard.errors import LaggardWarning
    from laggard.io import load_job
    from laggard.optable.tracedir import warn_trace

    trace = tmp_path / "trace"
    cfg = _cfg(trace, crash_rank=3, crash_step=3, flush_interval_s=0.0)
    (res,) = run_jobs([cfg], grace_s=20)
    assert not res.ok and "exited with code 3" in res.failures[3]
    states = {r: json.loads((trace / f"rank{r}.state.json").read_text()) for r in range(4)}
    assert states[3]["status"] == "running" and states[3]["last_step_written"] >= 2
    for r in range(3):  # the survivors closed their traces (failed in a collective, or SIGTERM)
        assert states[r]["status"] != "running"
        assert states[r]["num_ops_written"] == states[r]["num_ops_recorded"] > 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        msgs = warn_trace(trace)
        a = analyze(load_job(trace))
    assert any("rank 3 did not close its trace" in m for m in msgs)
    said = [str(w.message) for w in caught]
    assert any("rank 3" in m for m in said)
    # the complete steps are analyzed: the traced steps are numbered after the untraced warm-up ones,
    # and rank 3 died at the end of its fourth (whether that step's ops reached its file before the
    # exit is timing, and so is warm-up skipping on a busy host: neither is what is checked here)
    traced = range(cfg.warmup_steps, cfg.warmup_steps + cfg.crash_step + 1)
    assert a.num_workers == 4 and set(a.steps) <= set(traced) and a.steps, (a.steps, list(traced))
    from laggard.analysis.config import AnalysisConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        every = analyze(load_job(trace), config=AnalysisConfig(skip_steps=0))
    assert 3 in every.steps


@pytest.mark.timeout(180)
def test_laggard_demo_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import run_cli

    out = tmp_path / "demo"
    assert run_cli("demo", "--quick", "--dp", "1", "--pp", "2", "--steps", "3", "--out", out,
                   "--inject", "slow-worker:rank=1,factor=3") == 0
    text = capsys.readouterr().out
    assert "straggler slowdown S =" in text and "replay fidelity" in text and "slow-worker on rank 1" in text
    d = json.loads((out / "analysis.json").read_text())
    assert d["num_workers"] == 2 and d["num_steps"] == 3
    assert (out / "report.html").stat().st_size > 1000 and (out / "trace" / "job.json").exists()
    assert f"report: {(out / 'report.html').resolve()}" in text
    from laggard.report.browser import find_chromium

    if find_chromium()[0] is not None:  # the demo ends with a screenshot of its report
        assert f"screenshot of the report: {(out / 'report.png').resolve()}" in text
        assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "no screenshot: " in text
    assert run_cli("demo", "--inject", "bogus") == 2


def test_config_mistakes_are_one_line_errors() -> None:
    from laggard.errors import LaggardError

    for spec, msg in (("slow-worker:rank=4", "the job has 4 ranks"), ("slow-link:src=0,dst=3", "never sends"),
                      ("slow-link:src=1,dst=2", "never sends"), ("host-stall:rank=4", "the job has 4 ranks"),
                      ("heavy-stage:stage=2", "the job has 2 pipeline stages")):
        with pytest.raises(LaggardError, match=msg):
            _cfg(None, spec)
    with pytest.raises(LaggardError, match="too few for 8 pipeline stages"):
        JobConfig(pp=8)
    _cfg(None, "slow-link:src=1,dst=0", "slow-link:src=2,dst=3")  # neighbours: fine
