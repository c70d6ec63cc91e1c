"""The tracer's CUDA path on a simulated GPU: per-step anchors keep op times right for a day.

No GPU here, so ``torch.cuda`` is replaced by a fake with the same API (``Event(enable_timing=
True)``, ``record``, ``query``, ``synchronize``, ``elapsed_time``, ``Stream``, ``synchronize``,
``current_stream``) whose events run on a simulated device: kernels queue on streams, an event
runs when the work before it on its stream (or, with ``serialised=True``, on the one hardware
queue all streams share, as under ``CUDA_DEVICE_MAX_CONNECTIONS=1``) is done, and
``elapsed_time`` is computed from the device's own clock and rounded to float32 milliseconds as
``cudaEventElapsedTime`` does. The ground truth is the simulator's record of when each op's
first event ran on the host clock, which the tracer never sees.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from laggard.io import load_job
from laggard.tracer import Tracer

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)

DAY_S = 86_400
STEP_S = 10  # 8640 steps of 10 s: one simulated day
GPU_EPOCH_NS = 3_141_592_653_589  # the device clock's zero is not the host's


class FakeHost:
    """The host clock: every reading costs a little time, as on a real machine."""

    def __init__(self) -> None:
        self.now_ns = 1_000_000_000

    def __call__(self) -> int:
        self.now_ns += 40
        return self.now_ns


class FakeStream:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.tail_ns = 0  # host-clock time when the work queued on this stream is done


class FakeEvent:
    """torch.cuda.Event on the simulated device."""

    def __init__(self, gpu: FakeGpu, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        assert enable_timing, "the tracer needs timing events"
        self.gpu = gpu
        self.ran_ns: int | None = None  # host-clock time at which the device ran the event

    def record(self, stream: FakeStream | None = None) -> None:
        self.ran_ns = self.gpu.enqueue(stream or self.gpu.compute, 0)

    def query(self) -> bool:
        gpu = self.gpu
        gpu.host.now_ns += gpu.poll_ns
        if gpu.rng.random() < gpu.hiccup_prob:  # the polling thread was descheduled
            gpu.host.now_ns += gpu.hiccup_ns
        return self.ran_ns is not None and gpu.host.now_ns >= self.ran_ns

    def synchronize(self) -> None:
        assert self.ran_ns is not None
        self.gpu.host.now_ns = max(self.gpu.host.now_ns, self.ran_ns) + self.gpu.wake_ns

    def elapsed_time(self, end_event: FakeEvent) -> float:
        host = self.gpu.host.now_ns
        if self.ran_ns is None or end_event.ran_ns is None or host < max(self.ran_ns, end_event.ran_ns):
            raise RuntimeError("CUDA error: device not ready")  # cudaErrorNotReady, as torch raises it
        # the device's timestamps, differenced exactly, then returned as a C float in ms
        ms = ((end_event.ran_ns + GPU_EPOCH_NS) - (self.ran_ns + GPU_EPOCH_NS)) / 1e6
        return float(np.float32(ms))


class FakeGpu:
    """A device with a compute stream, side streams and (optionally) one shared hardware queue."""

    def __init__(self, host: FakeHost, *, serialised: bool = False, seed: int = 0) -> None:
        self.host = host
        self.serialised = serialised
        self.rng = np.random.default_rng(seed)
        self.launch_ns = 4_000  # record call to the device seeing it
        self.poll_ns = 1_200  # one query() call
        self.wake_ns = 2_000  # a blocking wait noticing completion
        self.hiccup_prob = 0.002
        self.hiccup_ns = 400_000
        self.queue_tail_ns = 0  # the shared hardware queue (serialised mode)
        self.compute = FakeStream(self)
        self.compute_log: list[int] = []  # when each event on the compute stream ran

    def enqueue(self, stream: FakeStream, dur_ns: int) -> int:
        """Queue work on ``stream``; returns when it starts (host clock)."""
        jitter = int(self.rng.integers(0, 3_000))
        start = max(self.host.now_ns + self.launch_ns + jitter, stream.tail_ns)
        if self.serialised:
            start = max(start, self.queue_tail_ns)
        stream.tail_ns = start + dur_ns
        self.queue_tail_ns = max(self.queue_tail_ns, stream.tail_ns)
        if stream is self.compute and dur_ns == 0:
            self.compute_log.append(start)
        return start

    def launch(self, dur_ns: int) -> None:
        self.enqueue(self.compute, dur_ns)
        self.host.now_ns += 8_000  # the launch call itself

    def synchronize(self, device: object = None) -> None:
        self.host.now_ns = max(self.host.now_ns, self.queue_tail_ns, self.compute.tail_ns) + self.wake_ns

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "Event", functools.partial(FakeEvent, self))
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, priority=0, **kw: FakeStream(self))
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.compute)


OPS = (("forward-compute", 3_000_000_000), ("backward-compute", 5_500_000_000),
       ("grads-all-reduce", 900_000_000), ("optimizer", 400_000_000))


def _run_day(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, serialised: bool = False,
             num_steps: int = DAY_S // STEP_S, sync_every: int = 3) -> tuple[np.ndarray, np.ndarray, dict]:
    """Trace a day of 10 s steps on the fake GPU; (recorded start, true start) per op, local clock ns."""
    host = FakeHost()
    gpu = FakeGpu(host, serialised=serialised)
    gpu.install(monkeypatch)
    truth: list[int] = []
    out = tmp_path / "trace"
    t = Tracer(out, timing="cuda", record_gc=False, clock_ns=host, page_ops=40_000,
               flush_interval_s=1e9)  # one page: the simulated loop outruns any writer
    for step in range(num_steps):
        with t.step(step):
            for name, dur_ns in OPS:
                ctx = t.collective(name, label="world") if name.endswith("all-reduce") else t.op(name)
                with ctx:
                    gpu.launch(dur_ns + int(gpu.rng.integers(0, 50_000_000)))
                truth.append(gpu.compute_log[-2])
                host.now_ns += 30_000  # Python between ops
        if step % sync_every == sync_every - 1:
            gpu.synchronize()  # e.g. loss.item(): how far the host may run ahead of the GPU
    t.close()
    state = t._state
    rows = sorted(load_job(out).table.to_pylist(), key=lambda r: r["op_id"])
    assert [r["name"] for r in rows] == [n for _ in range(num_steps) for n, _ in OPS]
    got = np.array([r["start_ns"] for r in rows], dtype=np.int64) - t.sync.offset_ns
    assert host.now_ns - truth[0] > (num_steps - 1) * 9 * 10**9  # the simulation did span the time
    return got, np.array(truth, dtype=np.int64), state


def test_per_step_anchors_keep_op_starts_within_microseconds_for_a_day(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    got, truth, state = _run_day(tmp_path, monkeypatch)
    err = np.abs(got - truth)
    assert err.max() < 8_000, f"max error {err.max()} ns"  # launch + poll latency + float32 over a few steps
    assert state["cuda_num_anchors"] >= 8640 * 0.9  # (nearly) one per step
    assert state["cuda_num_blocking_anchors"] <= 1  # the side stream is idle: spins, not syncs


def test_the_single_start_up_anchor_is_off_by_milliseconds_after_a_day(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old scheme on the same simulated day: the fake reproduces what per-step anchors fix."""
    from laggard.tracer import cuda

    monkeypatch.setattr(cuda, "ANCHOR", cuda.AnchorConfig(reanchor=False))
    got, truth, state = _run_day(tmp_path, monkeypatch)
    err = np.abs(got - truth)
    assert state["cuda_num_anchors"] == 1
    assert err.max() > 1_000_000, f"max error {err.max()} ns"  # float32 ms over ~2^26 ms: ulp 8 ms
    first_hour = err[: 360 * len(OPS)]
    assert first_hour.max() < 300_000  # 2^22 ms spans: ulp 0.5 ms


def test_serialised_streams_fall_back_to_a_bounded_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One hardware queue for all streams: the side-stream anchor waits behind queued kernels, the
    spin gives up, and after a few stale steps the tracer blocks once; times stay right."""
    got, truth, state = _run_day(tmp_path, monkeypatch, serialised=True, num_steps=2000,
                                   sync_every=12)
    err = np.abs(got - truth)
    # spans are longer here (a stale anchor up to 8 steps old, the host up to 12 steps ahead): 2^17 ms
    assert err.max() < 12_000, f"max error {err.max()} ns"
    assert state["cuda_num_stale_steps"] > 0  # the spin did give up (the fake does serialise)
    assert state["cuda_num_blocking_anchors"] > 0  # ... and blocked when the anchor grew too old
    assert state["cuda_max_anchor_error_ns"] < 50_000
