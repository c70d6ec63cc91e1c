"""Bad input: one clear line and exit 2, or analysis with a warning naming what was skipped."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import ND, run_cli

ST = ND / "trace-ST.parquet"


def _one_line_error(capsys, *args) -> str:
    code = run_cli(*args)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("laggard: error: ")
    return lines[0]


def _write_variant(tmp_path, fn, name="trace-X.parquet", meta=True):
    t = pq.read_table(ST).to_pandas()
    t = fn(t)
    out = tmp_path / name
    pq.write_table(pa.Table.from_pandas(t, preserve_index=False), out)
    if meta:
        shutil.copy(ND / "meta-ST.yaml", tmp_path / name.replace("trace-", "meta-").replace(".parquet", ".yaml"))
    return out


def _analyze_ok(capsys, tmp_path, path, *extra):
    out = tmp_path / "r.json"
    code = run_cli("analyze", path, "--json", out, "-q", *extra)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err
    return json.loads(out.read_text()), err


def test_missing_file(capsys):
    assert "no such file" in _one_line_error(capsys, "analyze", "/nonexistent/trace.parquet")


def test_empty_file(capsys, tmp_path):
    p = tmp_path / "trace-E.parquet"
    p.write_bytes(b"")
    assert "empty file" in _one_line_error(capsys, "analyze", p)


def test_corrupt_and_truncated_parquet(capsys, tmp_path):
    p = tmp_path / "trace-C.parquet"
    p.write_bytes(b"PAR1 this is not parquet at all" * 10)
    assert "not a readable Parquet file" in _one_line_error(capsys, "analyze", p)
    q = tmp_path / "trace-T.parquet"
    q.write_bytes(ST.read_bytes()[: ST.stat().st_size // 2])
    assert "not a readable Parquet file" in _one_line_error(capsys, "analyze", q)


def test_zero_rows(capsys, tmp_path):
    p = _write_variant(tmp_path, lambda t: t.iloc[:0])
    assert "no ops" in _one_line_error(capsys, "analyze", p)


def test_missing_column(capsys, tmp_path):
    p = _write_variant(tmp_path, lambda t: t.drop(columns=["duration"]))
    assert "missing column(s) duration" in _one_line_error(capsys, "analyze", p)


def test_unknown_op_type_is_skipped_with_warning(capsys, tmp_path):
    def add_unknown(t):
        extra = t.iloc[:5].copy()
        extra["optype"] = extra["optype"].cat.add_categories(["mystery-op"])
        extra["optype"] = "mystery-op"
        t["optype"] = t["optype"].cat.add_categories(["mystery-op"])
        return __import__("pandas").concat([t, extra], ignore_index=True)

    d, err = _analyze_ok(capsys, tmp_path, _write_variant(tmp_path, add_unknown))
    assert "skipped 5 of 6789 op(s) of unknown type(s) 'mystery-op' (5)" in err
    assert d["num_steps"] == 32 and any("mystery-op" in w for w in d["warnings"])


@pytest.mark.parametrize("bad", [np.nan, -0.5])
def test_nan_or_negative_duration_skips_the_step(capsys, tmp_path, bad):
    def poison(t):
        first = t.step.min()
        t.loc[t.index[t.step == first][3], "duration"] = bad
        return t

    d, err = _analyze_ok(capsys, tmp_path, _write_variant(tmp_path, poison))
    assert "skipped 1 of 32 step(s) with " in err and "(1 of 6784 op(s))" in err and ("NaN" in err or "negative" in err)
    assert d["num_steps"] == 31


def test_worker_missing_from_some_steps(capsys, tmp_path):
    def drop_worker(t):
        s = sorted(t.step.unique())[2]
        return t[~((t.step == s) & (t.dp_rank == 1) & (t.stage == 2))]

    d, err = _analyze_ok(capsys, tmp_path, _write_variant(tmp_path, drop_worker))
    assert "skipped 1 of 32 step(s)" in err and "dp1/pp2 has no ops" in err
    assert d["num_steps"] == 31


def test_collective_with_missing_participant(capsys, tmp_path):
    def drop_one(t):
        s = sorted(t.step.unique())[5]
        i = t.index[(t.step == s) & (t.dp_rank == 0) & (t.optype == "grads-reduce-scatter")][0]
        return t.drop(index=i)

    d, err = _analyze_ok(capsys, tmp_path, _write_variant(tmp_path, drop_one))
    assert "skipped 1 of 32 step(s)" in err
    assert d["num_steps"] == 31


def test_native_collective_with_missing_participant(capsys, tmp_path):
    from laggard.io import load_job
    from laggard.optable.ops import Job, write_native

    job = load_job(ST)
    name, labels = job.codes("name")
    step = job.column("step")
    victim = np.flatnonzero((name == labels.index("params-all-gather")) & (step == step[0]))[0]
    keep = np.ones(job.num_ops, dtype=bool)
    keep[victim] = False
    write_native(Job(table=job.table.filter(pa.array(keep)), meta=job.meta), tmp_path / "native")
    d, err = _analyze_ok(capsys, tmp_path, tmp_path / "native")
    assert "collectives missing participants" in err
    assert d["num_steps"] == 31


def test_meta_contradicts_trace(capsys, tmp_path):
    meta = yaml.safe_load((ND / "meta-ST.yaml").read_text())
    meta["dp_size"] = 8
    meta["world_size"] = 32
    m = tmp_path / "meta.yaml"
    m.write_text(yaml.safe_dump(meta))
    line = _one_line_error(capsys, "analyze", ST, "--meta", m)
    assert "dp_size=8" in line and "2 DP rank(s)" in line


def test_bad_meta_yaml(capsys, tmp_path):
    m = tmp_path / "meta.yaml"
    m.write_text("dp_size: [1, 2\n")
    assert "not valid YAML" in _one_line_error(capsys, "analyze", ST, "--meta", m)


def test_no_meta_warns_and_infers(capsys, tmp_path):
    p = _write_variant(tmp_path, lambda t: t, meta=False)
    d, err = _analyze_ok(capsys, tmp_path, p)
    assert "no meta-*.yaml" in err
    assert d["meta"]["dp"] == 2 and d["meta"]["pp"] == 4


def test_native_errors(capsys, tmp_path):
    d = tmp_path / "nat"
    d.mkdir()
    (d / "job.json").write_text("{not json")
    assert "not valid JSON" in _one_line_error(capsys, "analyze", d)
    (d / "job.json").write_text(json.dumps({"name": "x"}))
    assert "no *.parquet op shards" in _one_line_error(capsys, "analyze", d)
    pq.write_table(pa.table({"rank": [0], "step": [0]}), d / "ops-00000.parquet")
    assert "missing required column(s)" in _one_line_error(capsys, "analyze", d)
    (d / "job.json").write_text(json.dumps({"name": "x", "dp_size": 0}))
    assert "dp_size must be a positive integer" in _one_line_error(capsys, "analyze", d)


def test_native_unknown_kind(capsys, tmp_path):
    from laggard.optable.ops import make_table

    d = tmp_path / "nat"
    d.mkdir()
    (d / "job.json").write_text(json.dumps({"name": "x"}))
    t = make_table({"rank": [0], "step": [0], "name": ["a"], "kind": ["compute"], "start_ns": [0], "dur_ns": [5]})
    t = t.set_column(t.schema.get_field_index("kind"), "kind", pa.array(["teleport"]).dictionary_encode())
    pq.write_table(t, d / "ops-00000.parquet")
    assert "unknown op kind(s) ['teleport']" in _one_line_error(capsys, "analyze", d)


def test_wrong_flags(capsys):
    assert "No such option" in _one_line_error(capsys, "analyze", ST, "--bogus")
    assert "unknown format" in _one_line_error(capsys, "analyze", ST, "--format", "xml")
    assert "--steps" in _one_line_error(capsys, "analyze", ST, "--steps", "a-b")
    assert "none of these steps" in _one_line_error(capsys, "analyze", ST, "--steps", "99999")
    assert "not understood" in _one_line_error(capsys, "whatif", ST, "--fix", "colour=red")
    assert "factor" in _one_line_error(capsys, "whatif", ST, "--scale", "stage=1:fast")
    assert "matches no op" in _one_line_error(capsys, "whatif", ST, "--fix", "stage=9")
    assert "nothing to change" in _one_line_error(capsys, "whatif", ST)


def test_a_huge_step_range_is_clamped_not_built(tmp_path):
    """A range is compared with the trace's steps: ``0-100000000`` once built every number (a
    MemoryError traceback), and a bound past int64 was killed. Both now select every step, as no
    ``--steps`` does."""
    import json

    outs = {}
    for spec in (None, "0-100000000", "0-999999999999999999999", "-999999999999999999999-999999999999999999999"):
        steps = ["--steps", spec] if spec else []
        assert run_cli("analyze", ST, *steps, "--json", tmp_path / "a.json", "-q") == 0, spec
        outs[spec] = json.loads((tmp_path / "a.json").read_text())["slowdown"]
    assert len(set(outs.values())) == 1, outs
    assert run_cli("whatif", ST, "--steps", "0-100000000", "--fix", "stage=1", "--json", tmp_path / "w.json") == 0


def test_native_missing_rank_is_reported(capsys, tmp_path):
    from laggard.groundtruth.synth import SynthConfig, synthesize
    from laggard.optable.ops import Job, write_native

    job = synthesize(SynthConfig(dp=2, pp=2, steps=3))
    keep = job.column("rank") != 2
    write_native(Job(table=job.table.filter(pa.array(keep)), meta=job.meta), tmp_path / "nat")
    code = run_cli("analyze", tmp_path / "nat", "--json", tmp_path / "a.json", "-q")
    err = capsys.readouterr().err
    assert "1 of 4 ranks have no ops (ranks 2)" in err and "Traceback" not in err
    assert code in (0, 2)


# ---------------------------------------------------------------- messages that name what is wrong


def test_several_parquet_files_are_not_profiler_traces(capsys):
    line = _one_line_error(capsys, "analyze", ST, ND / "trace-AR.parquet")
    assert "several paths are read as per-rank PyTorch-profiler JSON traces" in line
    assert f"{ST} is not one" in line and "NDTimeline parquet is passed alone" in line
    assert "not valid JSON" not in line


def test_ndtimeline_worker_missing_from_every_step(capsys, tmp_path):
    p = _write_variant(tmp_path, lambda t: t[~((t.dp_rank == 1) & (t.stage == 2))])
    line = _one_line_error(capsys, "analyze", p)
    assert f"{p}: worker(s) dp1/pp2 have no ops in any of the 32 step(s)" in line
    assert "layout dp=2 x pp=4 from meta-X.yaml expects 8 workers (7 found)" in line


def test_profiler_pipeline_rank_missing_leaves_its_pipeline_out(capsys, tmp_path):
    """A stage's trace is missing: its pipeline cannot be replayed; the complete one is analyzed."""
    assert run_cli("dessim", tmp_path / "sim", "--dp", "2", "--pp", "4", "--steps", "2", "--kineto") == 0
    capsys.readouterr()
    (tmp_path / "sim" / "kineto" / "rank2.json").unlink()
    d, err = _analyze_ok(capsys, tmp_path, tmp_path / "sim" / "kineto")
    assert "the job has 8 ranks but 7 trace(s) were given: no trace for rank(s) 2" in err
    assert "traced rank(s) 0, 1, 3 share a pipeline with them" in err and "1->2" in err and "2->3" in err
    assert d["num_workers"] == 4 and sorted(d["by_stage"]) == ["0", "1", "2", "3"]
    assert sorted(d["meta"]["layout"]["ranks"]) == ["4", "5", "6", "7"]


