"""`laggard.whatif.diff`: B replayed with A's durations part by part. A real trace (the published ST
trace, converted to the native format) against copies of it whose Parquet shards were edited with
pyarrow: one op type on one stage, one op type on one rank, both; and jobs of different DP sizes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from laggard.errors import LaggardError
from laggard.io import load_job
from laggard.whatif.custom import custom_whatif, parse_changes
from laggard.whatif.diff import DiffConfig, diff
from tests.conftest import DATA, ND

KEYS = {"a", "b", "change", "delta_s", "T_b_as_a_s", "grain", "within_noise", "contributions", "shares_sum",
        "not_compared", "notes", "layout_mismatch", "warnings"}
CONTRIBUTION_KEYS = {"selector", "what", "share", "alone", "delta_s", "num_ops", "changes", "command",
                     "duration_change"}


def slowed(src: Path, dst: Path, edits: list[tuple[str, str, int, float]]) -> Path:
    """A copy of the native trace ``src`` whose ops named NAME with COLUMN == VALUE take FACTOR x as long."""
    shutil.copytree(src, dst)
    for shard in dst.glob("*.parquet"):
        t = pq.read_table(shard)
        dur = pc.cast(t["dur_ns"], pa.float64())
        for name, column, value, factor in edits:
            sel = pc.and_(pc.equal(t[column], value), pc.equal(pc.cast(t["name"], pa.string()), name))
            dur = pc.if_else(sel, pc.multiply(dur, factor), dur)
        t = t.set_column(t.schema.get_field_index("dur_ns"), "dur_ns", pc.cast(pc.round(dur), pa.int64()))
        pq.write_table(t, shard)
    return dst


@pytest.fixture(scope="module")
def native_st(tmp_path_factory) -> Path:
    from laggard.optable.ops import write_native

    out = tmp_path_factory.mktemp("st") / "a"
    write_native(load_job(ND / "trace-ST.parquet"), out)
    return out


def _check_sums(res) -> dict:
    d = res.to_json()
    assert set(d) == KEYS
    for c in d["contributions"]:
        assert set(c) == CONTRIBUTION_KEYS
    assert sum(c.share for c in res.contributions) == pytest.approx(1.0, abs=1e-9)
    assert d["shares_sum"] == pytest.approx(1.0, abs=1e-9)
    shares = [c.share for c in res.contributions]
    assert shares == sorted(shares, reverse=True)
    assert d["change"] == pytest.approx(res.b.T_s / res.a.T_s - 1)
    return d


def test_one_op_type_on_one_stage(native_st, tmp_path):
    b = slowed(native_st, tmp_path / "b", [("backward-compute", "pp_rank", 1, 1.5)])
    res = diff(load_job(native_st), load_job(b))
    d = _check_sums(res)
    assert res.change > 0.02 and res.grain == "rank" and not res.notes and not res.not_compared
    top = d["contributions"][0]
    assert top["selector"] == "optype=backward-compute,stage=1"
    assert top["share"] == pytest.approx(1.0, abs=0.02)
    assert all(abs(c["share"]) < 0.02 for c in d["contributions"][1:])
    assert top["duration_change"] == pytest.approx(0.5, abs=1e-3)  # the edit: 1.5x
    # B with A's durations everywhere is A again (only durations changed)
    assert res.T_b_as_a_s == pytest.approx(res.a.T_s, rel=1e-4)


def test_stage_and_rank_together_and_the_commands_replay_them(native_st, tmp_path):
    b = slowed(native_st, tmp_path / "b", [("backward-compute", "pp_rank", 1, 1.5),
                                           ("forward-compute", "rank", 5, 1.4)])
    job_b = load_job(b)
    res = diff(load_job(native_st), job_b)
    d = _check_sums(res)
    named = {c["selector"]: c for c in d["contributions"] if abs(c["share"]) > 0.02}
    assert set(named) == {"optype=backward-compute,stage=1", "optype=forward-compute,rank=5"}
    assert sum(c["share"] for c in named.values()) == pytest.approx(1.0, abs=0.01)
    assert d["contributions"][0]["selector"] == "optype=backward-compute,stage=1"
    # each part's command (on B alone) removes what its 'alone' says
    for c in res.contributions[:2]:
        flags = c.changes
        scales = [flags[i + 1] for i in range(0, len(flags), 2)]
        w = custom_whatif(job_b, parse_changes([], [], scales), gap_share=0.0)
        assert (w.T_s - w.T_new_s) / res.delta_s == pytest.approx(c.alone, abs=1e-3)
        assert c.command is not None and c.command.startswith(f"laggard whatif {b}") and "--gap-share 0" in c.command


def test_same_run_no_change(native_st):
    res = diff(load_job(native_st), load_job(native_st))
    assert res.change == 0 and res.contributions == [] and res.within_noise


def test_dp_sizes_differ_compared_per_stage():
    from laggard.groundtruth.inject import parse_injection
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

    a = synthesize_with_truth(SynthConfig(dp=2, pp=2, microbatches=4, steps=6, seed=3), []).job
    b = synthesize_with_truth(SynthConfig(dp=4, pp=2, microbatches=4, steps=6, seed=4),
                              [parse_injection("heavy-stage:stage=1,factor=1.5")]).job
    res = diff(a, b)
    d = _check_sums(res)
    assert res.grain == "stage" and "layouts differ" in res.notes[0]
    stage1 = [c for c in d["contributions"] if c["selector"] and c["selector"].endswith(",stage=1")]
    assert {c["selector"].split(",")[0] for c in stage1} == {"optype=forward-compute", "optype=backward-compute"}
    assert sum(c["share"] for c in stage1) == pytest.approx(1.0, abs=0.05)


def test_stage_counts_differ_compared_per_op_type():
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

    a = synthesize_with_truth(SynthConfig(dp=2, pp=2, microbatches=4, steps=4, seed=1), []).job
    b = synthesize_with_truth(SynthConfig(dp=2, pp=4, microbatches=4, steps=4, seed=2), []).job
    res = diff(a, b)
    _check_sums(res)
    assert res.grain == "optype" and "pipelines differ" in res.notes[0]
    assert all(c.selector is None or "stage=" not in c.selector for c in res.contributions)


def test_real_profiler_runs():
    """Two real 4-rank DDP runs: B's rank 2 does extra matrix products where A's slept 30 ms untraced."""
    kin = DATA / "kineto"
    res = diff(load_job(kin / "ddp_host_stall_a"), load_job(kin / "ddp_gloo"))
    d = _check_sums(res)
    assert res.change > 0.2
    top, bottom = d["contributions"][0], d["contributions"][-1]
    # the extra products run after the backward: CPU ranks' segments are named by phase, and work after
    # a step's last backward is the optimizer's
    assert top["selector"] == "optype=cpu-optimizer,rank=2"
    assert bottom["selector"].startswith("optype=host:") and bottom["selector"].endswith(",rank=2")
    assert res.not_compared  # op types one run has and the other lacks are listed


def test_nothing_in_common_is_one_error():
    with pytest.raises(LaggardError, match="no op type in common"):
        diff(load_job(DATA / "kineto" / "ddp_gloo"), load_job(ND / "trace-ST.parquet"))


def test_config_checked():
    with pytest.raises(LaggardError, match="max_parts"):
        DiffConfig(max_parts=0)


def test_a_slow_link_is_named_as_the_link(native_st, tmp_path):
    """Rank 4's sends (to rank 6, its next stage) 3x as long: the part is that link."""
    b = slowed(native_st, tmp_path / "b", [("forward-send", "rank", 4, 3.0)])
    res = diff(load_job(native_st), load_job(b))
    _check_sums(res)
    top = res.contributions[0]
    assert top.selector == "optype=forward-send,rank=4,peer=6" and top.what == "forward-send on link 4 -> 6"
    assert top.share == pytest.approx(1.0, abs=0.02)


