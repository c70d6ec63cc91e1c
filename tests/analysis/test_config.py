"""One AnalysisConfig: every setting honoured, and a setting given two ways never silently dropped."""

from __future__ import annotations

import pickle

import pytest

import laggard
from laggard.analysis.config import AnalysisConfig, resolve_config
from laggard.diagnose.config import HEALTHY_THRESHOLD, DiagnoseConfig
from laggard.engine.gaps import GapConfig
from laggard.engine.warmup import WarmupConfig
from laggard.errors import LaggardError
from laggard.fleet.config import FleetConfig
from laggard.monitor.config import MonitorConfig
from tests.conftest import ND, run_cli


@pytest.fixture(scope="module")
def ar_job():
    from laggard.io import load_job

    return load_job(ND / "trace-AR.parquet")


def test_a_diagnose_config_threshold_is_honoured(ar_job):
    """The bug this config fixes: DiagnoseConfig(threshold=2.0) ran at 1.05 (analyze's default won).
    AR's slowdown is 1.97: straggling at 1.05, healthy at 2.0."""
    assert laggard.analyze(ar_job).diagnosis.verdict == "straggling"
    d = laggard.analyze(ar_job, config=DiagnoseConfig(threshold=2.0)).diagnosis
    assert (d.verdict, d.threshold) == ("healthy", 2.0)
    d = laggard.analyze(ar_job, config=AnalysisConfig(healthy_threshold=2.0)).diagnosis
    assert (d.verdict, d.threshold) == ("healthy", 2.0)
    d = laggard.analyze(ar_job, healthy_threshold=2.0).diagnosis
    assert (d.verdict, d.threshold) == ("healthy", 2.0)


def test_the_default_threshold_has_one_home(ar_job):
    assert laggard.analyze(ar_job).diagnosis.threshold == HEALTHY_THRESHOLD
    assert AnalysisConfig().threshold == DiagnoseConfig().healthy_threshold == HEALTHY_THRESHOLD


@pytest.mark.parametrize("kwargs, names", [
    (dict(config=DiagnoseConfig(threshold=2.0), healthy_threshold=1.1), ("1.1", "DiagnoseConfig.threshold=2")),
    (dict(config=AnalysisConfig(healthy_threshold=1.5), healthy_threshold=1.1),
     ("healthy_threshold=1.1", "config.healthy_threshold=1.5")),
    (dict(config=AnalysisConfig(skip_steps=2), skip_steps=3), ("skip_steps=3", "config.skip_steps=2")),
    (dict(config=AnalysisConfig(gaps=GapConfig(enabled=False)), gaps=GapConfig(min_share_of_step=0.5)), ("gaps",)),
])
def test_a_setting_given_two_ways_that_disagree_is_an_error(ar_job, kwargs, names):
    with pytest.raises(LaggardError) as e:
        laggard.analyze(ar_job, **kwargs)
    assert all(n in str(e.value) for n in names), str(e.value)


def test_a_threshold_in_both_nested_places_that_disagree_is_an_error():
    with pytest.raises(LaggardError, match="given twice"):
        AnalysisConfig(healthy_threshold=1.5, diagnosis=DiagnoseConfig(threshold=2.0))
    assert AnalysisConfig(healthy_threshold=1.5, diagnosis=DiagnoseConfig(threshold=1.5)).threshold == 1.5


def test_a_keyword_fills_what_the_config_leaves_at_its_default():
    cfg = resolve_config(AnalysisConfig(skip_steps=2), healthy_threshold=1.3, skip_steps=2, diagnose=False)
    assert (cfg.healthy_threshold, cfg.skip_steps, cfg.diagnose) == (1.3, 2, False)
    assert resolve_config(DiagnoseConfig(min_share=0.1)).diagnosis.min_share == 0.1
    assert resolve_config(None) == AnalysisConfig()


def test_warmup_and_gaps_pass_through_analyze():
    """A job whose first two steps compute 3x longer: the default warm-up rule skips them, a
    WarmupConfig that never calls a step warm-up keeps them; gaps off leaves no host ops."""
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=2, pp=2, microbatches=4, steps=8, seed=3))
    import numpy as np
    import pyarrow as pa

    t = job.table
    dur = t.column("dur_ns").to_numpy().copy()
    early = (np.isin(t.column("step").to_numpy(), [0, 1])
             & (t.column("kind").to_numpy(zero_copy_only=False) == "compute"))
    dur[early] *= 3
    job = laggard.Job(table=t.set_column(t.schema.get_field_index("dur_ns"), "dur_ns", pa.array(dur)), meta=job.meta)
    with pytest.warns(laggard.LaggardWarning, match="warm-up"):
        skipped = laggard.analyze(job, diagnose=False).extras["warmup_steps_skipped"]
    assert skipped == [0, 1]
    kept = laggard.analyze(job, diagnose=False, config=AnalysisConfig(warmup=WarmupConfig(settle_ratio=1e9)))
    assert kept.extras["warmup_steps_skipped"] == [] and len(kept.steps) == 8
    assert laggard.analyze(job, diagnose=False,
                           config=AnalysisConfig(skip_steps=0)).extras["warmup_steps_skipped"] == []


@pytest.mark.parametrize("bad", [0.5, float("nan"), float("inf")])
def test_bad_thresholds_are_one_line_errors(bad):
    for make in (lambda: DiagnoseConfig(threshold=bad), lambda: AnalysisConfig(healthy_threshold=bad)):
        with pytest.raises(LaggardError, match="must be a number >= 1"):
            make()


def test_bad_nested_configs_are_errors():
    with pytest.raises(LaggardError, match="skip_steps"):
        AnalysisConfig(skip_steps=-1)
    with pytest.raises(LaggardError, match="AnalysisConfig.gaps must be a GapConfig"):
        AnalysisConfig(gaps=0.02)  # type: ignore[arg-type]
    with pytest.raises(LaggardError, match="AnalysisConfig or a DiagnoseConfig"):
        resolve_config({"healthy_threshold": 2.0})  # type: ignore[arg-type]


def test_fleet_and_monitor_take_the_same_config():
    """Both carry an AnalysisConfig to their worker processes (pickled) and honour it."""
    cfg = FleetConfig(analysis=AnalysisConfig(healthy_threshold=2.0))
    assert pickle.loads(pickle.dumps(cfg)).analysis.threshold == 2.0
    mcfg = MonitorConfig(analysis=AnalysisConfig(healthy_threshold=2.0))
    assert pickle.loads(pickle.dumps(mcfg.analysis)).threshold == 2.0
    with pytest.raises(LaggardError):
        FleetConfig(analysis=2.0)  # type: ignore[arg-type]


def test_monitor_window_analysis_honours_the_config(ar_job):
    from laggard.monitor.window import analyze_window

    doc, err = analyze_window(ar_job.table, ar_job.meta, AnalysisConfig(healthy_threshold=2.0))
    assert err is None and doc["verdict"] == "healthy" and doc["healthy_threshold"] == 2.0
    doc, _ = analyze_window(ar_job.table, ar_job.meta)
    assert doc["verdict"] == "straggling" and doc["healthy_threshold"] == HEALTHY_THRESHOLD


def test_cli_threshold(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert run_cli("analyze", ND / "trace-AR.parquet", "--healthy-threshold", "2.0", "--json", out, "-q") == 0
    import json

    assert json.loads(out.read_text())["verdict"] == "healthy"
    assert run_cli("analyze", ND / "trace-AR.parquet", "--healthy-threshold", "0.9", "-q") == 2
    assert "--healthy-threshold must be a number >= 1" in capsys.readouterr().err
