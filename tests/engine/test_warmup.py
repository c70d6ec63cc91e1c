"""Warm-up steps are skipped (detected, or --skip-steps N), said in the output and the JSON; a job
with one worker or too few steps gets "not enough to judge", not a straggling verdict."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from laggard.groundtruth.synth import SynthConfig, synthesize
from laggard.optable.ops import Job, write_native
from tests.conftest import run_cli


def _with_warmup(num_slow: int, factor: float = 5.0, **cfg) -> Job:
    """A synthetic job whose first ``num_slow`` steps run ``factor`` x slower (every op stretched
    about its step's start; later steps shifted so steps do not overlap)."""
    job = synthesize(SynthConfig(**cfg))
    step = job.column("step").astype(np.int64)
    start = job.column("start_ns").astype(np.int64)
    dur = job.column("dur_ns").astype(np.int64)
    steps = np.unique(step)
    t0 = np.array([start[step == s].min() for s in steps])
    t1 = np.array([(start + dur)[step == s].max() for s in steps])
    extra = np.where(np.arange(len(steps)) < num_slow, (t1 - t0) * (factor - 1), 0)
    shift = np.concatenate([[0], np.cumsum(extra)[:-1]])[np.searchsorted(steps, step)]
    slow = np.searchsorted(steps, step) < num_slow
    s0 = t0[np.searchsorted(steps, step)]
    new_start = np.where(slow, s0 + (start - s0) * factor, start) + shift
    new_dur = np.where(slow, dur * factor, dur).astype(np.int64)
    t = job.table.set_column(job.table.schema.get_field_index("start_ns"), "start_ns",
                             pa.array(new_start.astype(np.int64)))
    t = t.set_column(t.schema.get_field_index("dur_ns"), "dur_ns", pa.array(new_dur))
    return Job(table=t, meta=job.meta)


def test_warmup_steps_are_detected_skipped_and_said(tmp_path, capsys):
    write_native(_with_warmup(2, dp=4, pp=2, microbatches=4, steps=8), tmp_path / "job")
    out = tmp_path / "a.json"
    assert run_cli("analyze", tmp_path / "job", "--json", out) == 0
    captured = capsys.readouterr()
    assert "skipped 2 warm-up step(s) (0, 1)" in captured.err
    d = json.loads(out.read_text())
    assert d["warmup_steps_skipped"] == [0, 1] and sorted(map(int, d["step_time_ideal"])) == list(range(2, 8))
    assert d["verdict"] == "healthy", d["findings"]
    # --skip-steps overrides: 0 keeps the warm-up (and its first steps then look like stragglers)
    assert run_cli("analyze", tmp_path / "job", "--json", out, "--skip-steps", "0") == 0
    d0 = json.loads(out.read_text())
    assert d0["warmup_steps_skipped"] == [] and len(d0["step_time_ideal"]) == 8
    assert run_cli("analyze", tmp_path / "job", "--json", out, "--skip-steps", "3") == 0
    assert json.loads(out.read_text())["warmup_steps_skipped"] == [0, 1, 2]
    assert run_cli("analyze", tmp_path / "job", "--skip-steps", "-1") == 2
    assert run_cli("analyze", tmp_path / "job", "--skip-steps", "8") == 2
    assert "only 8 step(s)" in capsys.readouterr().err


def test_settled_steps_are_all_kept(analyses):
    """The published traces have no warm-up in them: every step is analyzed (their numbers hold)."""
    for res in analyses.values():
        assert res.extras["warmup_steps_skipped"] == []


@pytest.mark.parametrize("cfg,verdict", [(dict(dp=1, pp=1, steps=6), "not enough to judge"),
                                         (dict(dp=4, pp=2, steps=2), "few steps only")],
                         ids=["one-worker", "two-steps"])
def test_tiny_jobs_are_not_judged(cfg, verdict, tmp_path, capsys):
    """One worker has nobody to straggle behind; two steps are read step by step (who arrived late,
    ``laggard.diagnose.onestep``), and a clean job's steps name nobody."""
    write_native(_with_warmup(0, microbatches=2, **cfg), tmp_path / "job")
    out = tmp_path / "a.json"
    assert run_cli("analyze", tmp_path / "job", "--json", out, "--skip-steps", "0") == 0
    d = json.loads(out.read_text())
    assert d["verdict"] == verdict and d["findings"] == [] and d["reason"]
    assert run_cli("analyze", tmp_path / "job", "--skip-steps", "0") == 0
    assert f"verdict: {verdict}" in capsys.readouterr().out


def test_a_straggler_in_the_first_steps_is_not_warm_up():
    """One rank 4x slower in steps 0-1 (a GC pause, a slow worker) stretches those steps' span and
    every other rank's collectives, but it is a straggler to analyze, not warm-up to skip."""
    from laggard.engine.warmup import detect_warmup

    job = synthesize(SynthConfig(dp=4, pp=2, microbatches=4, steps=8))
    step, rank = job.column("step"), job.column("rank")
    code, labels = job.codes("kind")
    comp = code == labels.index("compute")
    dur = job.column("dur_ns").astype(np.int64)
    hit = comp & (rank == 0) & (step < 2)
    stretched = Job(table=job.table.set_column(job.table.schema.get_field_index("dur_ns"), "dur_ns",
                                               pa.array(np.where(hit, dur * 4, dur))), meta=job.meta)
    assert detect_warmup(stretched) == 0
    # the same stretch on every rank is warm-up
    every = comp & (step < 2)
    warm = Job(table=job.table.set_column(job.table.schema.get_field_index("dur_ns"), "dur_ns",
                                          pa.array(np.where(every, dur * 4, dur))), meta=job.meta)
    assert detect_warmup(warm) == 2


def test_ranks_starting_apart_make_the_first_step_warm_up():
    """Processes reach their first step apart (imports, process-group set-up, model build): most
    ranks enter step 0 late, which is warm-up; one rank entering it late alone is a straggler."""
    from laggard.engine.warmup import detect_warmup

    job = synthesize(SynthConfig(dp=4, pp=1, microbatches=2, steps=8))
    step, rank = job.column("step"), job.column("rank")
    start = job.column("start_ns").astype(np.int64)
    ms = 1_000_000

    def shifted(offset_ns: np.ndarray) -> Job:
        new = np.where(step == 0, start + offset_ns, start)
        return Job(table=job.table.set_column(job.table.schema.get_field_index("start_ns"), "start_ns",
                                              pa.array(new.astype(np.int64))), meta=job.meta)

    assert detect_warmup(shifted(rank.astype(np.int64) * 150 * ms)) == 1
    assert detect_warmup(shifted(np.where(rank == 0, 450 * ms, 0))) == 0
