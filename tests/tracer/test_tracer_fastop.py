"""Tracer.op's compiled fast path (laggard/tracer/_fastop.c) against the Python path it stands in for.

The same script of ops, on the same deterministic clock, is traced once with each path; the shards
must be the same op for op. The script goes through every branch the compiled code has: the common
op, a full page (the general path), nested ops and GC pauses (excluded time), num_tokens given and
not, numpy integers, and the calls it hands back to Python (other kinds, streams, sequence lengths,
unknown names, between steps, skipped steps)."""

from __future__ import annotations

import gc
import inspect
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from laggard.errors import LaggardError
from laggard.io import load_job
from laggard.tracer import Tracer
from laggard.tracer import core as tracer_core

pytestmark = pytest.mark.timeout(120)
needs_compiled = pytest.mark.skipif(tracer_core._fastop is None,  # noqa: SLF001
                                    reason="the compiled fast path was not built (no C compiler at install)")


class _Clock:
    """A clock that moves by a different amount at every read: any read out of order, missed or
    added changes the recorded times."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        self.now += 1_000 + (self.now // 7) % 997
        return self.now


def _script(t: Tracer) -> None:
    op = t.op
    with t.step(0):
        for m in range(40):  # pages of 16: the common path, then full pages through _rec
            with op("forward-compute", microbatch=m % 4, num_tokens=None if m % 3 else 100 + m):
                pass
        with op("backward-compute", microbatch=np.int64(2), num_tokens=np.int32(7)):  # first use: Python
            with op("forward-compute", microbatch=1):  # nested: its time is cut out of the outer op
                pass
        with op("backward-compute", microbatch=np.int64(3)):  # now known: compiled
            pass
        t._gcq.append((t._clock(), 5_000, 0))  # a GC pause queued as gc.callbacks would  # noqa: SLF001
        with op("forward-compute", microbatch=0):
            t._gcq.append((t._clock(), 7_000, 2))  # one during the op: cut out of it  # noqa: SLF001
        with op("forward-compute", 3, "compute", 5) as bound:  # positional arguments
            assert bound is None  # `as` binds nothing, as on the Python fast path
        with op("optimizer", kind="other"), op("h2d", stream="copy"), op("forward-compute", seq_lens=[3, 4]):
            pass
    with op("forward-compute"):  # between steps: kept for the next step
        pass
    with t.step(1), op("forward-compute", microbatch=9):  # record_every=2: not recorded
        pass
    with t.step(2), op(name="forward-compute", microbatch=-7, num_tokens=2**40):
        pass
    with t.step(3), op("forward-compute", microbatch=5):  # not recorded
        pass


def _trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pure: bool) -> list[dict]:
    monkeypatch.setenv(tracer_core.PURE_PYTHON_ENV, "1" if pure else "")
    out = tmp_path / ("pure" if pure else "compiled")
    # no collections while traced: gc.callbacks would read the clock (and queue pauses) at points
    # that differ from run to run; the script queues its own pauses instead
    gc.collect()
    gc.disable()
    try:
        t = Tracer(out, clock_ns=_Clock(), align=None, handle_signals=False, page_ops=16, num_pages=64,
                   record_every=2, record_gc=True)
        assert ("op" in vars(t)) is not pure  # the path asked for is the one taken
        _script(t)
        t.close()
    finally:
        gc.enable()
    assert t.num_ops_dropped == 0
    rows = sorted(load_job(out).table.to_pylist(), key=lambda r: r["op_id"])
    t0 = rows[0]["start_ns"]  # the local clock's offset to the epoch is read from the wall clock
    return [{**r, "start_ns": r["start_ns"] - t0} for r in rows]


@needs_compiled
def test_compiled_op_records_what_the_python_path_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pure = _trace(tmp_path, monkeypatch, pure=True)
    compiled = _trace(tmp_path, monkeypatch, pure=False)
    assert len(pure) > 50
    assert compiled == pure
    # the script reached what it means to: excluded time, num_tokens, a full page, steps skipped
    names = [r["name"] for r in pure]
    assert {"optimizer", "h2d", "gc"} <= set(names)
    assert any(r["num_tokens"] == 2**40 for r in pure) and any(r["num_tokens"] is None for r in pure)
    assert {r["step"] for r in pure} == {0, 2}  # record_every=2: steps 1 and 3 are not recorded


@needs_compiled
def test_compiled_op_reads_the_monotonic_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default clock the compiled path reads CLOCK_MONOTONIC itself: its times lie between
    perf_counter_ns reads around the op (the same clock on Linux)."""
    monkeypatch.setenv(tracer_core.PURE_PYTHON_ENV, "")  # whatever the suite was started with
    with Tracer(tmp_path / "t", align=None, handle_signals=False, record_gc=False) as t:
        assert "op" in vars(t)
        # help() and signatures read the Python method's
        assert inspect.signature(t.op) == inspect.signature(Tracer.op.__get__(t)) and t.op.__doc__ == Tracer.op.__doc__
        with t.step(0):
            before = time.perf_counter_ns()
            with t.op("forward-compute"):
                time.sleep(0.002)
            after = time.perf_counter_ns()
            local = t._page[0]  # noqa: SLF001 - the record as packed, local clock
    assert before <= local["start_ns"] and local["start_ns"] + local["dur_ns"] <= after
    assert local["dur_ns"] >= 2_000_000


@needs_compiled
def test_compiled_op_errors_are_the_python_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for pure in (True, False):
        monkeypatch.setenv(tracer_core.PURE_PYTHON_ENV, "1" if pure else "0")
        with Tracer(tmp_path / f"t{pure}", align=None, handle_signals=False) as t, t.step(0):
            with t.op("forward-compute"):  # known from here on
                pass
            for bad in ("x", 1.5, 2**31, np.float64(2.0)):
                with pytest.raises(LaggardError, match=r"must be integers, got .* and -1$"), \
                        t.op("forward-compute", microbatch=bad):
                    pass
            with pytest.raises(LaggardError, match="must be integers"), t.op("forward-compute", num_tokens=2**63):
                pass
            with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
                t.op("forward-compute", bogus=1)
            with pytest.raises(TypeError, match="missing 1 required positional argument: 'name'"):
                t.op()
            with pytest.raises(TypeError, match="multiple values for argument 'microbatch'"):
                t.op("forward-compute", 1, microbatch=2)
            with pytest.raises(ZeroDivisionError), t.op("forward-compute"):  # the block's own error goes on
                1 / 0  # noqa: B018


@needs_compiled
def test_the_pure_python_switch_is_read_in_a_fresh_process(tmp_path: Path) -> None:
    code = ("from laggard.tracer import Tracer\n"
            f"t = Tracer({str(tmp_path / 't')!r}, align=None, handle_signals=False)\n"
            "print(type(t.op).__name__); t.close()\n")
    env = {"LAGGARD_TRACER_PURE_PYTHON": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "method"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "LAGGARD_TRACER_PURE_PYTHON": ""}, check=True)
    assert out.stdout.strip() == "OpMethod"


def test_the_install_built_the_compiled_path_where_it_could() -> None:
    """The extension is optional (an install without a C compiler goes on); where a compiler and
    Python's headers are here, a missing module means the build is broken, not absent."""
    import shutil
    import sysconfig

    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.exists():
        pytest.skip("no C compiler or Python headers here: the Python path is the one expected")
    assert tracer_core._fastop is not None  # noqa: SLF001
