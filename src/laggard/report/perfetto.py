"""Chrome trace-event JSON of an analysis: the measured timeline beside the idealised replay.

The file opens in https://ui.perfetto.dev and chrome://tracing. Each timeline (``measured``: the
trace as recorded; ``ideal``: the replay with every op at its ideal duration; optionally
``replayed``: the replay with the measured durations, i.e. without launch gaps) gets one process
per worker, named e.g. "measured dp0/pp1 (rank 4)", with one thread per stream plus a "steps"
thread that spans each step. Ops are complete events (``"ph": "X"``, microseconds) named by op
type with ``args`` step, microbatch and op_id (and ``cat`` = the op kind). Replayed steps start
at 0 each, so they are laid end to end (cumulative step times) to give a continuous timeline.

Perfetto drops complete events that overlap on one thread without nesting; traced ops on one
stream sometimes overlap by a few microseconds (timer jitter). Such an op is shown starting where
the op before it ends, its end unchanged, and its args carry ``trimmed_us``.

Events are capped (``max_events``) with a ``LaggardWarning``, so a huge job gives a trace a browser
can still open: whole steps are kept, a run of them around the step with the highest slowdown (the
one a reader of the report looks for); a path ending in ``.gz`` is gzip-compressed.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import orjson

from laggard.errors import LaggardError, LaggardWarning

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis

TIMELINES = ("measured", "replayed", "ideal")
DEFAULT_TIMELINES = ("measured", "ideal")
MAX_EVENTS = 2_000_000
# Thread ids are unique over the whole trace and never 0 (viewers treat both specially): with
# S streams, process p has tid p*(S+1) for its "steps" thread and p*(S+1)+1+i for stream i.
CHUNK = 100_000  # events built and serialised at a time


def write_perfetto(
    result: Analysis,
    path: str | Path,
    *,
    timelines: Sequence[str] = DEFAULT_TIMELINES,
    max_events: int = MAX_EVENTS,
) -> Path:
    """Write the trace-event JSON of ``result`` to ``path`` (gzip when it ends in ``.gz``).

    Events are built and written in chunks, so memory stays bounded by the chunk size.
    """
    p = Path(path)
    with _no_gc():
        meta, chunks, other = _build(result, timelines, max_events)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "wb") as raw:
                out: BinaryIO = raw
                if p.suffix == ".gz":
                    out = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3, mtime=0)  # type: ignore[assignment]
                out.write(b'{"traceEvents":')
                out.write(orjson.dumps(meta)[:-1])
                sep = b"," if meta else b""
                for chunk in chunks:
                    if chunk:
                        out.write(sep + orjson.dumps(chunk)[1:-1])
                        sep = b","
                out.write(b'],"displayTimeUnit":"ms","otherData":' + orjson.dumps(other) + b"}")
                if out is not raw:
                    out.close()
        except OSError as e:
            raise LaggardError(f"{p}: cannot write the Perfetto trace ({e.strerror or e})") from None
    return p


def trace_events(
    result: Analysis,
    *,
    timelines: Sequence[str] = DEFAULT_TIMELINES,
    max_events: int = MAX_EVENTS,
) -> dict[str, Any]:
    """The trace as a JSON-ready dict: ``traceEvents`` (metadata first), ``otherData``."""
    with _no_gc():
        meta, chunks, other = _build(result, timelines, max_events)
        events = list(meta)
        for chunk in chunks:
            events += chunk
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Hundreds of thousands of small dicts: the cyclic GC would triple the time to build them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _build(
    result: Analysis, timelines: Sequence[str], max_events: int
) -> tuple[list[dict[str, Any]], Iterator[list[dict[str, Any]]], dict[str, str]]:
    """(metadata events, chunks of op and step events, otherData); checks run before returning."""
    bad = [t for t in timelines if t not in TIMELINES]
    if bad or not timelines:
        raise LaggardError(f"unknown timeline(s) {bad} (choose from {', '.join(TIMELINES)})")
    timelines = list(dict.fromkeys(timelines))
    base = result.base
    if base is None:
        raise LaggardError("the analysis carries no op table; cannot write a Perfetto trace")
    g = base.graph
    job = base.job
    # workers, ordered by (dp, pp, rank): process index within a timeline
    ranks, first, worker = np.unique(base.rank, return_index=True, return_inverse=True)
    w_dp, w_pp = base.dp_rank[first], base.pp_rank[first]
    order = np.lexsort((ranks, w_pp, w_dp))
    w_pos = np.empty(len(ranks), dtype=np.int64)
    w_pos[order] = np.arange(len(ranks))
    num_w = len(ranks)
    stream_code, streams = job.codes("stream")
    local_tid = stream_code.astype(np.int64) + 1  # 0 is the steps thread
    stride = len(streams) + 1
    op_step = g.op_step.astype(np.int64)
    num_steps = len(g.steps)

    # metadata: process names per timeline x worker, thread names for the streams each worker has
    threads = np.unique(w_pos[worker] * stride + local_tid)
    meta: list[dict[str, Any]] = []
    for k, tl in enumerate(timelines):
        for w in range(num_w):
            i = order[w]
            p = w + k * num_w + 1
            label = f"{tl} dp{int(w_dp[i])}/pp{int(w_pp[i])} (rank {int(ranks[i])})"
            t = p * stride
            meta.append({"name": "process_name", "ph": "M", "pid": p, "tid": t, "args": {"name": label}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": p, "tid": t, "args": {"sort_index": p}})
            meta.append({"name": "thread_name", "ph": "M", "pid": p, "tid": t, "args": {"name": "steps"}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": p, "tid": t, "args": {"sort_index": 0}})
        for key in threads.tolist():
            w, lt = divmod(key, stride)
            p = w + k * num_w + 1
            t = p * stride + lt
            meta.append({"name": "thread_name", "ph": "M", "pid": p, "tid": t, "args": {"name": str(streams[lt - 1])}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": p, "tid": t, "args": {"sort_index": lt}})

    # whole steps under the cap: per step, one event per op and one step span per worker, per timeline
    ops_per_step = np.bincount(op_step, minlength=num_steps)
    spans_per_step = np.bincount(np.unique(op_step * num_w + worker) // num_w, minlength=num_steps)
    per_step = (ops_per_step + spans_per_step) * len(timelines)
    per_step_s = np.array(list(result.per_step.values()), dtype=float)  # S per step, in step order
    worst = int(np.argmax(np.where(np.isfinite(per_step_s), per_step_s, 0.0))) if num_steps else 0
    lo, hi = step_window(per_step, max_events - len(meta), worst)
    if hi - lo < num_steps:
        warnings.warn(
            f"Perfetto trace: {int(per_step.sum()) + len(meta):,} events exceed the cap of {max_events:,}; "
            f"wrote {hi - lo} of {num_steps} steps ({g.steps[lo]}-{g.steps[hi - 1]}, around step {g.steps[worst]}, "
            "the one with the highest slowdown); use --steps to choose others",
            LaggardWarning,
            stacklevel=3,
        )
    other = {
        "generator": "laggard",
        "job": result.meta.name,
        "source": result.meta.source,
        "timelines": ", ".join(timelines),
        "slowdown": f"{result.slowdown:.4f}",
        "steps": f"{hi - lo} of {num_steps} ({g.steps[lo]}-{g.steps[hi - 1]})" if num_steps else "0",
        "note": "replayed timelines lay the steps end to end; measured times are relative to the first op",
    }
    sel = np.flatnonzero((op_step >= lo) & (op_step < hi))
    return meta, _chunks(result, timelines, sel, w_pos[worker], local_tid, stride), other


def step_window(events_per_step: np.ndarray, budget: int, around: int) -> tuple[int, int]:
    """The steps [lo, hi) kept under ``budget`` events: ``around`` and its neighbours, one step
    later then one earlier while they fit (at least ``around`` itself)."""
    n = len(events_per_step)
    if n == 0:
        return 0, 0
    lo, hi = around, around + 1
    used = int(events_per_step[around])
    while True:
        grew = False
        for side in (1, -1):
            k = hi if side == 1 else lo - 1
            if 0 <= k < n and used + int(events_per_step[k]) <= budget:
                used += int(events_per_step[k])
                lo, hi = (lo, hi + 1) if side == 1 else (lo - 1, hi)
                grew = True
        if not grew:
            return lo, hi


def _spans(result: Analysis, timeline: str) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (integer ns) of every op in one timeline."""
    assert result.base is not None
    base, g = result.base, result.base.graph
    if timeline == "measured":
        start_ns = base.job.column("start_ns").astype(np.int64)
        s = start_ns - (int(start_ns.min()) if len(start_ns) else 0)
        return s, s + base.job.column("dur_ns").astype(np.int64)
    from laggard.engine.replay import op_starts

    ends = result.timelines()[0 if timeline == "replayed" else 1]
    starts = op_starts(g, ends)
    op_step = g.op_step
    step_len = np.zeros(len(g.steps))
    np.maximum.at(step_len, op_step, ends)
    offset = np.concatenate([[0.0], np.cumsum(step_len)[:-1]])[op_step]
    s = np.rint((starts + offset) * 1e9).astype(np.int64)
    return s, np.maximum(np.rint((ends + offset) * 1e9).astype(np.int64), s)


