"""The runtime tracer: records a training loop's ops into laggard's native format.

    tracer = Tracer("trace/", dp_rank=dp, pp_rank=pp)      # after init_process_group
    for i, batch in enumerate(tracer.data(loader)):         # data-loading waits
        with tracer.step(i):
            with tracer.op("forward-compute", microbatch=0):
                loss = model(batch)
            ...
            tracer.all_reduce(grads, group=dp_group, name="grads-all-reduce")
    tracer.close()                                          # or use it as a context manager

On CPU an op is timed with ``time.perf_counter_ns`` around the block; on GPU (``timing="cuda"``)
with CUDA events on the current stream, resolved at later step boundaries (never a sync per op).
Ops are packed into preallocated pages and written by a background thread as per-rank Parquet
shards (``ops-rank{R}-{k}.parquet``) beside ``job.json`` (rank 0), so a step never waits for I/O and
memory stays bounded; when the writer falls behind, ops are dropped and counted, never queued.

Dependencies: ops run in order on a stream (one per rank on CPU: everything is synchronous on the
Python thread), so each op depends on the previous op of its stream in the same step. An op
nested in another (or a GC pause inside an op) is cut out of the outer op, so the stream's ops
never overlap. Asynchronous communication (``isend``, ``irecv``, ``async_op=True``) runs beside
the stream: it depends on the op before its issue, and the first op after its ``wait()`` depends
on it. Collectives are matched across ranks by (step, group, seq): the group is the process
group's ranks (or a label you give), seq the call count of that group in the step; point-to-point
transfers by the group ``p2p:SRC>DST`` and a per-pair count.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError, LaggardWarning
from laggard.tracer import _signals, abort, flight
from laggard.tracer._contexts import _NULL, _CpuOpCtx, _NullCtx, _OpCtx, _SkipCtx, _StepCtx
from laggard.tracer._env import _dist_if_initialized, check_args
from laggard.tracer._gc import GcMixin
from laggard.tracer._page import (
    RECORD_BYTES,
    Side,
)
from laggard.tracer._paging import PagingMixin
from laggard.tracer._record import RecordMixin
from laggard.tracer._setup import SetupMixin
from laggard.tracer.clock import local_sync
from laggard.tracer.comm import CommMixin, TracedWork, _InComm  # noqa: F401 - TracedWork is public here too

try:  # op()'s common case compiled (laggard/tracer/_fastop.c): built where the install had a C compiler
    from laggard.tracer import _fastop

    _fastop.setup(LaggardError, time.perf_counter_ns, RECORD_BYTES)
except ImportError:  # the same path in Python: the same records, a few hundred ns more per op
    _fastop = None
# set (to anything but "" or "0") to time ops with the Python path even where the compiled one is built
PURE_PYTHON_ENV = "LAGGARD_TRACER_PURE_PYTHON"



def compiled_op_path() -> bool:
    """Whether new CPU-timed tracers take op()'s compiled fast path."""
    return _fastop is not None and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0")


