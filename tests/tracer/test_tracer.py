"""The runtime tracer in one process: op table, exclusive times, GC, pages, failures, SIGTERM, clocks."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from laggard.errors import LaggardWarning
from laggard.io import load_job
from laggard.tracer import Tracer, check_trace
from laggard.tracer.clock import offset_from_pingpong, offsets_from_samples

pytestmark = pytest.mark.timeout(120)


def _rows(path: Path) -> list[dict]:
    job = load_job(path)
    return sorted(job.table.to_pylist(), key=lambda r: r["op_id"])


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_ops_steps_and_dependencies(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    with Tracer(out, name="t", dp_rank=0, pp_rank=0, record_gc=False) as t:
        for step in range(3):
            for batch in t.data([step]):  # a data wait inside the step
                assert batch == step
            with t.step(step):
                for m in range(2):
                    with t.op("forward-compute", microbatch=m, num_tokens=64, seq_lens=[40, 24]):
                        _spin(0.002)
                with t.op("optimizer"):
                    _spin(0.001)
                    with t.op("clip", kind="other"):  # nested: cut out of the optimizer op
                        _spin(0.03)
    rows = _rows(out)
    meta = json.loads((out / "job.json").read_text())
    assert meta["source"] == "laggard-tracer" and meta["world_size"] == 1 and meta["name"] == "t"
    assert [r["step"] for r in rows] == [0] * 5 + [1] * 5 + [2] * 5
    step0 = rows[:5]
    # the data wait recorded before step 1 belongs to step 1, first in the chain
    assert [r["name"] for r in rows[5:10]][0] == "data-wait"
    names = [r["name"] for r in step0]
    assert names == ["data-wait", "forward-compute", "forward-compute", "clip", "optimizer"]
    assert step0[0]["deps"] == [] and all(r["deps"] == [p["op_id"]] for p, r in zip(step0, step0[1:], strict=False))
    fwd = step0[1]
    assert fwd["kind"] == "compute" and fwd["microbatch"] == 0 and fwd["num_tokens"] == 64
    assert fwd["seq_lens"] == [40, 24] and fwd["stream"] == "main" and fwd["group"] is None
    clip, opt = step0[3], step0[4]
    # exclusive times: the optimizer's own ~1 ms, the clip's ~30 ms; together the wall time (a clip of
    # 3 ms once lost to an optimizer descheduled for 3 ms on CI's busy host)
    assert clip["dur_ns"] >= 29_000_000 and opt["dur_ns"] < clip["dur_ns"]
    assert opt["start_ns"] <= clip["start_ns"]
    assert rows[0]["start_ns"] > 1.6e18  # ns since the Unix epoch
    assert check_trace(out) == []
    state = json.loads((out / "rank0.state.json").read_text())
    assert state["status"] == "closed" and state["num_ops_written"] == 15


def test_gc_pause_is_its_own_op(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    t = Tracer(out)
    keep = [[i] for i in range(300_000)]  # a full collection has work to do
    with t.step(0):
        t0 = time.perf_counter_ns()
        with t.op("forward-compute"):
            _spin(0.002)
            cycles = [[] for _ in range(100)]
            for a, b in zip(cycles, cycles[1:], strict=False):
                a.append(b), b.append(a)
            del cycles
            gc.collect()
        wall = time.perf_counter_ns() - t0
    gc.disable()
    try:
        with t.step(1), t.op("forward-compute"):
            pass
    finally:
        gc.enable()
    t.close()
    del keep
    rows = _rows(out)
    # a step without a collection ends with a zero-length gc op: GC is a cost of every step
    assert [(r["name"], r["dur_ns"]) for r in rows if r["step"] == 1] == [("forward-compute", rows[-2]["dur_ns"]),
                                                                           ("gc", 0)]
    rows = [r for r in rows if r["step"] == 0]
    fwd = next(r for r in rows if r["name"] == "forward-compute")
    # (collections while building ``keep`` happened before the step: they join it, first)
    gcs = [r for r in rows if r["name"] == "gc" and r["start_ns"] >= fwd["start_ns"]]
    big = max(gcs, key=lambda r: r["dur_ns"])
    assert big["kind"] == "other" and big["dur_ns"] > 1_000_000
    # the pause is cut out of the op it interrupted: together they add up to the wall time
    total = fwd["dur_ns"] + sum(r["dur_ns"] for r in gcs)
    assert total <= wall and total > 0.9 * wall
    assert big["start_ns"] >= fwd["start_ns"] and fwd["deps"] == [gcs[-1]["op_id"]]


def test_pages_flush_in_the_background_and_chains_continue(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    t = Tracer(out, page_ops=16, num_pages=3, flush_interval_s=0.0, record_gc=False)
    for step in range(6):
        with t.step(step):
            for m in range(10):
                with t.op("forward-compute", microbatch=m):
                    pass
        time.sleep(0.05)  # the writer keeps up
    t.close()
    shards = sorted(out.glob("ops-rank0-*.parquet"))
    assert len(shards) >= 4
    rows = _rows(out)
    assert len(rows) == 60 and t.num_ops_dropped == 0
    by_id = {r["op_id"]: r for r in rows}
    for r in rows:  # every op but the first of its step waits for the previous one, across pages too
        if r["microbatch"] > 0:
            assert by_id[r["deps"][0]]["microbatch"] == r["microbatch"] - 1 and by_id[r["deps"][0]]["step"] == r["step"]
        else:
            assert r["deps"] == []


def test_a_slow_writer_drops_ops_and_never_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from laggard.tracer import _writer

    gate = threading.Event()
    real = _writer.ShardWriter.write_page

    def slow(self, page):  # noqa: ANN001, ANN202
        gate.wait(30)
        return real(self, page)

    monkeypatch.setattr(_writer.ShardWriter, "write_page", slow)
    out = tmp_path / "trace"
    t = Tracer(out, page_ops=16, num_pages=2, record_gc=False)
    t0 = time.perf_counter()
    with t.step(0):
        for _ in range(200):
            with t.op("forward-compute"):
                pass
    assert time.perf_counter() - t0 < 5  # the writer is stuck, the loop is not
    gate.set()
    with pytest.warns(LaggardWarning, match="dropped"):
        t.close()
    assert t.num_ops_dropped > 100 and t.num_ops_recorded + t.num_ops_dropped == 200
    assert any("dropped" in m for m in check_trace(out))


def test_unwritable_directory_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(LaggardWarning, match="tracing is disabled, training goes on") as rec:
        t = Tracer(blocker / "trace")
    assert len([w for w in rec if issubclass(w.category, LaggardWarning)]) == 1
    assert not t.enabled
    total = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing more is said
        for step in range(3):
            with t.step(step), t.op("forward-compute"):
                total += step
        t.close()
    assert total == 3


def test_full_disk_mid_run_disables_tracing_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    out = tmp_path / "trace"
    t = Tracer(out, page_ops=16, flush_interval_s=0.0)

    def full(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    with pytest.warns(LaggardWarning, match="No space left on device") as rec:
        for step in range(20):
            with t.step(step):
                for _ in range(20):
                    with t.op("forward-compute"):
                        pass
            time.sleep(0.01)
        t.close()
    assert len([w for w in rec if "No space" in str(w.message)]) == 1
    assert not t.enabled


_SIGTERM_SCRIPT = textwrap.dedent("""
    import sys, time
    from laggard.tracer import Tracer
    t = Tracer(sys.argv[1], flush_interval_s=1e6)   # nothing flushed before the signal
    step = 0
    while True:
        with t.step(step):
            for m in range(4):
                with t.op("forward-compute", microbatch=m):
                    time.sleep(0.001)
        step += 1
        if step == 5:
            print("ready", flush=True)
