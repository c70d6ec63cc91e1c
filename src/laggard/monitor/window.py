"""Sliding-window analysis of one running job: the same ``laggard.whatif.core.analyze`` as ``laggard analyze``.

A job's batches arrive per rank, in any order. A step is *complete* when every rank of the job has
reported ops of a later step. After each ``refresh_every_steps`` completed steps the last
``window_steps`` complete steps are cut from the batches held in memory into one op table, a
``Job`` is built from it and analyzed: the document served is ``Analysis.to_json()``, exactly what
``laggard analyze --json`` writes for those ops. Per worker a chronic score (EWMA of S_w over
windows) sits beside the current S_w. A rank silent for ``hang_after_s`` while the others move on
is reported as "hang suspected" with the last op it recorded.
"""

from __future__ import annotations

import bisect
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from laggard.engine.selection import nan_median
from laggard.errors import LaggardError, LaggardWarning
from laggard.monitor.config import MonitorConfig
from laggard.monitor.hangs import HangCase
from laggard.optable.ops import Job, JobMeta, to_numpy, unique_inverse
from laggard.report.wording import finding_text
from laggard.wire.batch import PackSlice

if TYPE_CHECKING:
    from laggard.analysis.config import AnalysisConfig


@dataclass(kw_only=True, slots=True)
class RankState:
    last_step: int = -1
    last_seen_s: float = 0.0
    last_batch: pa.Table | None = None  # the batch holding the rank's latest step (read on demand)
    num_ops: int = 0

    def last_op(self) -> dict[str, Any] | None:
        """The last op the rank recorded in its latest step."""
        t = self.last_batch
        if t is None:
            return None
        steps = to_numpy(t.column("step"))
        i = int(np.flatnonzero(steps == self.last_step)[-1])
        row = t.slice(i, 1).select(["step", "name", "start_ns", "dur_ns"]).to_pylist()[0]
        return {"step": int(row["step"]), "name": str(row["name"]), "start_ns": int(row["start_ns"]),
                "dur_ns": int(row["dur_ns"])}


@dataclass(kw_only=True, slots=True)
class WindowCut:
    """The ops of one window as held: each batch's body as received (or its table, for callers
    that add tables), in (first step, rank) order (``JobWindow.window_cut``). ``build_window`` makes the op
    table from it in whichever process analyses it, so the collector's interpreter only hands over bytes
    (building the table of a 1,024-rank window in the collector took ~0.5 s of its CPU per refresh, held
    under the GIL)."""

    first: int  # the window's first and last step
    last: int
    parts: list[bytes | pa.Table | PackSlice]  # a pack's part: its rows of the pack's body


def build_window(cut: WindowCut, cache: dict[bytes, list[pa.RecordBatch]] | None = None) -> pa.Table | None:
    """The window's op table: the parts read (bodies were checked at ingest), concatenated, cut to
    the window's steps, its rows step by step (each step's in the parts' order), one chunk per column
    (the analysis reads dictionary codes chunk by chunk).
    ``cache``: the job's bodies read for its last window (``laggard.wire.batch.read_bodies``)."""
    from laggard.wire.batch import read_bodies

    # one chunk first: a filter over thousands of small chunks costs several times one over their sum
    table = read_bodies(cut.parts, cache)
    if table is None:
        return None
    steps = to_numpy(table.column("step"))
    keep = (steps >= cut.first) & (steps <= cut.last)
    # the rows step by step (a rank's batch spans several): where the steps repeat one another, the
    # replay's graph is step 0's, repeated (``laggard.engine.graph``), not built over every op
    order = np.flatnonzero(keep)[np.argsort(steps[keep], kind="stable")]
    if len(order) < len(steps) or (np.diff(order) != 1).any():
        table = table.take(pa.array(order))
    return table if table.num_rows else None


@dataclass(kw_only=True, slots=True)
class WindowResult:
    """One refresh: the analysis document and what the monitor adds to it."""

    steps: tuple[int, int]
    doc: dict[str, Any]
    refreshed_unix_s: float
    refresh_s: float