class Tracer(SetupMixin, RecordMixin, CommMixin, GcMixin, PagingMixin):
    """Record a training loop's ops (see the module docstring).

    Create it on every rank after ``torch.distributed.init_process_group`` (it aligns clocks and
    gathers the parallel layout: collective calls every rank must make). Without torch.distributed
    it traces one process (pass ``rank``/``world_size`` to trace ranks launched another way).
    An unwritable directory or a full disk gives one warning and turns tracing off; the training
    goes on.

    Arguments: ``out_dir`` (None: a tracer that does nothing, no collectives either; every rank
    must agree), ``dp_rank``/``pp_rank``/``tp_rank``/``cp_rank`` (this rank's coordinates; job.json
    gets the sizes from all ranks'), ``timing`` (auto: CUDA events when CUDA is initialised, else
    ``perf_counter_ns``), ``record_gc`` (gc.callbacks; collections shorter than ``gc_min_us`` stay
    inside the op they interrupted), ``align`` (auto, pingpong, barrier, collective or
    None: see ``laggard.tracer.clock``; collective over the world group, at start-up only),
    ``flush_interval_s`` (hand the page to the writer at the end of a step this often),
    ``page_ops``/``num_pages`` (the memory bound: num_pages x page_ops records
    of 36 + 28 bytes), ``handle_signals`` (flush on SIGTERM), ``clock_ns`` (the local clock, for
    tests), ``meta_extra`` (added to job.json), ``record_every`` (record one step in N),
    ``flight_watchdog_s`` (with torch's Flight Recorder on,
    dump it when a step runs longer than this; it is also dumped on SIGTERM and on request: see
    ``laggard.tracer.flight``),
    ``monitor_url``/``token``/``monitor_job`` (also stream every page to a live-monitor collector (several
    comma-separated addresses: the next when one cannot be reached)
    under this job id, default ``name``, with a heartbeat and hang reports from a background thread:
    see ``laggard.tracer.stream``; ``monitor_config``: its ``StreamConfig``), ``abort_on_hang`` (True:
    when the collector's verdict on this job is a hang and this rank has not moved since, end its
    process group and exit with ``laggard.tracer.abort.HANG_EXIT_CODE``; None: only when the
    collector's ``hang`` rule says ``abort``; False, or no ``monitor_url``: never).
    """

    def __init__(
        self,
        out_dir: str | Path | None,
        *,
        name: str = "job",
        dp_rank: int | None = None,
        pp_rank: int = 0,
        tp_rank: int = -1,
        cp_rank: int = -1,
        rank: int | None = None,
        world_size: int | None = None,
        timing: str = "auto",
        record_gc: bool = True,
        gc_min_us: float = 0.0,
        align: str | None = "auto",
        flush_interval_s: float = 10.0,
        page_ops: int = 8192,
        num_pages: int = 4,
        handle_signals: bool = True,
        clock_ns: Callable[[], int] | None = None,
        meta_extra: dict[str, Any] | None = None,
        enabled: bool = True,
        record_every: int = 1,
        flight_watchdog_s: float | None = None,
        monitor_url: str | None = None,
        token: str | None = None,
        monitor_job: str | None = None,
        monitor_config: Any = None,
        abort_on_hang: bool | None = None,
    ) -> None:
        check_args(record_every=record_every, page_ops=page_ops, num_pages=num_pages, align=align, timing=timing)
        self._record_every = record_every
        self.out_dir = Path(out_dir) if out_dir is not None else None
        enabled = enabled and out_dir is not None
        self._clock = clock_ns or time.perf_counter_ns
        self.clock_ns = self._clock
        dist = _dist_if_initialized()
        self._identify(dist, rank, world_size, (dp_rank, pp_rank, tp_rank, cp_rank))
        self._init_counters()

        if not enabled:  # a tracer that does nothing at all (no collectives either)
            self.sync = local_sync(self._clock)
            return
        assert self.out_dir is not None
        layouts = self._startup_collectives(dist, align)
        use_cuda = self._init_timing(timing)
        self._state = self._initial_state()
        meta = self._write_job(name, layouts, use_cuda, record_gc=record_gc, gc_min_us=gc_min_us,
                               meta_extra=meta_extra)
        if meta is None:  # the directory cannot be written: tracing off, training goes on
            return
        self._init_pages(page_ops, num_pages)
        self._init_writer(name, meta, flush_interval_s=flush_interval_s)
        self._start_gc(record_gc=record_gc, gc_min_us=gc_min_us,
                       code=self._code("gc", "other", "cpu" if use_cuda else self._main_stream))
        self._pool: list[_CpuOpCtx] = []
        self._enabled = True
        self._plain = self._cuda is None  # the fast path of op(): CPU timing, tracing on
        if self._plain and compiled_op_path():
            # an instance attribute over the method: ``tracer.op`` is the compiled call, which hands
            # every other case (and every argument it does not take) to the method below
            self.op = _fastop.OpMethod(self, self.op)  # type: ignore[method-assign]
        _signals.register(self, handle_signals=handle_signals)
        self._flight = flight.attach(self, flight_watchdog_s)
        if monitor_url is not None:
            self._attach_monitor(monitor_url, token, job_id=monitor_job or name, meta=meta, config=monitor_config,
                                 abort_on_hang=abort_on_hang)

    # ------------------------------------------------------------------ public API
    @property
    def enabled(self) -> bool:
        """False when tracing is off (disabled, closed, or the directory could not be written)."""
        return self._enabled and self._writer.failed is None

    def now_ns(self) -> int:
        """The current time on the job's aligned timeline (ns since the Unix epoch, rank 0's clock)."""
        return self._clock() + self.sync.offset_ns

    def step(self, step: int) -> _StepCtx | _SkipCtx | _NullCtx:
        """Context for one training step; ops recorded between steps join the next step.

        With ``record_every=N`` only steps whose number is a multiple of N are recorded (the same
        on every rank); nothing is recorded during the others.
        """
        if not self._enabled:
            return _NULL
        if self._record_every > 1 and step % self._record_every:
            return _SkipCtx(self)
        return _StepCtx(self, int(step))

    # not keyword-only: CPython fills a missing keyword-only argument from a dict (4 lookups a call here), a
    # missing positional one from a tuple; pass them by keyword all the same
    def op(self, name: str, microbatch: int = -1, kind: str = "compute", num_tokens: int | None = None,
           seq_lens: list[int] | None = None, stream: str | None = None) -> _CpuOpCtx | _OpCtx | _NullCtx:
        """Context timing one op, e.g. ``with tracer.op("forward-compute", microbatch=j):`` (pass the
        arguments after ``name`` by keyword). The op starts at this call; ``with ... as x`` binds nothing
        useful (None on the fast path)."""
        if self._plain and kind == "compute" and stream is None and seq_lens is None:
            code = self._compute_code.get(name)
            if code is not None:  # the common case: a known compute op timed on the CPU (_CpuOpCtx)
                pool = self._pool
                c = pool.pop() if pool else _CpuOpCtx(self)
                c._code = code
                c._mb = microbatch
                c._ntok = -1 if num_tokens is None else num_tokens
                if self._gcq:
                    self._drain_gc()
                c._excl0 = self._excl_ns
                clock = self._clock  # an attribute: loaded as one, the call specialises
                c._start = clock()  # last: the op starts here (entering its block runs no Python)
                return c
        if not self._enabled or self._skip:
            return _NULL
        aux = None
        if kind == "compute" and stream is None:
            code = self._compute_code.get(name)
            if code is None:
                code = self._compute_code[name] = self._code(name, kind, self._main_stream)
        else:
            code = self._code(name, kind, stream or self._main_stream)
        if seq_lens is not None:
            aux = (-1, -1, -1, -1, Side(seq_lens=[int(x) for x in seq_lens]))
        ntok = -1 if num_tokens is None else num_tokens
        if self._cuda is not None:
            return self._op_cls(self, code, microbatch, ntok, aux)
        return _OpCtx(self, code, microbatch, ntok, aux)

    def record(self, name: str, start_ns: int, dur_ns: int, *, kind: str = "other", microbatch: int = -1) -> None:
        """Record an op timed elsewhere; ``start_ns`` on this tracer's local clock (``tracer.clock_ns``)."""
        if not self._enabled or self._skip:
            return
        code = self._code(name, kind, "cpu" if self._cuda is not None else self._main_stream)
        self._rec(code, microbatch, int(start_ns), int(dur_ns), -1, self._cpu_aux())
        self._excl_ns += int(dur_ns)

    def data(self, iterable: Iterable[Any], *, name: str = "data-wait") -> Iterator[Any]:
        """Wrap a DataLoader (any iterable): the wait for each item is recorded as an op."""
        it = iter(iterable)
        while True:
            if not self._enabled:
                yield from it
                return
            t0 = self._clock()
            try:
                item = next(it)
            except StopIteration:
                return
            self.record(name, t0, self._clock() - t0, kind="other")
            yield item

    def collective(self, name: str, *, group: Any = None, label: str | None = None, size_bytes: int | None = None,
                   microbatch: int = -1) -> _OpCtx | _NullCtx:
        """Context timing one collective you call yourself (all participants must use it)."""
        if not self._enabled or self._skip:
            return _NULL
        g = self._group_label(group) if label is None else label
        return _InComm(self, self._comm_ctx(name, "collective", g, -1, size_bytes, microbatch), name, "collective")

    def p2p(self, name: str, *, peer: int, send: bool, size_bytes: int | None = None,
            microbatch: int = -1) -> _OpCtx | _NullCtx:
        """Context timing one blocking point-to-point transfer with global rank ``peer``."""
        if not self._enabled or self._skip:
            return _NULL
        src, dst = (self.rank, peer) if send else (peer, self.rank)
        kind = "p2p_send" if send else "p2p_recv"
        return _InComm(self, self._comm_ctx(name, kind, f"p2p:{src}>{dst}", peer, size_bytes, microbatch), name, kind)

    def close(self, status: str = "closed") -> None:
        """Write everything recorded and stop; safe to call twice. Ops outside steps are dropped."""
        if self._closed:
            return
        self._closed = True
        if not self._enabled:
            return
        _signals.closing(+1)
        try:
            self._close(status)
        finally:
            _signals.closing(-1)

    def _close(self, status: str) -> None:
        self._enabled = self._plain = False
        self._stop_gc()
        if self._cuda is not None:
            self._cuda.torch.cuda.synchronize()
            self._resolve_cuda()
        if self._in_step:
            self._end_step(flush=False)
        self.num_ops_outside_steps_dropped += len(self._pending)
        self._pending.clear()
        self._hand_off()
        finished = self._writer.close()
        if self._stream is not None:
            self._stream.close()
        self._update_counts()
        self._writer.write_state(status if finished else "incomplete")
        _signals.unregister(self)
        if self._flight is not None:
            self._flight.stop()
        if self.num_ops_dropped:
            warnings.warn(f"laggard tracer (rank {self.rank}): dropped {self.num_ops_dropped} op(s) because the "
                          "writer fell behind (more num_pages or page_ops?)", LaggardWarning, stacklevel=2)

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.close("closed" if exc_type is None else f"failed: {exc_type.__name__}")
        return False

    def _begin_step(self, step: int) -> None:
        if self._in_step:
            raise LaggardError(f"Tracer.step({step}): step {self._step} is still open (steps do not nest)")
        if self._gcq:
            self._drain_gc()
        if self._cuda is not None:
            self._cuda.step_boundary()  # a new anchor for this step's GPU ops
        self._step = step
        self._in_step = True
        self._joins.clear()
        self._state["last_step_started"] = step
        if self._bstep != step:
            self._bounds.append((self._n, step))
            self._bstep = step
        self._room = self._cap if not self._joins else 0
        pending, self._pending = self._pending, []
        for args in pending:
            self._write(step, *args)

    def _end_step(self, *, flush: bool = True) -> None:
        self._end_step_gc()
        self._in_step = False
        self._room = 0
        self._seqs.clear()
        if self._cuda is not None:
            self._resolve_cuda()
        # a timed flush only when a free page is ready: flushing never makes the tracer drop ops
        if (flush and self._n and self._clock() - self._last_flush_ns >= self._flush_interval_ns
                and not self._free.empty()):
            self._hand_off()

    def _emergency_flush(self, status: str) -> None:
        """From the SIGTERM handler or watcher: write what was recorded, then stop recording."""
        abort.flush_now(self, status, close_stream=True)