def renamed(src: Path, dst: Path, keep: str) -> Path:
    """A copy of the native trace ``src`` whose op types other than ``keep`` are renamed: the same layout,
    another job's code."""
    shutil.copytree(src, dst)
    for shard in dst.glob("*.parquet"):
        t = pq.read_table(shard)
        name = pc.cast(t["name"], pa.string())
        new = pc.if_else(pc.equal(name, keep), name, pc.binary_join_element_wise("other-", name, ""))
        t = t.set_column(t.schema.get_field_index("name"), "name", pc.cast(new, t.schema.field("name").type))
        pq.write_table(t, shard)
    return dst


def test_unlike_layouts_are_warned_and_the_structure_is_in_the_headline():
    """Two unrelated jobs (the published AR and ST traces): the result says what differs, and the
    headline states the large share no duration carries beside the warning."""
    from laggard.report.diff import headline
    from laggard.report.page import pct

    res = diff(load_job(ND / "trace-AR.parquet"), load_job(ND / "trace-ST.parquet"))
    d = _check_sums(res)
    assert d["layout_mismatch"] == ["ranks", "dp", "tp"]
    warning = "A is dp 4 x pp 4 x tp 4 (16 ranks), B is dp 2 x pp 4 (8 ranks): the attribution compares unlike jobs"
    assert res.layout_warning == warning and d["warnings"][0] == warning
    rest = res.structure
    assert rest is not None and rest.share > 0.5 and res.structure_large
    assert d["warnings"][1].startswith(f"{100 * rest.share:.1f}% of the change (")
    text = headline(res)
    assert text.startswith(f"B is {pct(abs(res.change))} faster than A: {pct(abs(res.change) * rest.share)} not from "
                           "durations (B's structure")
    assert text.endswith(f"Warning: {warning}")
    # what one job lacks of the other: one line per family of per-pass types, the most ops first,
    # and the terminal lists the first few
    nc = res.not_compared
    assert nc[0].startswith("host:backward-compute[*] (28 types): only in A (19,712 ops)"), nc[:3]
    counts = [int(x.rsplit("(", 1)[1].split()[0].replace(",", "")) for x in nc if x.endswith(" ops)")]
    assert counts == sorted(counts, reverse=True) and len(nc) < 60, nc
    import io

    from rich.console import Console

    from laggard.report.diff import NOT_COMPARED_SHOWN, print_diff

    buf = io.StringIO()
    print_diff(res, console=Console(file=buf, width=100000))
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("not compared: "))
    shown = min(len(nc), NOT_COMPARED_SHOWN)
    assert line == "not compared: " + "; ".join(nc[:shown]) + (
        f"; and {len(nc) - shown} more (--json lists every one)" if len(nc) > shown else ""), line
    assert len(line) < 400, line  # grouped: no page of per-pass types
    import dataclasses

    many = dataclasses.replace(res, not_compared=[f"t{i}: only in A ({100 - i} ops)" for i in range(12)])
    buf = io.StringIO()
    print_diff(many, console=Console(file=buf, width=100000))
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("not compared: "))
    assert line.endswith(f"t{NOT_COMPARED_SHOWN - 1}: only in A ({101 - NOT_COMPARED_SHOWN} ops); "
                         f"and {12 - NOT_COMPARED_SHOWN} more (--json lists every one)"), line


