"""``laggard fit-cost`` and ``laggard partition``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from laggard.optable.ops import Job, JobMeta, make_table, write_native
from tests.conftest import ND, run_cli

pytestmark = pytest.mark.timeout(120)

A, B, C0 = 2e-9, 3e-6, 1e-3


@pytest.fixture(scope="module")
def token_trace(tmp_path_factory):
    """Forward and backward compute ops whose durations follow a known cost model, with seq_lens."""
    rng = np.random.default_rng(0)
    n = 120
    seqs = [rng.integers(16, 4096, rng.integers(1, 8)) for _ in range(n)]
    fwd = np.array([A * (s.astype(float) ** 2).sum() + B * s.sum() + C0 for s in seqs])
    dur = np.stack([fwd, 2 * fwd], axis=1).ravel() * rng.lognormal(0, 0.005, 2 * n)
    cols = {
        "rank": np.zeros(2 * n, dtype=np.int64), "step": np.repeat(np.arange(n) // 10, 2),
        "microbatch": np.repeat(np.arange(n) % 10, 2), "name": ["forward-compute", "backward-compute"] * n,
        "kind": ["compute"] * (2 * n), "start_ns": np.arange(2 * n) * 10**7,
        "dur_ns": np.round(dur * 1e9).astype(np.int64),
        "seq_lens": [s.tolist() for s in seqs for _ in range(2)],
        "num_tokens": np.repeat([int(s.sum()) for s in seqs], 2),
    }
    out = tmp_path_factory.mktemp("tok") / "trace"
    write_native(Job(table=make_table(cols), meta=JobMeta(name="tokens")), out)
    return out


def test_fit_cost_recovers_the_model(token_trace, tmp_path, capsys):
    out = tmp_path / "fit.json"
    assert run_cli("fit-cost", token_trace, "--json", out) == 0
    d = json.loads(out.read_text())
    f = d["fits"]["forward-compute"]
    assert f["a"] == pytest.approx(A, rel=0.05) and f["b"] == pytest.approx(B, rel=0.05)
    assert f["r2"] > 0.99 and f["num_samples"] == 120
    assert d["fits"]["backward-compute"]["a"] == pytest.approx(2 * A, rel=0.05)
    mb = d["fits"]["microbatch (all compute ops)"]
    assert mb["a"] == pytest.approx(3 * A, rel=0.05) and mb["c0"] == pytest.approx(3 * C0, rel=0.2)
    capsys.readouterr()
    assert run_cli("fit-cost", token_trace, "--optype", "forward-compute") == 0
    text = capsys.readouterr().out
    assert "forward-compute" in text and "backward-compute" not in text and "R^2" in text


def test_fit_cost_without_metadata_is_a_one_line_error(capsys):
    assert run_cli("fit-cost", ND / "trace-ST.parquet") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("laggard: error:") and "token metadata" in err and "\n" not in err


def test_fit_cost_unknown_optype(token_trace, capsys):
    assert run_cli("fit-cost", token_trace, "--optype", "nope") == 2
    assert "no such op type" in capsys.readouterr().err


def test_partition_heavy_last_stage(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert run_cli("partition", ND / "trace-ST.parquet", "--num-layers", "32", "--json", out) == 0
    d = json.loads(out.read_text())
    assert d["current"]["counts"] == [9, 8, 8, 9]
    prop = d["proposed"]
    assert sum(prop["counts"]) == 34 and prop["counts"][-1] < 9  # layers move off the heavy last stage
    assert prop["max_cost"] < d["current"]["max_cost"]
    assert prop["layout"].startswith("E") and prop["layout"].endswith("L")
    w = d["whatif"]
    assert w["speedup"] > 1.05 and w["T_new_s"] < w["T_s"]
    assert run_cli("partition", ND / "trace-ST.parquet", "--layers-per-stage", "8,8,8,8") == 0
    text = capsys.readouterr().out
    assert "--pipeline-model-parallel-layout" in text and "speed-up" in text
    assert run_cli("partition", ND / "trace-ST.parquet", "--num-layers", "32", "--stages", "8") == 0
    assert "no replay" in capsys.readouterr().out


def test_partition_balanced_job_keeps_its_step_time(tmp_path):
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=1, pp=4, microbatches=4, steps=2, jitter=0.0))
    write_native(job, tmp_path / "even")
    out = tmp_path / "p.json"
    assert run_cli("partition", tmp_path / "even", "--num-layers", "16", "--no-embedding", "--no-loss",
                   "--json", out) == 0
    d = json.loads(out.read_text())
    assert d["proposed"]["counts"] == [4, 4, 4, 4]
    assert d["whatif"]["speedup"] == pytest.approx(1.0, abs=1e-6)


def test_partition_errors(capsys):
    assert run_cli("partition", ND / "trace-ST.parquet") == 2
    assert "--num-layers" in capsys.readouterr().err
    assert run_cli("partition", ND / "trace-ST.parquet", "--layers-per-stage", "8,8") == 2
    assert "trace has 4" in capsys.readouterr().err
    assert run_cli("partition", ND / "trace-ST.parquet", "--num-layers", "2") == 2
    assert run_cli("partition", ND / "trace-ST.parquet", "--num-layers", "32", "--stages", "99") == 2


def test_a_fit_that_explains_nothing_is_said(tmp_path, capsys):
    """Durations that do not follow the lengths: the fit comes with R^2 ~ 0 and a warning, not silently."""
    rng = np.random.default_rng(1)
    n = 120
    seqs = [rng.integers(16, 4096, rng.integers(1, 8)) for _ in range(n)]
    cols = {
        "rank": np.zeros(n, dtype=np.int64), "step": np.arange(n) // 10, "microbatch": np.arange(n) % 10,
        "name": ["forward-compute"] * n, "kind": ["compute"] * n, "start_ns": np.arange(n) * 10**7,
        "dur_ns": rng.integers(10**6, 2 * 10**6, n), "seq_lens": [s.tolist() for s in seqs],
        "num_tokens": [int(s.sum()) for s in seqs],
    }
    out = tmp_path / "trace"
    write_native(Job(table=make_table(cols), meta=JobMeta(name="noise")), out)
    assert run_cli("fit-cost", out, "--json", tmp_path / "f.json") == 0
    fit = json.loads((tmp_path / "f.json").read_text())["fits"]["forward-compute"]
    assert fit["r2"] < 0.5 and fit["reliable"] is False
    err = capsys.readouterr().err
    assert "forward-compute: R^2 = " in err and "do not plan a balance on this fit" in err


def test_a_good_fit_is_reliable(token_trace, tmp_path, capsys):
    assert run_cli("fit-cost", token_trace, "--json", tmp_path / "f.json") == 0
    assert json.loads((tmp_path / "f.json").read_text())["fits"]["forward-compute"]["reliable"] is True
    assert "R^2 = " not in capsys.readouterr().err


def test_partition_counts_read_like_the_layout(capsys):
    """The layers per stage printed are the layout string's decoder layers (t*K), not those plus the
    embedding and the loss (it printed [10, 10, 9, 5] beside 'Et*9|t*10|t*9|t*4,L')."""
    import re

    assert run_cli("partition", ND / "trace-ST.parquet", "--num-layers", "32") == 0
    out = capsys.readouterr().out
    for which in ("current", "proposed"):
        line = next(ln for ln in out.splitlines() if ln.startswith(which + ":"))
        counts = json.loads(re.search(r"\[[\d, ]+\]", line).group(0))
        layout = re.search(r"layout '([^']+)'", line).group(1)
        assert counts == [int(k) for k in re.findall(r"t\*(\d+)", layout)], line
    assert "decoder layers per stage (plus the embedding on the first stage and the output+loss on the last)" in out


def test_stage_finding_says_its_gain_is_the_continuous_bound(tmp_path):
    assert run_cli("analyze", ND / "trace-ST.parquet", "--json", tmp_path / "a.json", "-q") == 0
    f = json.loads((tmp_path / "a.json").read_text())["findings"][0]
    assert f["cause"] == "stage-imbalance" and "bound of a continuous split" in f["fix"], f["fix"]