def test_profiler_pipeline_rank_missing_without_a_complete_pipeline(capsys, tmp_path):
    assert run_cli("dessim", tmp_path / "sim", "--dp", "1", "--pp", "4", "--steps", "2", "--kineto") == 0
    capsys.readouterr()
    (tmp_path / "sim" / "kineto" / "rank2.json").unlink()
    line = _one_line_error(capsys, "analyze", tmp_path / "sim" / "kineto")
    assert "the job has 4 ranks but 3 trace(s) were given: no trace for rank(s) 2" in line
    assert "1->2" in line and "2->3" in line and "pass every rank's trace" in line


def test_profiler_dp_rank_missing_is_a_warning_naming_it(capsys, tmp_path):
    from tests.conftest import DATA

    for r in (0, 1, 3):
        shutil.copy(DATA / "kineto" / "ddp_gloo" / f"rank{r}.json.gz", tmp_path)
    d, err = _analyze_ok(capsys, tmp_path, tmp_path)
    assert "the job has 4 ranks but 3 trace(s) were given: no trace for rank(s) 2" in err
    assert d["num_workers"] == 3


def test_native_pipeline_rank_missing_is_named(capsys, tmp_path):
    assert run_cli("synth", "--dp", "2", "--pp", "4", "--steps", "3", "--out", tmp_path / "syn") == 0
    from laggard.io import load_job
    from laggard.optable.ops import Job, write_native

    job = load_job(tmp_path / "syn")
    write_native(Job(table=job.table.filter(pa.array(job.column("rank") != 5)), meta=job.meta), tmp_path / "nat")
    capsys.readouterr()
    code = run_cli("analyze", tmp_path / "nat", "-q")
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err
    assert "1 of 8 ranks have no ops (ranks 5)" in err


