"""Flight Recorder dumps when it matters: on SIGTERM, on a per-step watchdog timeout, on request.

PyTorch's Flight Recorder keeps a ring buffer of the last N collectives per rank (every backend,
gloo included, in torch 2.13). It is on when ``TORCH_FR_BUFFER_SIZE`` (or the older
``TORCH_NCCL_TRACE_BUFFER_SIZE``) is a positive number **when the process group is created**;
``torch._C._distributed_c10d._dump_fr_trace()`` returns the buffer as a pickle (``..._json()``
as JSON); CUDA builds keep NCCL's entries apart, in ``_dump_nccl_trace()`` (``read_buffers``).
On gloo a dump names no rank, its ``pg_config`` is empty and point-to-point transfers are not
recorded at all; a collective that timed out is ``retired`` like one that completed
(``retired: False`` only until the error reaches the caller); and asking for the collectives'
Python stacks from any thread but the main one blocks forever (this module asks only there).

So a dump written here adds what the analysis (``laggard hang``) needs to stand on its own:
``pg_config`` with the ranks of every process group (the form NCCL dumps use, which torch's own
``fr_trace`` reads too) and a ``laggard`` key with the rank, world size, job id, the reason and
time of the dump, where the main thread is (in a collective or p2p call with its peer, in data
loading, in compute: from its Python stack) and the last op the tracer recorded. Files are
``flight-rank{R}.pkl`` (or ``.json``) in the trace directory; a later dump replaces an earlier one.

``attach`` is called by ``Tracer`` (when the Flight Recorder is on); ``FlightDumper`` can be used
on its own. Dumps come from: ``dump()``; SIGTERM (the tracer's emergency flush); the watchdog
thread, when a step has run longer than ``watchdog_s``; and the request file
``flight-dump-request`` appearing in the trace directory (what ``laggard monitor`` creates to ask
a job for a dump; the thread deletes it and dumps). Only this module imports torch for that.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laggard.errors import LaggardWarning
from laggard.optable.tracedir import FLIGHT_DUMP_KEY, FLIGHT_REQUEST_FILE, flight_name

ENV_BUFFER = "TORCH_FR_BUFFER_SIZE"
ENV_BUFFER_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"
DUMP_KEY = FLIGHT_DUMP_KEY  # the extra key of a laggard-written dump (torch's readers ignore it)
DUMP_FORMAT = 1
REQUEST_FILE = FLIGHT_REQUEST_FILE
_COLLECTIVES = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
                "barrier", "all_gather_object", "broadcast_object_list", "monitored_barrier"}
_P2P = {"send": "p2p_send", "recv": "p2p_recv", "isend": "p2p_send", "irecv": "p2p_recv",
        "batch_isend_irecv": "p2p"}


@dataclass(kw_only=True, slots=True)
class FlightConfig:
    watchdog_s: float | None = None  # dump when one step runs longer than this; None: no watchdog
    poll_s: float = 0.2  # how often the thread looks at the step and the request file: a dump comes
    # within a fraction of a second of the watchdog time, and a wake-up 5x a second costs nothing
    fmt: str = "pickle"  # pickle (what torch's fr_trace reads) or json
    max_frames: int = 40  # frames of the main thread's stack kept in a dump (enough to see the caller)


def buffer_size() -> int:
    """The Flight Recorder's buffer size from the environment (0: off)."""
    raw = os.environ.get(ENV_BUFFER, os.environ.get(ENV_BUFFER_OLD, "0"))
    try:
        return int(raw)
    except ValueError:
        return 0


def enable(num_entries: int = 2000) -> None:
    """Turn the Flight Recorder on for process groups created after this (keeps a size already set)."""
    if buffer_size() <= 0:
        os.environ[ENV_BUFFER] = str(int(num_entries))