def _chunks(
    result: Analysis, timelines: list[str], sel: np.ndarray, wp_all: np.ndarray, local_tid: np.ndarray, stride: int
) -> Iterator[list[dict[str, Any]]]:
    """Op events (CHUNK at a time), then step spans, for each timeline."""
    assert result.base is not None
    base, g, job = result.base, result.base.graph, result.base.job
    num_w = int(wp_all.max()) + 1 if len(wp_all) else 0
    names = np.array(base.names, dtype=object)[base.name_code[sel]]
    kinds = np.array(base.kinds, dtype=object)[base.kind_code[sel]]
    op_step = g.op_step[sel].astype(np.int64)
    step_no = g.steps[op_step]
    mb = job.column("microbatch")[sel]
    mb_obj = mb.astype(object)
    mb_obj[mb < 0] = None
    op_id = job.column("op_id")[sel]
    vchunk = job.column("vchunk")[sel]
    with_chunk = result.meta.vpp_size > 1 or len(np.unique(vchunk[vchunk >= 0])) > 1
    lt, wp = local_tid[sel], wp_all[sel]
    for k, tl in enumerate(timelines):
        s_all, e_all = _spans(result, tl)
        s, e = s_all[sel], e_all[sel]
        pid = wp + k * num_w + 1
        tid = pid * stride + lt
        s, trimmed = _denest(s, e, tid)
        for a in range(0, len(sel), CHUNK):
            z = slice(a, a + CHUNK)
            yield _op_events(names[z], kinds[z], s[z], e[z], pid[z], tid[z], step_no[z], mb_obj[z], op_id[z],
                             vchunk[z] if with_chunk else None, trimmed[z])
        yield _step_events(s, e, wp, op_step, g.steps, k * num_w + 1, num_w, stride)