""")


def test_sigterm_flushes_the_shard(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    script = tmp_path / "job.py"
    script.write_text(_SIGTERM_SCRIPT)
    p = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == -signal.SIGTERM  # it still dies of SIGTERM
    finally:
        p.kill()
    rows = _rows(out)
    assert len(rows) >= 20 and {r["step"] for r in rows} >= set(range(5))
    state = json.loads((out / "rank0.state.json").read_text())
    assert state["status"] == "terminated" and state["num_ops_written"] == len(rows)
    assert any("terminated" in m for m in check_trace(out))


def test_a_hard_crash_leaves_the_flushed_part_and_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, time
        from pathlib import Path
        from laggard.tracer import Tracer
        t = Tracer(sys.argv[1], flush_interval_s=0.0, record_gc=False)
        state = Path(sys.argv[1]) / "rank0.state.json"
        for step in range(6):
            with t.step(step):
                with t.op("forward-compute"):
                    time.sleep(0.001)
            for _ in range(200):  # give the writer a moment (it may still fall behind: fine)
                if json.loads(state.read_text()).get("last_step_written") == step:
                    break
                time.sleep(0.01)
        with t.step(6):
            with t.op("forward-compute"):
                pass
        os._exit(3)  # no flush: at least step 6 is lost
    """))
    assert subprocess.run([sys.executable, str(script), str(out)], timeout=60).returncode == 3
    state = json.loads((out / "rank0.state.json").read_text())
    last = state["last_step_written"]
    assert state["status"] == "running" and last is not None and last < 6
    rows = _rows(out)
    assert {r["step"] for r in rows} == set(range(last + 1)) and len(rows) == state["num_ops_written"]
    msgs = check_trace(out)
    assert any("did not close its trace" in m and f"up to step {last}" in m for m in msgs)


def test_clock_offsets_from_barrier_samples() -> None:
    rng = np.random.default_rng(0)
    true = np.array([0, 5_000_000_000, -3_000_000, 123_456])  # rank r's clock = rank 0's - true[r]
    release = np.arange(7)[:, None] * 1_000_000_000
    jitter = rng.integers(0, 20_000, size=(7, 4))
    jitter[3, 2] = 50_000_000  # one round where rank 2 was descheduled
    samples = release + jitter - true[None, :]
    offsets, spread = offsets_from_samples(samples)
    assert np.abs(offsets - true).max() < 40_000
    assert spread >= 49_000_000  # the bad round shows in the error bound, not in the offsets