def analyze_window(table: pa.Table, meta: JobMeta,
                   config: AnalysisConfig | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """``laggard analyze`` of one window's ops (under ``config``, the collector's ``MonitorConfig.analysis``):
    (the --json document, None) or (None, why it failed)."""
    from laggard.analysis.pipeline import analyze

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LaggardWarning)  # they are kept in the document's "warnings"
            return analyze(Job(table=table, meta=meta), config=config).to_json(), None
    except LaggardError as e:
        return None, str(e)


def load_ratios(table: pa.Table) -> dict[int, float]:
    """Per worker: its typical compute per step (the median over the window's steps, so one stalled
    step does not count) over the median of its pipeline stage's other workers. A persistently slow
    worker is well above 1 in every window; a worker that stalled once is not. Workers without
    stage peers are left out. The alert rules use it to tell a chronic straggler from a stall."""
    if table.num_rows == 0:
        return {}
    kind = table.column("kind")
    codes = np.concatenate([np.asarray(c.indices) for c in kind.chunks])
    labels = kind.chunks[0].dictionary.to_pylist()
    if "compute" not in labels:
        return {}
    comp = codes == labels.index("compute")
    rank = to_numpy(table.column("rank"))[comp]
    step = to_numpy(table.column("step"))[comp]
    stage = to_numpy(table.column("pp_rank"))[comp]
    dur = to_numpy(table.column("dur_ns"))[comp].astype(np.float64)
    ranks, ri = unique_inverse(rank)
    steps, si = unique_inverse(step)
    # per (worker, step) sums in op order, as np.add.at adds them (bincount: ~20x faster here)
    cell = ri * len(steps) + si
    size = len(ranks) * len(steps)
    per = np.bincount(cell, weights=dur, minlength=size).reshape(len(ranks), len(steps))
    ran = np.bincount(cell, minlength=size).reshape(per.shape) > 0
    load = nan_median(np.where(ran, per, np.nan), 1)  # the steps each worker ran
    st = np.zeros(len(ranks), dtype=np.int64)
    st[ri] = stage
    if np.isfinite(load).all():  # each worker's peers' median from one sort (as np.median picks it)
        from laggard.diagnose.context import peer_median

        ref = peer_median(load, st)
        alone = np.bincount(st - st.min())[st - st.min()] < 2
        return {int(r): float(load[i] / ref[i]) for i, r in enumerate(ranks.tolist()) if not alone[i] and ref[i] > 0}
    out: dict[int, float] = {}
    for i, r in enumerate(ranks.tolist()):
        peers = load[(st == st[i]) & (np.arange(len(ranks)) != i)]
        if len(peers) and np.median(peers) > 0:
            out[int(r)] = float(load[i] / np.median(peers))
    return out


