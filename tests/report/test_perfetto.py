"""Chrome trace-event / Perfetto export (laggard.report.perfetto)."""

from __future__ import annotations

import gzip
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from laggard.errors import LaggardError, LaggardWarning
from laggard.report.perfetto import trace_events, write_perfetto
from laggard.results.analysis import Analysis


@pytest.fixture(scope="module")
def ar_trace(ar: Analysis, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("perfetto") / "trace.json"
    assert write_perfetto(ar, out) == out
    return orjson.loads(out.read_bytes())


def op_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "step"]


def names(trace: dict[str, Any], kind: str) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == kind}


def test_counts_pids_and_metadata(ar: Analysis, ar_trace: dict[str, Any]) -> None:
    ops = op_events(ar_trace)
    assert len(ops) == 2 * ar.num_ops
    w = ar.num_workers
    assert {e["pid"] for e in ops} == set(range(1, 2 * w + 1))
    procs = names(ar_trace, "process_name")
    assert len(procs) == 2 * w
    labels = set(procs.values())
    assert "measured dp0/pp0 (rank 0)" in labels and "ideal dp0/pp0 (rank 0)" in labels
    assert "measured dp1/pp0 (rank 4)" in labels
    threads = names(ar_trace, "thread_name")
    streams = set(ar.base.job.codes("stream")[1])
    assert set(threads.values()) == streams | {"steps"}
    assert all((e["pid"], e["tid"]) in threads for e in ops)
    # thread ids are never 0 and never shared between processes (viewers key threads by tid)
    owner: dict[int, int] = {}
    for e in ar_trace["traceEvents"]:
        assert e["tid"] != 0
        assert owner.setdefault(e["tid"], e["pid"]) == e["pid"]
    assert all(e["dur"] >= 0 for e in ar_trace["traceEvents"] if e["ph"] == "X")
    steps = [e for e in ar_trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert len(steps) == 2 * w * len(ar.steps)
    assert ar_trace["otherData"]["generator"] == "laggard"


def test_measured_events_match_the_op_table(ar: Analysis, ar_trace: dict[str, Any]) -> None:
    job = ar.base.job
    start = job.column("start_ns")
    start = start - start.min()
    end = start + job.column("dur_ns")
    row = {int(o): i for i, o in enumerate(job.column("op_id").tolist())}
    names_ = np.array(ar.base.names, dtype=object)[ar.base.name_code]
    meas = [e for e in op_events(ar_trace) if e["pid"] <= ar.num_workers]
    assert len(meas) == ar.num_ops
    trimmed = 0
    for e in meas:
        i = row[e["args"]["op_id"]]
        trim = round(e["args"].get("trimmed_us", 0.0) * 1e3)
        trimmed += trim > 0
        assert round(e["ts"] * 1e3) - trim == start[i]
        assert round((e["ts"] + e["dur"]) * 1e3) == end[i]
        assert e["name"] == names_[i]
        assert e["args"]["step"] == int(job.column("step")[i])
        mb = int(job.column("microbatch")[i])
        assert e["args"]["microbatch"] == (mb if mb >= 0 else None)
    # traced ops that overlap on one stream are few and only by timer jitter
    assert trimmed < 0.05 * ar.num_ops
    assert max(e["args"].get("trimmed_us", 0.0) for e in meas) < 1000


def test_ideal_timeline_is_continuous(ar: Analysis, ar_trace: dict[str, Any]) -> None:
    w = ar.num_workers
    ideal = [e for e in op_events(ar_trace) if e["pid"] > w]
    end = max(e["ts"] + e["dur"] for e in ideal)
    assert end == pytest.approx(sum(ar.step_ideal_s) * 1e6, rel=1e-9)
    spans = [e for e in ar_trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "step" and e["pid"] > w]
    offsets = np.concatenate([[0.0], np.cumsum(ar.step_ideal_s)[:-1]]) * 1e6
    first = {}
    for e in spans:
        k = ar.steps.index(e["args"]["step"])
        first[k] = min(first.get(k, np.inf), e["ts"])
    got = np.array([first[k] for k in range(len(ar.steps))])
    assert np.all(got >= offsets - 1e-3)
    assert np.all(got < offsets + np.array(ar.step_ideal_s) * 1e6)
    # a compute op with no communication group lasts exactly its ideal duration
    b = ar.base
    row = {int(o): i for i, o in enumerate(b.job.column("op_id").tolist())}
    compute = [e for e in ideal if e["cat"] == "compute"]
    assert compute
    for e in compute[:2000]:
        i = row[e["args"]["op_id"]]
        if b.graph.op_group[i] < 0:
            assert e["dur"] == pytest.approx(b.ideal[i] * 1e6, abs=2e-3)


def test_events_nest_on_every_thread(st: Analysis) -> None:
    trace = trace_events(st, timelines=("measured", "replayed", "ideal"))
    by_thread: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)))
    assert len({p for p, _ in by_thread}) == 3 * st.num_workers
    for spans in by_thread.values():
        spans.sort(key=lambda x: (x[0], -x[1]))
        stack: list[int] = []
        for s, e in spans:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1], "overlapping events that do not nest"
            stack.append(e)


def test_cap_keeps_whole_steps_around_the_worst(st: Analysis, tmp_path: Path) -> None:
    per_op_step = st.base.graph.op_step
    worst = max(st.per_step, key=st.per_step.get)
    with pytest.warns(LaggardWarning, match=f"exceed the cap of 2,000.*around step {worst},"):
        out = write_perfetto(st, tmp_path / "capped.json", max_events=2000)
    ops = op_events(orjson.loads(out.read_bytes()))
    kept = sorted({e["args"]["step"] for e in ops})
    k = len(kept)
    assert 0 < k < len(st.steps)
    i = st.steps.index(kept[0])
    assert kept == st.steps[i : i + k] and worst in kept  # a run of steps with the worst one in it
    idx = [st.steps.index(s) for s in kept]
    assert len(ops) == 2 * int(np.isin(per_op_step, idx).sum())


def test_step_window() -> None:
    from laggard.report.perfetto import step_window

    ev = np.array([5, 5, 5, 5, 5])
    assert step_window(ev, 15, 2) == (1, 4)  # one later, one earlier
    assert step_window(ev, 15, 4) == (2, 5)  # at the end: grows the other way
    assert step_window(ev, 3, 1) == (1, 2)  # the worst step even over the budget
    assert step_window(np.array([1, 9, 2, 1]), 5, 2) == (2, 4)  # a big neighbour stops that side
    assert step_window(np.zeros(0, dtype=int), 10, 0) == (0, 0)


def test_gzip_and_replayed(st: Analysis, tmp_path: Path) -> None:
    out = write_perfetto(st, tmp_path / "t.json.gz", timelines=("measured", "replayed", "ideal"))
    trace = orjson.loads(gzip.decompress(out.read_bytes()))
    assert len(op_events(trace)) == 3 * st.num_ops
    assert any(v.startswith("replayed ") for v in names(trace, "process_name").values())


def test_errors(st: Analysis, unwritable_dir: Path) -> None:
    with pytest.raises(LaggardError, match="cannot write") as e:
        write_perfetto(st, unwritable_dir / "t.json")
    assert "\n" not in str(e.value)
    with pytest.raises(LaggardError, match="unknown timeline"):
        trace_events(st, timelines=("nope",))