def _relabel_one_backward_per_step(t):
    t["optype"] = t["optype"].cat.add_categories(["mystery-op"])
    idx = t[t.optype == "backward-compute"].groupby("step", observed=True).head(1).index
    t.loc[idx, "optype"] = "mystery-op"
    return t


def test_unknown_op_type_in_every_step_names_it(capsys, tmp_path):
    line = _one_line_error(capsys, "analyze", _write_variant(tmp_path, _relabel_one_backward_per_step))
    assert "no complete step left to analyze: all 32 step(s) have ops that do not match" in line
    assert "skipped 32 of 6784 op(s) of unknown type(s) 'mystery-op' (32)" in line


def test_unknown_p2p_type_names_it(capsys, tmp_path):
    def rename(t):
        t["optype"] = t["optype"].cat.rename_categories({"forward-send": "fwd-send"})
        return t

    line = _one_line_error(capsys, "analyze", _write_variant(tmp_path, rename))
    assert "forward-send op(s)" in line and "unknown type(s) 'fwd-send' (768)" in line


def test_only_unknown_op_types(capsys, tmp_path):
    def rename(t):
        t["optype"] = t["optype"].cat.rename_categories(lambda c: f"x-{c}")
        return t

    line = _one_line_error(capsys, "analyze", _write_variant(tmp_path, rename))
    assert "no op of a known type: skipped 6784 of 6784 op(s)" in line and "'x-forward-compute'" in line