def _group_configs(dist: Any) -> dict[str, dict[str, str]]:
    """pg_config as NCCL dumps have it: group name -> name, description, ranks (global)."""
    c10d = dist.distributed_c10d
    out: dict[str, dict[str, str]] = {}
    try:
        world = c10d._world  # noqa: SLF001 - the only place the group -> ranks map lives
        for pg, name in world.pg_names.items():
            ranks = sorted(world.pg_group_ranks.get(pg, {}))
            desc = getattr(pg, "group_desc", "") or ""
            out[str(name)] = {"name": str(name), "desc": str(desc), "ranks": str(ranks)}
    except (AttributeError, RuntimeError):
        pass
    return out


def _job_id(dist: Any, world_size: int) -> str:
    """The same id on every rank of one job: rank 0 puts a fresh one in the rendezvous store."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run:
        return f"elastic:{run}"
    try:
        store = dist.distributed_c10d._get_default_store()  # noqa: SLF001
        if dist.get_rank() == 0:
            store.set("laggard/flight-job-id", f"{os.getpid()}-{time.time_ns()}-{world_size}")
        return "store:" + store.get("laggard/flight-job-id").decode()
    except (AttributeError, RuntimeError, ValueError):
        return f"env:{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}:{world_size}"


def where(thread_id: int | None = None, max_frames: int = 40) -> dict[str, Any]:
    """What a thread (default: the main thread) is doing now, from its Python stack.

    ``state`` is ``collective`` / ``p2p_send`` / ``p2p_recv`` / ``p2p`` (inside a torch.distributed
    call, with ``op`` and ``peer`` when known), ``data`` (in a DataLoader or ``Tracer.data``) or
    ``compute`` (anything else), with ``at`` = the innermost frame outside torch and laggard.
    """
    tid = threading.main_thread().ident if thread_id is None else thread_id
    frame = sys._current_frames().get(tid)  # noqa: SLF001 - the documented way to see another thread
    frames: list[tuple[str, int, str, Any]] = []
    while frame is not None and len(frames) < max_frames:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, frame))
        frame = frame.f_back
    out: dict[str, Any] = {"state": "unknown", "stack": [f"{f}:{ln} in {fn}" for f, ln, fn, _ in frames]}
    if not frames:
        return out
    out["state"] = "compute"
    for fn_path, ln, name, fr in frames:  # innermost first
        if "torch/utils/data" in fn_path or (fn_path.endswith("laggard/tracer/core.py") and name == "data"):
            out["state"] = "data"
        if fn_path.endswith("laggard/tracer/comm.py") and name == "wait":
            work = fr.f_locals.get("self")
            aux = getattr(work, "_aux", None)
            if aux is not None:
                out.update(state="p2p" if aux[3] >= 0 else "collective", op="wait", peer=int(aux[3]))
        if "torch/distributed/" in fn_path and (name in _COLLECTIVES or name in _P2P):
            loc = fr.f_locals
            out["state"] = _P2P.get(name, "collective")
            out["op"] = name
            peer = loc.get("dst", loc.get("src")) if name in _P2P else None
            if isinstance(peer, int):
                out["peer"] = peer
            group = getattr(loc.get("group"), "group_name", None)
            out["group"] = "0" if loc.get("group") is None else str(group)
        if "at" not in out and "site-packages" not in fn_path and "/laggard/" not in fn_path \
                and not fn_path.startswith((sys.prefix, sys.base_prefix, "<")):
            out["at"] = f"{fn_path}:{ln} in {name}"
    return out


def _last_op(tracer: Any) -> dict[str, Any] | None:
    """The tracer's last recorded op (read without locks: a snapshot is good enough for a dump)."""
    page, n = getattr(tracer, "_page", None), getattr(tracer, "_n", 0)
    if page is None or n <= 0:
        return None
    for i in range(n - 1, max(n - 9, -1), -1):  # the zero-length gc op closing each step says nothing
        rec = page[i]
        try:
            name, kind, _stream = tracer._optypes[int(rec["optype"])]  # noqa: SLF001
        except (IndexError, AttributeError):
            return None
        if name != "gc" or rec["dur_ns"] > 0:
            break
    end_ns = int(rec["start_ns"]) + int(rec["dur_ns"]) + int(tracer.sync.offset_ns)
    return {"name": name, "kind": kind, "end_unix_ns": end_ns}