def _denest(start: np.ndarray, end: np.ndarray, thread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Make events on each thread nest: an op that starts inside an earlier op but ends after it
    starts where the earlier one ends. Returns (new starts, trimmed ns per op)."""
    if not len(start):
        return start, np.zeros(0, dtype=np.int64)
    o = np.lexsort((end, start, thread))
    s, e, th = start[o], end[o], thread[o]
    grp = np.concatenate([[0], np.cumsum(th[1:] != th[:-1])])
    lo = int(s.min())
    span = int(e.max()) - lo + 1
    # offsetting each thread by a multiple of the span makes one running maximum restart per thread
    key = (e - lo) + grp * span
    run = np.maximum.accumulate(key)
    prev = np.concatenate([[-1], run[:-1]]) - grp * span + lo
    prev[np.concatenate([[True], grp[1:] != grp[:-1]])] = np.iinfo(np.int64).min
    bad = (s < prev) & (e > prev)
    new_s = s.copy()
    new_s[bad] = prev[bad]
    out = np.empty_like(start)
    out[o] = new_s
    return out, out - start


def _op_events(
    names: np.ndarray,
    kinds: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    step_no: np.ndarray,
    mb: np.ndarray,
    op_id: np.ndarray,
    chunk: np.ndarray | None,
    trimmed: np.ndarray,
) -> list[dict[str, Any]]:
    ts = (start_ns / 1e3).tolist()
    dur = ((end_ns - start_ns) / 1e3).tolist()
    cols = (names.tolist(), kinds.tolist(), ts, dur, pid.tolist(), tid.tolist(), step_no.tolist(), mb.tolist(),
            op_id.tolist())
    if chunk is None:
        ev = [
            {"name": nm, "cat": kd, "ph": "X", "ts": t, "dur": d, "pid": p, "tid": th,
             "args": {"step": st, "microbatch": m, "op_id": oi}}
            for nm, kd, t, d, p, th, st, m, oi in zip(*cols, strict=True)
        ]
    else:
        ev = [
            {"name": nm, "cat": kd, "ph": "X", "ts": t, "dur": d, "pid": p, "tid": th,
             "args": {"step": st, "microbatch": m, "chunk": c, "op_id": oi}}
            for nm, kd, t, d, p, th, st, m, oi, c in zip(*cols, chunk.tolist(), strict=True)
        ]
    for i in np.flatnonzero(trimmed).tolist():
        ev[i]["args"]["trimmed_us"] = float(trimmed[i]) / 1e3
    return ev


def _step_events(
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    wp: np.ndarray,
    op_step: np.ndarray,
    steps: np.ndarray,
    pid0: int,
    num_w: int,
    stride: int,
) -> list[dict[str, Any]]:
    """One span per (worker, step) on the worker's "steps" thread: first op start to last op end."""
    if not len(start_ns):
        return []
    uk, inv = np.unique(op_step * num_w + wp, return_inverse=True)
    lo = np.full(len(uk), np.iinfo(np.int64).max)
    hi = np.full(len(uk), np.iinfo(np.int64).min)
    np.minimum.at(lo, inv, start_ns)
    np.maximum.at(hi, inv, end_ns)
    st, w = uk // num_w, uk % num_w
    lo, _ = _denest(lo, hi, w)  # steps that overlap (e.g. an optimizer running into the next step)
    return [
        {"name": f"step {s}", "cat": "step", "ph": "X", "ts": a / 1e3, "dur": (b - a) / 1e3, "pid": p,
         "tid": p * stride, "args": {"step": s}}
        for s, a, b, p in zip(steps[st].tolist(), lo.tolist(), hi.tolist(), (w + pid0).tolist(), strict=True)
    ]


__all__ = ["DEFAULT_TIMELINES", "MAX_EVENTS", "TIMELINES", "trace_events", "write_perfetto"]