def test_nan_in_two_percent_of_ops_is_analyzed(capsys, tmp_path):
    def poison(t):
        rng = np.random.default_rng(0)
        t.loc[rng.random(len(t)) < 0.02, "duration"] = np.nan
        return t

    d, err = _analyze_ok(capsys, tmp_path, _write_variant(tmp_path, poison))
    assert "139 of 6784 op(s) have NaN/inf times, in 32 of 32 step(s)" in err
    assert "filled in the duration of 139 op(s) with the median of their worker and op type" in err
    assert d["num_steps"] == 32


def test_nan_everywhere_is_an_error_with_counts(capsys, tmp_path):
    def poison(t):
        t.loc[t.optype == "optimizer", "start_ts"] = np.nan
        return t

    line = _one_line_error(capsys, "analyze", _write_variant(tmp_path, poison))
    assert "no step left: 256 of 6784 op(s) have NaN/inf times, in 32 of 32 step(s)" in line
    assert "256 of them cannot be filled in" in line


def test_version(capsys) -> None:
    from importlib.metadata import version

    import laggard

    assert run_cli("--version") == 0
    out = capsys.readouterr().out.strip()
    assert out == f"laggard {version('laggard')}" and version("laggard") == laggard.__version__


def test_the_warning_count_says_where_the_warnings_are(capsys):
    """The summary's count of warnings said "(see above)", and the warnings came after it, on stderr."""
    kineto = ND.parent / "kineto" / "ddp_host_stall_a"
    assert run_cli("analyze", kineto) == 0
    out, err = capsys.readouterr()
    assert "warning(s) (printed on stderr once the command ends)" in out and "see above" not in out
    assert "laggard: warning:" in err