def test_clock_offset_from_pingpong_uses_the_fastest_round() -> None:
    offset = 7_000_000
    t1 = np.array([0, 1_000_000, 2_000_000])
    rtt = np.array([900_000, 60_000, 400_000])
    delay_out = np.array([800_000, 30_000, 50_000])  # the slow rounds are asymmetric
    t2 = t1 + delay_out - offset
    t3 = t1 + rtt
    est, err = offset_from_pingpong(t1, t2, t3)
    assert err == 30_000 and abs(est - offset) <= err


def test_disabled_tracer_costs_nothing_and_records_nothing(tmp_path: Path) -> None:
    t = Tracer(None)
    assert not t.enabled
    with t.step(0), t.op("forward-compute"):
        pass
    t.close()
    assert not any(tmp_path.iterdir())


def test_per_op_overhead_is_small(tmp_path: Path) -> None:
    """A loose bound (the benchmark measures it): per-op cost well under 50 us even on a busy machine."""
    t = Tracer(tmp_path / "trace", record_gc=False, page_ops=100_000)
    n = 20_000
    with t.step(0):
        t0 = time.perf_counter_ns()
        for m in range(n):
            with t.op("forward-compute", microbatch=m):
                pass
        per_op = (time.perf_counter_ns() - t0) / n
    t.close()
    assert per_op < 50_000
    assert os.path.exists(tmp_path / "trace" / "ops-rank0-00000.parquet")


def test_record_every_n_steps(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    with Tracer(out, record_every=2, record_gc=False) as t:
        for step in range(5):
            with t.step(step):
                with t.op("forward-compute"):
                    pass
                t.record("data-wait", t.clock_ns(), 10)
    rows = _rows(out)
    assert [(r["step"], r["name"]) for r in rows] == [(s, n) for s in (0, 2, 4)
                                                      for n in ("forward-compute", "data-wait")]


def test_bad_op_arguments_are_one_line_errors(tmp_path: Path) -> None:
    from laggard.errors import LaggardError

    with Tracer(tmp_path / "trace") as t, t.step(0):
        with pytest.raises(LaggardError, match="must be integers"), t.op("forward-compute", microbatch="x"):
            pass
        with pytest.raises(LaggardError, match="must be integers"), t.op("forward-compute", microbatch="x"):
            pass  # the second time through the fast path (a known op type)
        with pytest.raises(LaggardError, match="kind must be one of"):
            t.op("x", kind="gpu")
        with pytest.raises(LaggardError, match="steps do not nest"), t.step(1):
            pass


def test_the_writer_never_imports_pandas(tmp_path: Path) -> None:
    """pyarrow's pa.array and to_numpy import pandas on first use: ~0.4 s of CPU and ~100 MB in every
    traced process, taken by the writer thread while training runs. The tracer's pages never do."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys
        from laggard.tracer import Tracer
        with Tracer(sys.argv[1], page_ops=64, num_pages=64) as t:
            for s in range(4):
                with t.step(s):
                    for j in range(40):
                        with t.op("forward-compute", microbatch=j, num_tokens=j if j % 2 else None):
                            pass
                    with t.op("attention", seq_lens=[3, 4]):
                        pass
                    with t.collective("grads-all-reduce", label="dp", size_bytes=8):
                        pass
        print(t.num_ops_recorded, "pandas" in sys.modules)
    """))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "trace")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    num_ops, pandas = out.stdout.split()
    assert pandas == "False"
    rows = _rows(tmp_path / "trace")
    assert len(rows) == int(num_ops) > 64 * 2  # several pages written
    assert sum(r["seq_lens"] == [3, 4] for r in rows) == 4 and sum(r["num_tokens"] is None for r in rows) > 80


def test_side_data_stays_with_its_op_across_pages(tmp_path: Path) -> None:
    """An op's seq_lens stay its own when its record lands on a later page than its start (a full page
    handed off by its own record, or by the ops nested in it)."""
    out = tmp_path / "trace"
    with Tracer(out, record_gc=False, page_ops=16, num_pages=64) as t:
        for s in range(6):
            with t.step(s):
                for j in range(10):
                    with t.op("forward-compute", microbatch=j, seq_lens=[s, j]):
                        for k in range(j % 3):
                            with t.op("attention", microbatch=j, seq_lens=[j, s, k]):
                                pass
    rows = _rows(out)
    assert t.num_ops_recorded == len(rows) == 6 * (10 + sum(j % 3 for j in range(10)))
    for r in rows:
        assert r["seq_lens"][:2] == ([r["step"], r["microbatch"]] if r["name"] == "forward-compute"
                                     else [r["microbatch"], r["step"]])