@dataclass(kw_only=True)
class JobWindow:
    job_id: str
    meta: JobMeta
    cfg: MonitorConfig
    tracing: bool = True
    dump_request: int = 0  # raised to ask the job's tracers for a Flight Recorder dump
    hang_was_suspected: bool = False
    ranks: dict[int, RankState] = field(default_factory=dict)
    # (rank, min_step, max_step, ops, the body as received or None)
    _batches: list[tuple[int, int, int, pa.Table, bytes | PackSlice | None]] = field(default_factory=list)
    analyzed_through: int = -1  # the last complete step of the last window analyzed
    result: WindowResult | None = None
    error: str | None = None
    chronic: dict[int, float] = field(default_factory=dict)  # rank -> EWMA of S_w
    trend: dict[int, float] = field(default_factory=dict)  # step -> S of that step (per_step)
    window_trend: list[tuple[int, float]] = field(default_factory=list)  # (last step, window S)
    load_ratio: dict[int, float] = field(default_factory=dict)  # rank -> load_ratios() of the last window
    rank_steps: dict[str, Any] | None = None  # the last window's per-rank step times (monitor.steptimes)
    last_add_s: float = 0.0  # when the last batch came (idle refresh)
    num_ops: int = 0
    hangs: HangCase = field(default_factory=HangCase)  # heartbeats, hang reports, the last verdict
    # how many ranks have each latest step (the ranks' last_step counted: the job's slowest and
    # fastest rank without a pass over 1,024 ranks per batch; a job's ranks span a few steps)
    _at_step: dict[int, int] = field(default_factory=dict)
    # the step numbers any rank has reported, sorted: a window is its last window_steps of them, not
    # of the numbers (a trace's steps may be sparse: every 10th step profiled)
    _steps: list[int] = field(default_factory=list)

    # ------------------------------------------------------------------ ingest side
    def add(self, table: pa.Table, rank: int, min_step: int, max_step: int, now_s: float | None = None,
            body: bytes | PackSlice | None = None) -> None:
        """Hold a batch in memory (already stored) and advance the rank's progress; ``body``, the batch
        as received, is what a window hands to the analysis (``WindowCut``)."""
        st = self.ranks.get(rank)
        if st is None:
            st = self.ranks[rank] = RankState()
            self._at_step[st.last_step] = self._at_step.get(st.last_step, 0) + 1
        st.num_ops += table.num_rows
        self.num_ops += table.num_rows
        st.last_seen_s = self.last_add_s = time.time() if now_s is None else now_s
        if max_step >= st.last_step:
            if max_step > st.last_step:
                self._move(st.last_step, max_step)
            st.last_step = max_step
            st.last_batch = table
        self._batches.append((rank, min_step, max_step, table, body))
        self._note_steps(table, min_step, max_step)
        if len(self._batches) % 256 == 0:  # between refreshes too: memory bounded by the window
            first = self.first_of(self.complete_through())
            self._batches = [b for b in self._batches if b[2] >= first]

    def _note_steps(self, table: pa.Table, min_step: int, max_step: int) -> None:
        """Keep the batch's step numbers in ``_steps`` (only a batch of several steps is read through)."""
        if min_step == max_step or "step" not in table.column_names:
            new = {min_step, max_step}
        else:
            import pyarrow.compute as pc

            new = set(pc.unique(table.column("step")).to_pylist())
        seen = self._steps
        for st in sorted(new):
            if st is None:
                continue
            i = bisect.bisect_left(seen, st)
            if i == len(seen) or seen[i] != st:
                seen.insert(i, st)
        # the steps before every window held are not needed (memory bounded over a long job)
        keep = bisect.bisect_left(seen, self.first_of(self.complete_through()))
        if keep > 4 * max(self.cfg.window_steps, 1):
            del seen[:keep]

    def first_of(self, last: int) -> int:
        """The first step of the window ending at ``last``: the ``window_steps``-th reported step up to
        it (``last - window_steps + 1`` where fewer were reported)."""
        n = max(self.cfg.window_steps, 1)
        i = bisect.bisect_right(self._steps, last)
        return self._steps[i - n] if i >= n else last - n + 1

    @property
    def expected_ranks(self) -> int:
        """Workers whose steps must all arrive before a step is complete: one per (dp, pp, cp)
        coordinate at least (traces often hold one rank per TP group), or as many as reported."""
        m = self.meta
        return max(m.dp_size * m.pp_size * m.cp_size, len(self.ranks))

    def _move(self, old: int, new: int) -> None:
        """A rank's latest step went from ``old`` to ``new`` (``_at_step``)."""
        left = self._at_step[old] - 1
        if left:
            self._at_step[old] = left
        else:
            del self._at_step[old]
        self._at_step[new] = self._at_step.get(new, 0) + 1

    def front_step(self) -> int:
        """The latest step any rank has reported (-1: none yet)."""
        return max(self._at_step, default=-1)

    def complete_through(self) -> int:
        """The last step every rank has moved past (-1: none yet)."""
        if not self.ranks or len(self.ranks) < self.expected_ranks:
            return -1
        return min(self._at_step) - 1

    # ------------------------------------------------------------------ analysis side
    def window_cut(self, last: int) -> WindowCut:
        """The batches that hold steps of the window ending at ``last``."""
        first = self.first_of(last)
        self._batches = [b for b in self._batches if b[2] >= first]  # older batches are out of every window
        # in (step, rank) order whatever the arrival order: the same window gives the same table, and a
        # relay's pack (its ranks of one flush) is one run of adjacent parts, read as one slice
        parts = [t if body is None else body
                 for _, lo, _, t, body in sorted(self._batches, key=lambda b: (b[1], b[0])) if lo <= last]
        return WindowCut(first=first, last=last, parts=parts)

    def window_table(self, last: int) -> pa.Table | None:
        return build_window(self.window_cut(last))

    def cut(self) -> WindowCut | None:
        """The latest window if steps completed since the last refresh (call under the job's lock)."""
        last = self.complete_through()
        new = last - self.analyzed_through
        idle = time.time() - self.last_add_s > self.cfg.idle_refresh_s
        if last < 0 or new <= 0 or (new < self.cfg.refresh_every_steps and not idle):
            return None
        self.analyzed_through = last
        cut = self.window_cut(last)
        return cut if cut.parts else None

    def apply(self, last: int, doc: dict[str, Any] | None, error: str | None, refresh_s: float,
              load_ratio: dict[int, float] | None = None, rank_steps: dict[str, Any] | None = None) -> None:
        """Keep a window's analysis (or why it failed) and update the chronic scores and trends."""
        self.load_ratio = load_ratio or {}
        self.rank_steps = rank_steps
        if doc is None:
            self.error = f"steps {self.first_of(last)}-{last}: {error}"
            return
        self.error = None
        steps = [int(k) for k in doc["per_step"]] or [last]
        self.result = WindowResult(steps=(min(steps), max(steps)), doc=doc, refreshed_unix_s=time.time(),
                                   refresh_s=refresh_s)
        self._update_scores(doc)

    def _update_scores(self, doc: dict[str, Any]) -> None:
        a = self.cfg.chronic_alpha
        for w in doc["by_worker"]:
            s = w["slowdown"]
            if s is None:
                continue
            prev = self.chronic.get(w["rank"])
            self.chronic[w["rank"]] = s if prev is None else (1 - a) * prev + a * s
        for k, v in doc["per_step"].items():
            if v is not None:
                self.trend[int(k)] = v
        if len(self.trend) > self.cfg.trend_len:
            for k in sorted(self.trend)[: len(self.trend) - self.cfg.trend_len]:
                del self.trend[k]
        if doc["slowdown"] is not None:
            self.window_trend.append((self.analyzed_through, doc["slowdown"]))
            del self.window_trend[: -self.cfg.trend_len]

    def hang(self, now_s: float | None = None) -> list[dict[str, Any]]:
        """The ranks of a suspected hang ([] if none): from heartbeats when the tracers send them
        (``HangCase.stalled``), else ranks whose batches stopped for ``hang_after_s`` while others are
        ``hang_min_steps`` ahead."""
        now_s = time.time() if now_s is None else now_s
        if self.hangs.beats:
            return self.hangs.stalled(now_s, self.cfg.hang_after_s)
        if len(self.ranks) < 2:
            return []
        front = self.front_step()
        return [{"rank": r, "last_step": s.last_step, "last_op": s.last_op(),
                 "silent_s": round(now_s - s.last_seen_s, 1)}
                for r, s in sorted(self.ranks.items())
                if now_s - s.last_seen_s > self.cfg.hang_after_s and front - s.last_step >= self.cfg.hang_min_steps]

    # ------------------------------------------------------------------ views
    def summary(self) -> dict[str, Any]:
        doc = self.result.doc if self.result is not None else None
        s = doc["slowdown"] if doc else None
        trend = [v for _, v in self.window_trend[-20:]]
        direction = None
        if len(trend) >= 4:
            half = len(trend) // 2
            d = float(np.mean(trend[half:]) - np.mean(trend[:half]))
            direction = "rising" if d > 0.01 else "falling" if d < -0.01 else "steady"
        hang = self.hang()
        return {
            "id": self.job_id,
            "name": self.meta.name,
            "tracing": self.tracing,
            "num_ranks": max(len(self.ranks), len(self.hangs.beats)),
            # ranks whose tracer closed (their last heartbeat said so): a job whose every rank closed ended
            "ranks_closed": sum(b.closed for b in self.hangs.beats.values()),
            "expected_ranks": self.expected_ranks,
            "num_ops": self.num_ops,
            "last_step": max(self.front_step(), self.hangs.last_step()),
            "window": list(self.result.steps) if self.result else None,
            "slowdown": s,
            "verdict": _verdict(doc, hang, self.hangs.published),
            "trend": direction,
            "hang_suspected": bool(hang),
            # raised on each request to dump the job's Flight Recorder buffers (by an operator, or
            # when a hang is first suspected): tracers dump once per new value (laggard.tracer.stream)
            "dump_request": self.dump_request,
            # the last hang verdict (laggard hang's analysis of the ranks' reports): GET .../hang has it all
            "hang_verdict": self.hangs.published,
            "error": self.error,
        }

    def detail(self, top_k: int) -> dict[str, Any]:
        out = self.summary()
        doc = self.result.doc if self.result is not None else None
        workers = doc["by_worker"] if doc else []
        current = [{**w, "chronic": _round(self.chronic.get(w["rank"])),
                    "load_ratio": _round(self.load_ratio.get(w["rank"]))} for w in workers[:top_k]]
        chronic = sorted(({"rank": r, "chronic": _round(c)} for r, c in self.chronic.items()),
                         key=lambda x: -(x["chronic"] or 0))[:top_k]
        coords = {w["rank"]: (w["dp_rank"], w["stage"]) for w in workers}
        for c in chronic:
            c["dp_rank"], c["stage"] = coords.get(c["rank"], (None, None))
        out.update({
            "heatmap": {"dp": self.meta.dp_size, "pp": self.meta.pp_size,
                        "cells": [{"dp": w["dp_rank"], "stage": w["stage"], "rank": w["rank"],
                                   "slowdown": w["slowdown"], "chronic": _round(self.chronic.get(w["rank"]))}
                                  for w in workers]},
            "top_current": current,
            "top_chronic": chronic,
            "step_trend": [[k, self.trend[k]] for k in sorted(self.trend)],
            "window_trend": [list(x) for x in self.window_trend],
            # each with its words (laggard.report.wording): the dashboard shows those, never the raw fields
            "findings": [{**f, "text": finding_text(f).to_json()} for f in doc.get("findings", [])] if doc else [],
            "hang": self.hang(),
            "refresh_s": self.result.refresh_s if self.result else None,
            "ranks": [{"rank": r, "last_step": s.last_step, "num_ops": s.num_ops, "last_op": s.last_op()}
                      for r, s in sorted(self.ranks.items())],
            # each rank's span and own work in each step of the last window (`laggard top` shows them)
            "rank_steps": self.rank_steps,
        })
        return out

    def step_timeline(self, step: int) -> list[dict[str, Any]]:
        """The ops of one step (as held in memory), for the dashboard's drill-down."""
        rows: list[dict[str, Any]] = []
        for _, lo, hi, t, _ in self._batches:
            if lo <= step <= hi:
                keep = to_numpy(t.column("step")) == step
                sub = t.filter(pa.array(keep)).select(["rank", "dp_rank", "pp_rank", "name", "kind", "start_ns",
                                                       "dur_ns", "microbatch"])
                rows.extend(sub.to_pylist())
        return rows


def _verdict(doc: dict[str, Any] | None, hang: list[dict[str, Any]], pub: dict[str, Any] | None = None) -> str:
    if hang and pub is not None and pub.get("suspected") and pub["verdict"] != "healthy":
        return f"{pub['verdict']}: rank(s) {pub['culprit_ranks']}"
    if hang:
        return "hang suspected"
    if doc is None:
        return "waiting for steps"
    return str(doc.get("verdict", "straggling"))


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 5)
