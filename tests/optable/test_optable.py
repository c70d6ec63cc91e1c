"""The op table (laggard.optable.ops): its schema, the validation of tables read from disk
(``conform``), the job metadata, the native format's round trip and the ``--steps`` syntax."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laggard.errors import LaggardError
from laggard.io import load_job
from laggard.optable.ops import (
    COMM_KINDS,
    KINDS,
    OP_SCHEMA,
    Job,
    JobMeta,
    conform,
    make_table,
    parse_steps,
    select_steps,
    write_native,
)

WHERE = "shard-7.parquet"  # the "where" conform is told; every message must name it


def _raw(**override) -> pa.Table:
    """A minimal table as a producer might write it: only the required columns, plain Arrow types."""
    cols = {
        "rank": pa.array([0, 1, 0], pa.int64()),
        "step": pa.array([3, 3, 4], pa.int64()),
        "name": pa.array(["forward-compute", "forward-compute", "grads-reduce"]),
        "kind": pa.array(["compute", "compute", "collective"]),
        "start_ns": pa.array([0, 10, 20], pa.int64()),
        "dur_ns": pa.array([5, 6, 7], pa.int64()),
    }
    cols.update(override)
    return pa.table({k: v for k, v in cols.items() if v is not None})


def _error(table: pa.Table) -> str:
    with pytest.raises(LaggardError) as e:
        conform(table, WHERE)
    msg = str(e.value)
    assert WHERE in msg and "\n" not in msg, msg
    return msg


def _job(steps=(0, 0, 1, 1, 2, 5)) -> Job:
    """Two ranks, ops in ``steps``, with every optional column given (non-default values)."""
    n = len(steps)
    return Job(
        table=make_table({
            "rank": np.arange(n) % 2, "dp_rank": np.arange(n) % 2, "pp_rank": np.ones(n, dtype=int),
            "tp_rank": np.zeros(n, dtype=int), "step": np.array(steps), "microbatch": np.arange(n),
            "name": ["fwd", "send"] * (n // 2), "kind": ["compute", "p2p_send"] * (n // 2),
            "stream": ["s0", "s1"] * (n // 2), "start_ns": np.arange(n) * 100, "dur_ns": np.arange(n) + 1,
            "group": [None, "pp"] * (n // 2), "seq": [-1, 0] * (n // 2), "peer": [-1, 3] * (n // 2),
            "size_bytes": pa.array([None, 4096] * (n // 2), pa.int64()),
            "num_tokens": pa.array([512, None] * (n // 2), pa.int64()),
            "seq_lens": [[256, 256], None] * (n // 2), "deps": [[], None] * (n // 2),
        }),
        meta=JobMeta(name="tiny", dp_size=2, pp_size=2, source="native", extra={"note": "hand-built"}),
    )


# --- the schema ---------------------------------------------------------------------------------

def test_schema_columns_and_types():
    types = {f.name: f.type for f in OP_SCHEMA}
    for col in ("op_id", "step", "start_ns", "dur_ns", "seq"):
        assert types[col] == pa.int64(), col
    for col in ("rank", "dp_rank", "pp_rank", "tp_rank", "cp_rank", "vchunk", "microbatch", "peer"):
        assert types[col] == pa.int32(), col
    for col in ("name", "kind", "stream", "group"):
        assert pa.types.is_dictionary(types[col]) and types[col].value_type == pa.string(), col
    assert types["deps"] == pa.list_(pa.int64()) and types["seq_lens"] == pa.list_(pa.int32())
    nullable = {f.name for f in OP_SCHEMA if f.nullable}
    assert nullable == {"group", "size_bytes", "num_tokens", "seq_lens", "deps"}


def test_kinds():
    assert set(KINDS) == {"compute", "collective", "p2p_send", "p2p_recv", "other", "host"}
    assert COMM_KINDS == {"collective", "p2p_send", "p2p_recv"} and COMM_KINDS <= set(KINDS)


def test_make_table_fills_the_optional_columns():
    t = make_table({"rank": [2, 5], "step": [0, 0], "name": ["a", "b"], "kind": ["compute", "other"],
                    "start_ns": [0, 1], "dur_ns": [1, 1]})
    assert t.schema == OP_SCHEMA
    row = t.to_pylist()[1]
    assert row["op_id"] == 1 and row["dp_rank"] == 5  # dp_rank defaults to the rank
    assert (row["pp_rank"], row["tp_rank"], row["cp_rank"], row["vchunk"], row["microbatch"]) == (0, -1, -1, -1, -1)
    assert (row["stream"], row["group"], row["seq"], row["peer"]) == ("main", None, -1, -1)
    assert row["size_bytes"] is row["num_tokens"] is row["seq_lens"] is row["deps"] is None


def test_make_table_names_missing_columns():
    with pytest.raises(LaggardError, match=r"missing required column\(s\) kind, dur_ns"):
        make_table({"rank": [0], "step": [0], "name": ["a"], "start_ns": [0]})


# --- conform: what a table read from disk must satisfy -------------------------------------------

def test_conform_accepts_a_minimal_table():
    t = conform(_raw(), WHERE)
    assert t.schema == OP_SCHEMA
    assert t.column("dur_ns").to_pylist() == [5, 6, 7]
    assert t.column("kind").to_pylist() == ["compute", "compute", "collective"]
    assert t.column("dp_rank").to_pylist() == [0, 1, 0]


@pytest.mark.parametrize("drop", ["rank", "step", "name", "kind", "start_ns", "dur_ns"])
def test_conform_missing_required_column(drop):
    msg = _error(_raw(**{drop: None}))
    assert f"missing required column(s) {drop}" in msg


@pytest.mark.parametrize("column, values", [
    ("dur_ns", pa.array([5.0, 6.0, 7.0])),  # whole floats
    ("dur_ns", pa.array(["5", "6", "7"])),  # numeric strings
    ("dur_ns", pa.array([5, 6, 7], pa.int8())),
    ("rank", pa.array([0, 1, 0], pa.uint16())),
])
def test_conform_casts_what_can_be_cast(column, values):
    t = conform(_raw(**{column: values}), WHERE)
    assert t.schema.field(column).type == OP_SCHEMA.field(column).type
    assert t.column(column).to_pylist() == _raw().column(column).to_pylist()


@pytest.mark.parametrize("column, values, why", [
    ("dur_ns", pa.array([5.5, 6.0, 7.0]), "double"),  # would lose the fraction
    ("dur_ns", pa.array(["5", "six", "7"]), "string"),
    ("start_ns", pa.array([[0], [1], [2]]), "list"),
    ("rank", pa.array([0, 2**40, 1], pa.int64()), "int64"),  # does not fit int32
])
def test_conform_names_a_column_that_cannot_be_cast(column, values, why):
    msg = _error(_raw(**{column: values}))
    assert f"column {column} has type" in msg and why in msg
    assert f"expected {OP_SCHEMA.field(column).type}" in msg


def test_conform_nan_duration():
    msg = _error(_raw(dur_ns=pa.array([5.0, float("nan"), 7.0])))
    assert "column dur_ns" in msg and "nan" in msg


@pytest.mark.parametrize("column", ["dur_ns", "rank", "kind", "stream"])
def test_conform_null_in_a_non_nullable_column(column):
    values = _raw().column(column).to_pylist() if column != "stream" else ["s0", "s1", "s0"]
    values[1] = None
    msg = _error(_raw(**{column: pa.array(values)}))
    assert f"column {column} has 1 null value(s)" in msg


def test_conform_keeps_nulls_in_nullable_columns():
    t = conform(_raw(group=pa.array([None, "dp", None]), size_bytes=pa.array([None, 8, None])), WHERE)
    assert t.column("group").to_pylist() == [None, "dp", None]
    assert t.column("size_bytes").to_pylist() == [None, 8, None]


def test_conform_negative_duration():
    """The schema says dur_ns >= 0: a negative duration is one line naming the column and the op
    (loaded, it would fail only later, in the analysis, naming neither)."""
    msg = _error(_raw(dur_ns=pa.array([5, -6, 7])))
    assert "dur_ns" in msg and "1 negative" in msg and "step" in msg


def test_conform_unknown_kind():
    msg = _error(_raw(kind=pa.array(["compute", "allreduce", "compute"])))
    assert "unknown op kind(s) ['allreduce']" in msg
    assert all(k in msg for k in KINDS)  # says what is known


# --- JobMeta ------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("dp_size", 0), ("pp_size", -2), ("tp_size", True), ("vpp_size", 1.5),
                                          ("world_size", 0)])
def test_job_meta_rejects_non_positive_sizes(field, value):
    with pytest.raises(LaggardError, match=f"{field} must be a positive integer, got {value!r}"):
        JobMeta(**{field: value})


def test_job_meta_num_gpus():
    assert JobMeta(dp_size=2, pp_size=3, tp_size=4, ep_size=2).num_gpus == 48
    assert JobMeta(dp_size=2, pp_size=3, world_size=7).num_gpus == 7  # a declared world size wins


def test_job_meta_json():
    m = JobMeta(name="j", dp_size=4, pp_size=2, extra={"k": 1})
    assert JobMeta.from_json(json.loads(json.dumps(m.to_json()))) == m
    back = JobMeta.from_json({"dp_size": 2, "unknown_key": "kept"})
    assert back.dp_size == 2 and back.extra == {"unknown_key": "kept"}
    with pytest.raises(LaggardError, match="job.json: schema_version 99 is not supported"):
        JobMeta.from_json({"schema_version": 99})
    with pytest.raises(LaggardError, match="dp_size must be a positive integer, got '2'"):
        JobMeta.from_json({"dp_size": "2"})


# --- the native format -------------------------------------------------------------------------

def test_native_round_trip(tmp_path: Path):
    job = _job()
    write_native(job, tmp_path / "t")
    back = load_job(tmp_path / "t")
    assert back.table.schema == OP_SCHEMA
    assert back.table.to_pylist() == job.table.to_pylist()
    assert back.meta == job.meta
    assert load_job(tmp_path / "t" / "job.json").table.to_pylist() == job.table.to_pylist()


def test_native_round_trip_in_shards(tmp_path: Path):
    job = _job()
    write_native(job, tmp_path, rows_per_shard=4)
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == ["ops-00000.parquet", "ops-00001.parquet"]
    assert load_job(tmp_path).table.to_pylist() == job.table.to_pylist()
    # writing again replaces the shards: no stale rows from the earlier, longer write
    small = select_steps(job, "0")
    write_native(small, tmp_path, rows_per_shard=4)
    assert [p.name for p in tmp_path.glob("*.parquet")] == ["ops-00000.parquet"]
    assert load_job(tmp_path).table.to_pylist() == small.table.to_pylist()


def test_native_shard_is_checked_on_load(tmp_path: Path):
    write_native(_job(), tmp_path)
    shard = tmp_path / "ops-00000.parquet"
    pq.write_table(_raw(kind=pa.array(["compute", "compute", "bogus"])), shard)
    with pytest.raises(LaggardError, match=r"ops-00000\.parquet: unknown op kind\(s\) \['bogus'\]"):
        load_job(tmp_path)


def test_native_load_with_steps(tmp_path: Path):
    write_native(_job(), tmp_path)
    back = load_job(tmp_path, steps="1-2")
    assert sorted(set(back.table.column("step").to_pylist())) == [1, 2]


# --- --steps ----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, steps", [
    ("10-20,25", set(range(10, 21)) | {25}),
    ("7", {7}),
    ("3-3", {3}),
    (" 1 , 4-5 ", {1, 4, 5}),
    ("2,2,1-2", {1, 2}),
    ("-1", {-1}),  # a negative step number is a step number (select_steps then says it is absent)
    ("-3--1", {-3, -2, -1}),
])
def test_parse_steps(spec, steps):
    assert parse_steps(spec) == steps


@pytest.mark.parametrize("spec, bad", [("5-3", "'5-3'"), ("a", "'a'"), ("1,x-3", "'x-3'"), ("4-", "'4-'"),
                                       ("1.5", "'1.5'"), ("", "no step given"), (" , ", "no step given")])
def test_parse_steps_rejects(spec, bad):
    with pytest.raises(LaggardError) as e:
        parse_steps(spec)
    assert str(e.value).startswith("--steps") and bad in str(e.value)


def test_select_steps_keeps_exactly_those_steps():
    job = _job()
    job.warnings.append("earlier warning")
    out = select_steps(job, "1-2,5,9")  # 9 is not in the trace: ignored while others are
    steps = out.table.column("step").to_pylist()
    assert steps == [1, 1, 2, 5]
    kept = [r for r in job.table.to_pylist() if r["step"] in (1, 2, 5)]
    assert out.table.to_pylist() == kept  # whole rows, in their order
    assert out.meta is job.meta and out.warnings == ["earlier warning"]


@pytest.mark.parametrize("spec", ["7-8", "-1"])
def test_select_steps_none_present(spec):
    with pytest.raises(LaggardError) as e:
        select_steps(_job(), spec)
    msg = str(e.value)
    assert msg.startswith(f"--steps {spec}: none of these steps is in the trace")
    assert "4 steps, 0 to 5" in msg


def test_repr_is_one_short_line() -> None:
    from laggard.io import load_job
    from tests.conftest import ND

    text = repr(load_job(ND / "trace-AR.parquet"))
    assert "\n" not in text and len(text) < 200, text
    assert text.startswith("Job(name='AR', ops=117,216, ranks=64, dp=4, pp=4, tp=4, steps=44"), text
