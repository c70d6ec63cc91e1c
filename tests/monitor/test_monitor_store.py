"""The collector's store under concurrent ingest (group commit) and the analysis child process."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time

import pytest

pytest.importorskip("prometheus_client", reason="the monitor extra is not installed")

from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.monitor.config import MonitorConfig  # noqa: E402
from laggard.monitor.push import step_batches  # noqa: E402
from laggard.monitor.service import Collector  # noqa: E402
from laggard.monitor.store import BatchRow, Store  # noqa: E402
from laggard.wire.batch import encode_batch  # noqa: E402

NUM_THREADS = 8
NUM_KEYS = 40


def _row(key: int) -> BatchRow:
    return BatchRow(job_id="j", rank=key % 4, seq=key, min_step=key, max_step=key, num_ops=1,
                    body=f"body-{key}".encode())


def _hammer(store: Store) -> list[list[tuple[int, bool]]]:
    """NUM_THREADS threads each store every key once (in their own order): every key NUM_THREADS times."""
    out: list[list[tuple[int, bool]]] = [[] for _ in range(NUM_THREADS)]
    start = threading.Barrier(NUM_THREADS)

    def run(i: int) -> None:
        start.wait()
        for k in sorted(range(NUM_KEYS), key=lambda k: (k * (i + 3)) % NUM_KEYS):
            out[i].append((k, store.add_batch(_row(k))))

    ths = [threading.Thread(target=run, args=(i,)) for i in range(NUM_THREADS)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(60)
    return out


def test_group_commit_stores_each_batch_once_and_answers_each_caller(tmp_path, monkeypatch):
    store = Store(tmp_path / "m.db")
    groups: list[int] = []
    real = store._insert_batches
    first = threading.Event()

    def insert(rows):
        groups.append(len(rows))
        if not first.is_set():  # hold the first transaction until every other thread queued a batch
            first.set()
            deadline = time.monotonic() + 30
            while len(store._queue) < NUM_THREADS - 1 and time.monotonic() < deadline:
                time.sleep(0.001)
        return real(rows)

    monkeypatch.setattr(store, "_insert_batches", insert)
    out = _hammer(store)
    new = [k for res in out for k, n in res if n]
    assert sum(len(r) for r in out) == NUM_THREADS * NUM_KEYS
    assert sorted(new) == list(range(NUM_KEYS))  # each key acknowledged as new exactly once
    assert max(groups) >= NUM_THREADS - 1  # the batches queued behind a commit went in one transaction
    store.close()
    with sqlite3.connect(tmp_path / "m.db") as c:  # what a restarted collector would read
        rows = c.execute("SELECT seq, body FROM batches ORDER BY seq").fetchall()
    assert rows == [(k, f"body-{k}".encode()) for k in range(NUM_KEYS)]


def test_a_failed_group_commit_fails_every_batch_in_it(tmp_path, monkeypatch):
    store = Store(tmp_path / "m.db")
    monkeypatch.setattr(store, "_insert_batches",
                        lambda rows: (_ for _ in ()).throw(sqlite3.OperationalError("disk I/O error")))
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            store.add_batch(_row(k))
        except sqlite3.OperationalError as e:
            errors.append(e)

    ths = [threading.Thread(target=run, args=(k,)) for k in range(NUM_THREADS)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(30)
    assert len(errors) == NUM_THREADS  # none acknowledged
    monkeypatch.undo()
    assert store.add_batch(_row(0)) is True  # the store goes on after a failed transaction
    store.close()


def test_window_analysis_runs_in_a_child_that_is_replaced_when_killed(tmp_path):
    job = synthesize(SynthConfig(dp=2, pp=2, microbatches=2, steps=12, seed=5, name="childjob"))
    col = Collector(Store(tmp_path / "m.db"), MonitorConfig(window_steps=4, refresh_every_steps=2, tick_s=0.05))
    col.start()
    meta = job.meta.to_json()
    seqs: dict[int, int] = {}

    def feed(lo: int, hi: int) -> None:
        for s, r, t in step_batches(job):
            if lo <= s < hi:
                seqs[r] = seqs.get(r, -1) + 1
                col.ingest(encode_batch(t, job_id="childjob", rank=r, seq=seqs[r], meta=meta))

    def wait_window(last: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            res = col.windows["childjob"].result
            if res is not None and res.steps[1] >= last:
                return
            time.sleep(0.05)
        raise AssertionError(f"no window through step {last}: {col.windows['childjob'].error}")

    try:
        feed(0, 6)
        wait_window(4)
        pids = col._analyzer.pids() if col._analyzer else []
        assert pids and os.getpid() not in pids
        os.kill(pids[0], signal.SIGKILL)
        feed(6, 12)
        wait_window(10)  # analyzed by a new child
        assert col._analyzer.pids() and pids[0] not in col._analyzer.pids()
        assert col.windows["childjob"].result.doc["num_ops"] > 0
    finally:
        col.stop()



def test_windows_are_handed_over_and_kept_as_they_come_not_at_the_next_tick(tmp_path):
    """With a tick far longer than the test, the analyzer still starts each window as its steps
    complete (woken by the ingest) and keeps its result as soon as the child is done (woken by the
    future): two windows in a row, the second handed over only once the first is back."""
    job = synthesize(SynthConfig(dp=2, pp=2, microbatches=2, steps=10, seed=6, name="wakejob"))
    cfg = MonitorConfig(window_steps=4, refresh_every_steps=2, tick_s=600.0, idle_refresh_s=1e9)
    col = Collector(Store(tmp_path / "m.db"), cfg)
    col.start()
    meta = job.meta.to_json()
    seqs: dict[int, int] = {}
    try:
        for lo, hi, last in ((0, 6, 4), (6, 8, 6)):
            for s, r, t in step_batches(job):
                if lo <= s < hi:
                    seqs[r] = seqs.get(r, -1) + 1
                    col.ingest(encode_batch(t, job_id="wakejob", rank=r, seq=seqs[r], meta=meta))
            deadline = time.monotonic() + 120  # (a child's start on a loaded host; the tick is 600 s away)
            while time.monotonic() < deadline:
                res = col.windows["wakejob"].result
                if res is not None and res.steps[1] >= last:
                    break
                time.sleep(0.05)
            res = col.windows["wakejob"].result
            assert res is not None and res.steps == (last - 3, last), col.windows["wakejob"].error
    finally:
        t0 = time.monotonic()
        col.stop()
    assert time.monotonic() - t0 < 30  # the stop wakes the analyzer from its wait


def test_the_pool_analyses_jobs_side_by_side_each_as_the_in_process_analysis_does(tmp_path):
    """Two jobs fed at once into a collector with two analysis processes: each job's window is the
    analysis ``laggard analyze --json`` gives for the same steps in this process (the table built
    in the child from the batches' bodies is the table built here)."""
    from laggard.groundtruth.inject import parse_injection
    from laggard.monitor.analyzer import analyze

    jobs = [synthesize(SynthConfig(dp=2, pp=2, microbatches=2, steps=8, seed=s, name=f"pool{s}"),
                       [parse_injection("slow-worker:rank=1,factor=1.5")] if s == 1 else None) for s in (1, 2)]
    cfg = MonitorConfig(window_steps=4, refresh_every_steps=2, tick_s=0.05, analysis_workers=2, idle_refresh_s=1e9)
    col = Collector(Store(tmp_path / "m.db"), cfg)
    for job in jobs:  # every step in before the analyzer starts: its first cut is then the window through step 6
        for s, r, t in step_batches(job):
            col.ingest(encode_batch(t, job_id=job.meta.name, rank=r, seq=s, meta=job.meta.to_json()))
    col.start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(
                (w := col.windows[j.meta.name].result) is not None and w.steps[1] >= 6 for j in jobs):
            time.sleep(0.05)
        assert len(col._analyzer.pids()) <= 2
        for job in jobs:
            win = col.windows[job.meta.name]
            assert win.result is not None and win.result.steps == (3, 6), win.error
            here = analyze(win.window_table(6), win.meta, cfg.analysis).doc
            assert win.result.doc["findings"] == here["findings"] and win.result.doc["slowdown"] == here["slowdown"]
        assert col.windows["pool1"].result.doc["findings"]  # the slow job's window was analyzed, not skipped
    finally:
        col.stop()


@pytest.mark.parametrize("in_process", [True, False])
def test_a_job_whose_analysis_fails_does_not_hold_up_the_others(tmp_path, monkeypatch, in_process):
    """The first job's window fails to analyze (in the analyzer thread) or to be handed to the pool;
    the job after it is analyzed, or handed over, in the same tick, not a tick later."""
    import laggard.monitor.scheduler as service  # where the collector calls analyze

    def failing(real):
        def call(cut, meta, acfg, *job):
            if meta.name == "bad0":
                raise RuntimeError("a bug in one job's analysis")
            return real(cut, meta, acfg, *job)
        return call

    cfg = MonitorConfig(window_steps=4, refresh_every_steps=2, idle_refresh_s=1e9, analysis_process=not in_process)
    col = Collector(Store(tmp_path / "m.db"), cfg)
    if in_process:
        monkeypatch.setattr(service, "analyze", failing(service.analyze))
    else:
        col.start()
        col._stop.set()  # this test ticks by hand
        col._thread.join()
        monkeypatch.setattr(col._analyzer, "submit", failing(col._analyzer.submit))
    try:
        for name in ("bad0", "good1"):  # the failing job first: it is looked at first
            job = synthesize(SynthConfig(dp=2, pp=1, microbatches=2, steps=8, seed=3, name=name))
            for s, r, t in step_batches(job):
                col.ingest(encode_batch(t, job_id=name, rank=r, seq=s, meta=job.meta.to_json()))
        col.tick()
        if in_process:
            assert col.windows["good1"].result is not None and col.windows["good1"].result.doc["num_ops"] > 0
        else:
            assert "good1" in col._running and "bad0" not in col._running
        assert col.windows["bad0"].result is None
    finally:
        if in_process:
            col.store.close()
        else:
            col.stop()


def test_a_job_goes_back_to_the_child_that_had_its_last_window_while_that_child_is_free():
    """The pool's choice of child (``AnalysisPool._slot``, no process started): a job's window goes
    to the child that had its last one when that child has nothing waiting, else to the least busy,
    its own on a tie; a window of no job to the least busy."""
    from laggard.monitor.analyzer import AnalysisPool

    pool = AnalysisPool(workers=2)
    a = pool._slot("a")
    pool._done(a)
    assert pool._slot("a") == a  # free: back to it
    b = pool._slot("b")
    assert b != a  # a's child is busy
    pool._done(a)
    pool._done(b)
    assert pool._slot("b") == b and pool._slot("a") == a
    assert pool._slot("a") == a  # both busy with one each: a's own child
    assert pool._slot(None) == b
    assert pool._pending == [2, 2]


def test_each_window_analyzed_in_the_pool_through_its_cache_is_the_in_process_analysis(tmp_path):
    """A job fed step by step into a collector with two analysis processes: every window served
    (its bodies partly read for the window before, kept in the child) is the analysis of the same
    steps built and run afresh in this process."""
    from laggard.groundtruth.inject import parse_injection
    from laggard.monitor.analyzer import analyze

    job = synthesize(SynthConfig(dp=4, pp=1, microbatches=2, steps=14, seed=5, name="cached"),
                     [parse_injection("slow-worker:rank=2,factor=1.5")])
    cfg = MonitorConfig(window_steps=4, refresh_every_steps=2, tick_s=0.05, analysis_workers=2, idle_refresh_s=1e9)
    col = Collector(Store(tmp_path / "m.db"), cfg)
    col.start()
    meta = job.meta.to_json()
    served = []  # (the window served, the same steps' table built here)
    try:
        for lo in range(0, 14, 2):  # 2 steps at a time (a batch per rank and step), in one request
            # (its batches join the window together: posted one by one, a slow host's analyzer cut a
            # window while half of them were in, and the next came only 2 steps after the awaited one)
            col.ingest_many([encode_batch(t, job_id="cached", rank=r, seq=s, meta=meta)
                             for s, r, t in step_batches(job) if lo <= s < lo + 2])
            last = lo  # complete once every rank sent a later step
            deadline = time.monotonic() + 60
            while lo >= 2 and time.monotonic() < deadline:
                res = col.windows["cached"].result
                if res is not None and res.steps[1] >= last:
                    with col._lock:
                        served.append((res, col.windows["cached"].window_table(last)))
                    break
                time.sleep(0.05)
        assert len(served) == 6, [r.steps for r, _ in served]
        win = col.windows["cached"]
        for res, table in served:
            here = analyze(table, win.meta, cfg.analysis).doc
            assert res.doc["findings"] == here["findings"] and res.doc["slowdown"] == here["slowdown"]
            assert res.doc["num_ops"] == here["num_ops"] == table.num_rows
        assert any(f["cause"] == "worker" for f in served[-1][0].doc["findings"])
    finally:
        col.stop()


def test_an_analysis_process_keeps_read_bodies_within_its_budget():
    """``analyzer._parts_cache``/``_trim_parts`` (what a child keeps between windows): each job's
    last window's bodies read, the least recently analyzed job's dropped first once all of them hold
    more than the budget; a job over the budget alone is not kept."""
    from laggard.monitor import analyzer
    from laggard.monitor.window import WindowCut, build_window

    job = synthesize(SynthConfig(dp=2, pp=1, microbatches=2, steps=4, seed=1, name="b"))
    bodies = [encode_batch(t, job_id="b", rank=r, seq=s, meta=job.meta.to_json()) for s, r, t in step_batches(job)]
    cut = WindowCut(first=0, last=3, parts=bodies)

    def read(job_id: str, budget: int) -> None:
        build_window(cut, analyzer._parts_cache(job_id, budget))
        analyzer._trim_parts(job_id, budget)

    analyzer._PARTS.clear()
    try:
        read("a", 10**9)
        cache, sizes, one = analyzer._PARTS["a"]
        assert one > 0 and len(cache) == len(bodies)
        assert one == sum(b.nbytes for batches in cache.values() for b in batches) == sum(sizes.values())
        build_window(WindowCut(first=1, last=3, parts=bodies[2:]), analyzer._parts_cache("a", 10**9))
        analyzer._trim_parts("a", 10**9)  # the next window: bodies kept are counted as before, the others gone
        cache, sizes, part = analyzer._PARTS["a"]
        assert len(cache) == len(bodies) - 2 and part == sum(b.nbytes for bs in cache.values() for b in bs) < one
        read("a", 10**9)
        read("b", 10**9)
        read("a", 10**9)  # a is now the most recent
        read("c", 2 * one)  # three jobs over a budget of two: b, the least recent, goes
        assert list(analyzer._PARTS) == ["a", "c"]
        read("c", one - 1)  # over the budget alone: nothing kept
        assert not analyzer._PARTS
        assert analyzer._parts_cache("a", 0) is None and not analyzer._PARTS
    finally:
        analyzer._PARTS.clear()


def test_a_windows_table_is_its_steps_rows_step_by_step():
    """A rank's batch spans several steps (a tracer flushes every few); the window's table holds the
    window's steps' rows, step after step, each step's in the order the batches were held (so that
    steps that repeat one another are built once, ``laggard.engine.graph``)."""
    import numpy as np
    import pyarrow as pa

    from laggard.monitor.window import WindowCut, build_window
    from laggard.optable.ops import to_numpy

    job = synthesize(SynthConfig(dp=3, pp=1, microbatches=2, steps=4, seed=2, name="w"))
    t = job.table
    ranks, steps = to_numpy(t.column("rank")), to_numpy(t.column("step"))
    parts, held = [], []
    for r in (2, 0, 1):  # held rank by rank, each batch two steps
        for lo in (0, 2):
            rows = np.flatnonzero((ranks == r) & (steps >= lo) & (steps <= lo + 1))
            parts.append(encode_batch(t.take(pa.array(rows)), job_id="w", rank=r, seq=lo, meta=job.meta.to_json()))
            held.append(rows)
    out = build_window(WindowCut(first=1, last=2, parts=parts))
    got_steps, got_ids = to_numpy(out.column("step")), to_numpy(out.column("op_id"))
    assert got_steps.tolist() == sorted(got_steps.tolist()) and set(got_steps.tolist()) == {1, 2}
    ids = to_numpy(t.column("op_id"))
    for step in (1, 2):  # each step's rows: every rank's, in the order held
        want = [int(ids[i]) for rows in held for i in rows if steps[i] == step]
        assert got_ids[got_steps == step].tolist() == want


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_url(request, tmp_path_factory):
    """A database URL of each kind the collector takes (PostgreSQL: a throwaway cluster)."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "sqlite":
        yield str(tmp / "m.db")
        return
    from tests.monitor_helpers import Postgres

    pg = Postgres(tmp)
    try:
        yield pg.start()
    finally:
        pg.stop()


def test_a_relays_packs_are_stored_once_and_a_restart_holds_the_same_windows(db_url, tmp_path):
    """A job's steps posted as relays' packs (two per step, four ranks each), one rank's batch first
    on its own and one pack twice: the window is the one the same batches make posted one by one
    (the same ops, the same analysis), each pack is stored once (none for the one sent again), and a
    collector restarted on the database holds that window again."""
    from laggard.groundtruth.inject import parse_injection
    from laggard.monitor.analyzer import analyze
    from laggard.wire.batch import decode_batch
    from laggard.wire.pack import encode_pack

    job = synthesize(SynthConfig(dp=4, pp=2, microbatches=2, steps=8, seed=3, name="packjob"),
                     [parse_injection("slow-worker:rank=5,factor=1.5")])
    meta = job.meta.to_json()
    cfg = MonitorConfig(window_steps=4, refresh_every_steps=2, analysis_process=False, idle_refresh_s=1e9)
    by_step: dict[int, list[bytes]] = {}
    for s, r, t in step_batches(job):
        by_step.setdefault(s, []).append(encode_batch(t, job_id="packjob", rank=r, seq=s, meta=meta))
    packed, single = Collector(Store(db_url), cfg), Collector(Store(tmp_path / "single.db"), cfg)
    assert packed.ingest(by_step[0][0])["accepted"] > 0  # rank 0's first batch came alone
    for s, bodies in sorted(by_step.items()):
        for lo in (0, 4):
            pack = encode_pack([decode_batch(b) for b in bodies[lo:lo + 4]])
            ans = packed.ingest_pack(pack)["parts"]
            assert [a["duplicate"] for a in ans] == [s == 0 and lo == 0 and i == 0 for i in range(4)]
            if s == 1 and lo == 4:  # sent again (its answer lost): every part a duplicate, nothing stored
                assert all(a["duplicate"] and a["accepted"] == 0 for a in packed.ingest_pack(pack)["parts"])
        for b in bodies:
            single.ingest(b)
    last = packed.windows["packjob"].complete_through()
    assert last == single.windows["packjob"].complete_through() == 6
    want = single.windows["packjob"].window_table(last)
    got = packed.windows["packjob"].window_table(last)
    assert got.num_rows == want.num_rows > 0 and got.to_pylist() == want.to_pylist()
    doc = analyze(got, packed.windows["packjob"].meta, cfg.analysis).doc
    assert doc["findings"] == analyze(want, single.windows["packjob"].meta, cfg.analysis).doc["findings"]
    assert any(5 in [w["rank"] for w in f.get("workers", [])] for f in doc["findings"])  # the slow rank, found
    assert packed.store._read("SELECT COUNT(*) FROM packs")[0][0] == 2 * len(by_step)
    assert packed.store._read("SELECT COUNT(*) FROM batches WHERE pack_id IS NULL")[0][0] == 1
    packed.stop()
    single.stop()
    again = Collector(Store(db_url), cfg)
    try:
        assert again.windows["packjob"].complete_through() == last
        assert again.windows["packjob"].window_table(last).to_pylist() == want.to_pylist()
    finally:
        again.stop()


def test_a_pack_of_a_new_job_without_its_meta_is_refused_naming_the_part(tmp_path):
    from laggard.wire.batch import BadBatch, decode_batch
    from laggard.wire.pack import encode_pack

    job = synthesize(SynthConfig(dp=2, pp=1, microbatches=1, steps=2, seed=1, name="nometa"))
    parts = [decode_batch(encode_batch(t, job_id="nometa", rank=r, seq=s, meta=None)) for s, r, t in step_batches(job)]
    col = Collector(Store(tmp_path / "m.db"), MonitorConfig(analysis_process=False))
    try:
        with pytest.raises(BadBatch,
                           match="^pack part 0: job 'nometa' is new: its first batch must carry laggard.meta$"):
            col.ingest_pack(encode_pack(parts))
        assert col.store.jobs() == [] and col.store._read("SELECT COUNT(*) FROM packs")[0][0] == 0
    finally:
        col.stop()