def test_a_missing_rank_is_in_the_headline(capsys, tmp_path):
    """A trace missing a rank was analyzed in full with the missing rank only in the last warning: the
    headline (the terminal's second line, the JSON's meta) now says which ranks the figures leave out."""
    from laggard.groundtruth.synth import SynthConfig, synthesize
    from laggard.optable.ops import Job, write_native
    from tests.conftest import DATA

    job = synthesize(SynthConfig(dp=4, pp=1, steps=4))
    write_native(Job(table=job.table.filter(pa.array(job.column("rank") != 2)), meta=job.meta), tmp_path / "nat")
    for r in (0, 1, 3):
        shutil.copy(DATA / "kineto" / "ddp_gloo" / f"rank{r}.json.gz", tmp_path / f"k{r}.json.gz")
    (tmp_path / "prof").mkdir()
    for r in (0, 1, 3):
        shutil.move(tmp_path / f"k{r}.json.gz", tmp_path / "prof" / f"rank{r}.json.gz")
    for trace in (tmp_path / "nat", tmp_path / "prof"):
        assert run_cli("analyze", trace, "--json", tmp_path / "a.json") == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[1].startswith("partial: 1 of 4 ranks not analyzed (rank(s) 2"), lines[:3]
        assert json.loads((tmp_path / "a.json").read_text())["meta"]["missing_ranks"] == {"ranks": [2], "of": 4}
    assert run_cli("analyze", DATA / "kineto" / "ddp_gloo", "--json", tmp_path / "a.json") == 0
    assert "partial:" not in capsys.readouterr().out
    assert "missing_ranks" not in json.loads((tmp_path / "a.json").read_text())["meta"]


def test_fit_cost_names_the_file_it_cannot_fit(capsys):
    """fit-cost on a trace without token metadata said what was missing but not of which file."""
    line = _one_line_error(capsys, "fit-cost", ND.parent / "kineto" / "ddp_gloo")
    assert line.startswith(f"laggard: error: {ND.parent / 'kineto' / 'ddp_gloo'}: no compute op carries token"), line


def test_a_ray_failure_names_laggards_flag():
    """Ray's own advice names its flag (--address); the line adds laggard's (--ray-address)."""
    from laggard.fleet.engines import ray_failure

    msg = ("Could not find any running Ray instance. Please specify the one to connect to by setting `--address` "
           "flag or `RAY_ADDRESS` environment variable.\nmore")
    line = ray_failure(None, msg)
    assert "\n" not in line and line.endswith("(laggard's flag for the cluster's address is --ray-address)"), line
    assert ray_failure("10.0.0.1:6379", "timed out") == "cannot start or reach Ray at 10.0.0.1:6379: timed out"
