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
    assert "skipped 5 op(s) of unknown type(s) 'mystery-op'" in err
    assert d["num_steps"] == 32 and any("mystery-op" in w for w in d["warnings"])


@pytest.mark.parametrize("bad", [np.nan, -0.5])
def test_nan_or_negative_duration_skips_the_step(capsys, tmp_path, bad):
    def poison(t):
        first = t.step.min()
        t.loc[t.index[t.step == first][3], "duration"] = bad
        return t

    d, err = _analyze_ok(capsys, tmp_path, _write_variant(tmp_path, poison))
    assert "skipped 1 step(s)" in err and ("NaN" in err or "negative" in err)
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
    from laggard.ops import Job, write_native

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
    from laggard.ops import make_table

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


def test_native_missing_rank_is_reported(capsys, tmp_path):
    from laggard.ops import Job, write_native
    from laggard.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=2, pp=2, steps=3))
    keep = job.column("rank") != 2
    write_native(Job(table=job.table.filter(pa.array(keep)), meta=job.meta), tmp_path / "nat")
    code = run_cli("analyze", tmp_path / "nat", "--json", tmp_path / "a.json", "-q")
    err = capsys.readouterr().err
    assert "1 of 4 ranks have no ops (ranks 2)" in err and "Traceback" not in err
    assert code in (0, 2)
