"""The Tracer's start-up: its rank and layout, its counters, the start-up collectives (clock
alignment, every rank's layout), the timing backend, the state file's first content, the trace
directory with its job file, the background writer and the live-monitor stream. A mixin of
``laggard.tracer.Tracer``, called from its ``__init__`` in this order."""

from __future__ import annotations

import os
import socket
import warnings
from collections import deque
from typing import Any

from laggard.errors import LaggardWarning
from laggard.tracer._contexts import _OpCtx
from laggard.tracer._env import _cuda_in_use, _job_meta, host_identity, prepare_dir
from laggard.tracer._writer import ShardWriter
from laggard.tracer.clock import ClockSync, align_clocks, local_sync


class SetupMixin:
    def _identify(self, dist: Any, rank: int | None, world_size: int | None,
                  coords: tuple[int | None, int, int, int]) -> None:
        """Rank and world size (from torch.distributed unless given) and the (dp, pp, tp, cp) layout."""
        if dist is not None:
            self.rank = dist.get_rank() if rank is None else rank
            self.world_size = dist.get_world_size() if world_size is None else world_size
        else:
            self.rank = 0 if rank is None else rank
            self.world_size = 1 if world_size is None else world_size
        dp_rank, pp_rank, tp_rank, cp_rank = coords
        self.layout = (self.rank if dp_rank is None else dp_rank, pp_rank, tp_rank, cp_rank)

    def _init_counters(self) -> None:
        """Step state, queues and counters (a disabled tracer has them too)."""
        self._skip = False
        self._closed = False
        self._enabled = self._plain = False
        self._in_step = False
        self._step = -1
        self._seqs: dict[int, int] = {}
        self._gcq: deque[tuple[int, int, int]] = deque(maxlen=100_000)
        self._excl_ns = 0
        self._pending: list[tuple] = []
        self._joins: list[int] = []
        self.num_ops_recorded = 0
        self.num_ops_dropped = 0
        self.num_ops_outside_steps_dropped = 0
        self._flight: Any = None  # Flight Recorder dumps (laggard.tracer.flight), when torch's recorder is on
        self._stream: Any = None  # the live-monitor stream (laggard.tracer.stream), with monitor_url
        self._ncalls: dict[int, int] = {}  # group code -> communication calls so far (all steps: a hang's seq)
        self._comm_last: dict[str, str] = {}  # group label -> the name of its last blocking call
        self._in_comm: dict[str, Any] | None = None  # the blocking communication the main thread is in
        # > 0 while a communication this tracer records runs: the torch.distributed calls inside it
        # belong to that op, and zero-code capture (laggard.tracer.auto) must not record them again
        self._comm_depth = 0

    def _startup_collectives(self, dist: Any, align: str | None) -> list[Any]:
        """Clock alignment and every rank's layout: every rank takes part whatever happens to its
        directory (a rank that then cannot write must not leave the others hanging)."""
        if dist is not None and align:
            self.sync: ClockSync = align_clocks(self._clock, method=align)
        else:
            self.sync = local_sync(self._clock)
        ids = host_identity()  # where this rank runs (job.json's hosts: the fleet's per-host view)
        if dist is None:
            return [(self.rank, *self.layout, ids)]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (self.rank, *self.layout, ids))
        return sorted(gathered, key=lambda row: row[0])

    def _init_timing(self, timing: str) -> bool:
        """CUDA events (``cuda``, or ``auto`` with CUDA in use) or host clocks; True for CUDA."""
        use_cuda = timing == "cuda" or (timing == "auto" and _cuda_in_use())
        self._cuda: Any = None
        self._op_cls: type[_OpCtx] = _OpCtx
        if use_cuda:
            from laggard.tracer.cuda import CudaTiming, _CudaOpCtx

            self._cuda, self._op_cls = CudaTiming(self._clock), _CudaOpCtx
        self._main_stream = "gpu" if use_cuda else "main"
        return use_cuda

    def _initial_state(self) -> dict[str, Any]:
        """The rank's state file content at start (status.json)."""
        return {
            "rank": self.rank, "world_size": self.world_size,
            "layout": dict(zip(("dp", "pp", "tp", "cp"), self.layout, strict=True)),
            "pid": os.getpid(), "host": socket.gethostname(), "status": "running",
            "num_ops_recorded": 0, "num_ops_dropped": 0, "last_step_started": None,
            "clock_offset_ns": self.sync.offset_ns, "clock_error_ns": self.sync.error_ns,
        }

    def _write_job(self, name: str, layouts: list[Any], use_cuda: bool, *, record_gc: bool, gc_min_us: float,
                   meta_extra: dict[str, Any] | None) -> dict[str, Any] | None:
        """The trace directory prepared and the job's metadata written (returned); None, with a
        warning, when the directory cannot be written."""
        # what the diagnosis may rely on: with record_gc every collection is an op (a stall with none in it is not GC)
        gc_meta = {"record_gc": bool(record_gc), "gc_min_us": float(gc_min_us)}
        meta = _job_meta(name, layouts, self.world_size, self.sync, use_cuda,
                         {**(meta_extra or {}), **gc_meta}).to_json()
        try:
            prepare_dir(self.out_dir, self.rank, self.world_size, self._state, meta)
        except OSError as e:
            warnings.warn(
                f"laggard tracer (rank {self.rank}): cannot write the trace to {self.out_dir} "
                f"({e.strerror or e}); tracing is disabled, training goes on",
                LaggardWarning,
                stacklevel=3,
            )
            return None
        return meta

    def _init_writer(self, name: str, meta: dict[str, Any], *, flush_interval_s: float) -> None:
        """The background shard writer."""
        assert self.out_dir is not None
        self._flush_interval_ns = int(flush_interval_s * 1e9)
        self._last_flush_ns = self._clock()
        self._writer = ShardWriter(self.out_dir, rank=self.rank, layout=self.layout, offset_ns=self.sync.offset_ns,
                                   on_page_free=self._page_free, state=self._state)

    def _attach_monitor(self, url: str, token: str | None, *, job_id: str, meta: dict[str, Any], config: Any,
                        abort_on_hang: bool | None) -> None:
        """The live monitor (``laggard.tracer.stream``): pages, heartbeats and hang reports to the
        collector at ``url``, a page a second at most, the first step's at once."""
        from laggard.tracer.stream import attach

        self._stream = attach(self, url, token, job_id=job_id, meta=meta, config=config, abort_on_hang=abort_on_hang)
        self._flush_interval_ns = min(self._flush_interval_ns, 1_000_000_000)
        self._last_flush_ns -= self._flush_interval_ns