def state(tracer: Any, reason: str, *, rank: int, world_size: int, job_id: str | None = None,
          max_frames: int = 40) -> dict[str, Any]:
    """The ``laggard`` key of a dump (and, alone, a rank's hang report with the recorder off): who,
    when, where the main thread is, the tracer's step, last op, the blocking communication the main
    thread is in (``comm``) and each group's call count (``group_calls``; ``laggard.hang`` lines
    them up across ranks when there is no Flight Recorder)."""
    extra: dict[str, Any] = {
        "format": DUMP_FORMAT, "rank": rank, "world_size": world_size, "job_id": job_id, "reason": reason,
        "dump_unix_ns": time.time_ns(), "pid": os.getpid(), "where": where(max_frames=max_frames),
    }
    t = tracer
    if t is not None:  # read without locks: a snapshot is good enough
        extra["step"] = int(t._step)  # noqa: SLF001
        extra["in_step"] = bool(t._in_step)  # noqa: SLF001
        extra["last_op"] = _last_op(t)
        extra["progress"] = progress(t)
        groups = list(getattr(t, "_groups", []))
        extra["group_calls"] = {groups[g]: n for g, n in dict(t._ncalls).items() if g < len(groups)}  # noqa: SLF001
        extra["group_last"] = dict(t._comm_last)  # noqa: SLF001
        extra["comm"] = t._in_comm  # noqa: SLF001
    return extra


def progress(tracer: Any) -> int:
    """Ops the tracer has recorded so far (a rank that records none is not moving)."""
    return int(getattr(tracer, "_first_op", 0)) + int(getattr(tracer, "_n", 0)) + int(tracer.num_ops_dropped)


def report(tracer: Any, reason: str) -> dict[str, Any]:
    """A rank's hang report for the collector: its Flight Recorder dump (also written to the trace
    directory, as any dump) or, with the recorder off, a dump with no entries and the tracer's
    state (``fr: false``), also written as ``flight-rank{R}.json`` so ``laggard hang`` on the trace
    directory gives the same verdict."""
    fd = getattr(tracer, "_flight", None)
    data = fd.snapshot(reason) if fd is not None else None
    if data is not None:
        data[DUMP_KEY]["fr"] = True
        fd.dump(reason, data)
        return data
    data = {"version": "laggard-tracer-state", "entries": [], "pg_config": {},
            DUMP_KEY: {**state(tracer, reason, rank=tracer.rank, world_size=tracer.world_size), "fr": False}}
    if tracer.out_dir is not None:
        import json

        path = Path(tracer.out_dir) / flight_name(tracer.rank, "json")
        try:
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, default=str))
            os.replace(tmp, path)
        except OSError:
            pass  # the collector still gets it
    return data