def test_same_layout_no_warning(native_st, tmp_path):
    from laggard.report.diff import headline

    b = slowed(native_st, tmp_path / "b", [("backward-compute", "pp_rank", 1, 1.5)])
    res = diff(load_job(native_st), load_job(b))
    d = _check_sums(res)
    assert res.change > 0.02 and d["layout_mismatch"] == [] and d["warnings"] == [] and res.layout_warning is None
    assert not res.structure_large and "Warning" not in headline(res) and "not from durations" not in headline(res)


def test_op_types_largely_disjoint_are_warned(native_st, tmp_path):
    res = diff(load_job(native_st), load_job(renamed(native_st, tmp_path / "b", keep="forward-compute")))
    d = res.to_json()
    assert d["layout_mismatch"] == ["op types"]
    assert d["warnings"][0].startswith("only 1 of their ") and "op types are in both runs" in d["warnings"][0]
    assert "A is" not in d["warnings"][0]


def test_op_counts_are_the_traced_ops_as_analyze_counts_them():
    """A job with a host stall: analyze models the big gaps as host ops, diff every gap; both count the
    traced ops."""
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.inject import parse_injection
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

    job = synthesize_with_truth(SynthConfig(dp=2, pp=2, microbatches=4, steps=6, seed=5),
                                [parse_injection("host-stall:rank=1,ms=50,every=2")]).job
    res = analyze(job)
    assert res.base is not None and res.base.gaps.num_ops > 0  # host ops were added
    d = diff(job, job)
    assert res.num_ops == d.a.num_ops == d.b.num_ops == job.num_ops