class FlightDumper:
    """Writes Flight Recorder dumps of this rank into ``out_dir`` (see the module docstring)."""

    def __init__(self, out_dir: str | Path, *, tracer: Any = None, rank: int | None = None,
                 world_size: int | None = None, config: FlightConfig | None = None) -> None:
        import torch.distributed as dist

        self.out_dir = Path(out_dir)
        self.config = config or FlightConfig()
        self.tracer = tracer
        init = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if init else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if init else 1)
        self.job_id = _job_id(dist, self.world_size) if init else f"pid:{os.getpid()}"
        self._dist = dist
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_dumps = 0
        self.path = self.out_dir / flight_name(self.rank, self.config.fmt)

    def snapshot(self, reason: str = "request") -> dict[str, Any] | None:
        """The buffer now, with ``pg_config`` and the ``laggard`` key; None (one warning) when unreadable."""
        import torch

        c10d = torch._C._distributed_c10d  # noqa: SLF001 - torch's documented dump entry points
        try:
            # the collectives' Python stacks are symbolised only on the main thread: from any
            # other thread (the watchdog, the SIGTERM watcher) asking for them blocks forever
            stacks = threading.current_thread() is threading.main_thread()
            data = read_buffers(c10d, stacks)
        except (RuntimeError, AttributeError, pickle.UnpicklingError) as e:
            warnings.warn(f"laggard flight recorder (rank {self.rank}): cannot read the buffer ({e})",
                          LaggardWarning, stacklevel=2)
            return None
        configs = _group_configs(self._dist)
        if configs:
            data["pg_config"] = configs
        data[DUMP_KEY] = state(self.tracer, reason, rank=self.rank, world_size=self.world_size, job_id=self.job_id,
                               max_frames=self.config.max_frames)
        return data

    def dump(self, reason: str = "request", data: dict[str, Any] | None = None) -> Path | None:
        """Write the buffer now (or ``data``, a ``snapshot``); None (with one warning) when it cannot be read
        or written."""
        with self._lock:
            if data is None:
                data = self.snapshot(reason)
            if data is None:
                return None
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
                if self.config.fmt == "json":
                    import json

                    tmp.write_text(json.dumps(data, default=str))
                else:
                    tmp.write_bytes(pickle.dumps(data))
                os.replace(tmp, self.path)
            except OSError as e:
                warnings.warn(f"laggard flight recorder (rank {self.rank}): cannot write {self.path} "
                              f"({e.strerror or e})", LaggardWarning, stacklevel=2)
                return None
            self.num_dumps += 1
            return self.path

    # ------------------------------------------------------------------ the watchdog thread
    def start(self) -> FlightDumper:
        """Start the thread that dumps on a step timeout and on the request file."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name=f"laggard-flight-rank{self.rank}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def _watch(self) -> None:
        cfg = self.config
        request = self.out_dir / REQUEST_FILE
        key: tuple[int, bool] | None = None
        since = time.monotonic()
        dumped_for: tuple[int, bool] | None = None
        while not self._stop.wait(cfg.poll_s):
            if request.exists():
                try:
                    request.unlink()
                except OSError:
                    pass
                self.dump("request")
            t = self.tracer
            if cfg.watchdog_s is None or t is None:
                continue
            now_key = (int(t._step), bool(t._in_step))  # noqa: SLF001
            if now_key != key:
                key, since = now_key, time.monotonic()
            elif now_key[1] and dumped_for != now_key and time.monotonic() - since > cfg.watchdog_s:
                dumped_for = now_key
                self.dump(f"watchdog: step {now_key[0]} ran over {cfg.watchdog_s:g} s")


def read_buffers(c10d: Any, stacks: bool) -> dict[str, Any]:
    """Torch's recorders, as one dump. CUDA builds keep NCCL's collectives in a recorder of their own
    (``_dump_nccl_trace``; seen on torch 2.11+cu130: ``_dump_fr_trace`` then holds only the other
    backends' entries, none for an NCCL job); both are read and their entries merged in creation order."""
    data = pickle.loads(c10d._dump_fr_trace(includeStackTraces=stacks))  # noqa: S301 - our own bytes
    dump_nccl = getattr(c10d, "_dump_nccl_trace", None)
    if dump_nccl is None:
        return data
    nccl = pickle.loads(dump_nccl(includeStackTraces=stacks))  # noqa: S301
    if not nccl.get("entries"):
        return data
    entries = sorted([*(data.get("entries") or []), *nccl["entries"]], key=lambda e: e.get("time_created_ns", 0))
    merged = {k: {**(data.get(k) or {}), **(nccl.get(k) or {})} for k in ("pg_config", "pg_status")}
    return {**data, **nccl, "entries": entries, **merged}


def attach(tracer: Any, watchdog_s: float | None) -> FlightDumper | None:
    """The tracer's dumper (started), or None when the Flight Recorder is off or torch.distributed is not up."""
    if buffer_size() <= 0 or tracer.out_dir is None:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return FlightDumper(tracer.out_dir, tracer=tracer, rank=tracer.rank, world_size=tracer.world_size,
                        config=FlightConfig(watchdog_s=watchdog_s)).start()
