"""``laggard top``: the state of a running job (``laggard.results.top.TopState``), polled from its trace
directory or from a collector.

A trace directory: the tracer renames each shard into place whole (``laggard.tracer._writer``), so
every ``*.parquet`` there is complete, but a shard ends where a page filled, often inside a step. A
step counts once every rank has finished it: the rank wrote ops of a later step, or its tracer no
longer runs (its state file says closed, failed, incomplete..., or its process on this host is gone).
The last ``TopConfig.window_steps`` such steps are cut into one op table as the collector cuts its
windows (``monitor.window.build_window``) and analyzed by ``monitor.window.analyze_window``: the
``laggard analyze --json`` document of those ops, its first finding the one shown. A shard is read
once (known by name, size, mtime and inode); the tables of shards wholly before the window are let go.

A collector: ``GET /api/v1/jobs/ID``: its own window analysis (verdict, findings, every worker's
S_w) and the per-rank times of that window's steps (``rank_steps``, computed beside the analysis from
the steps the collector holds whole: ``monitor.steptimes``).

The job ends when every rank's tracer stopped (a directory's state files; a collector's closed
heartbeats), or, at a collector, when the job posted nothing for ``TopConfig.idle_end_s``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from laggard.engine.selection import nan_median
from laggard.errors import LaggardError, LaggardWarning
from laggard.monitor.steptimes import RankTimes, rank_times
from laggard.optable.ops import JobMeta, to_numpy
from laggard.optable.tracedir import JOB_FILE, STATE_GLOB, read_states
from laggard.results.top import RankRow, TopState, Worst

if TYPE_CHECKING:
    from laggard.analysis.config import AnalysisConfig

# a tracer's state file status while the rank records; every other one is final
RUNNING = "running"


@dataclass(kw_only=True, slots=True)
class TopConfig:
    # steps the per-rank times and the analysis cover: a persistent straggler is slow in nearly all of
    # 20 steps while one stalled step barely moves a median of 20 (the collector's own window, 6 steps
    # by default, reacts sooner and is what a collector's job shows for its analysis)
    window_steps: int = 20
    # a collector's job whose op count and latest step stayed the same this long stopped posting (it
    # ended, or its ranks died): twice the collector's hang_after_s, so that a hang shows as one first
    idle_end_s: float = 60.0
    # how each window is analyzed (None: as `laggard analyze` does)
    analysis: AnalysisConfig | None = None

    def __post_init__(self) -> None:
        w = self.window_steps
        if not isinstance(w, int) or isinstance(w, bool) or w < 2:
            raise LaggardError(f"top: the window must be at least 2 steps, got {w!r}")
        if not self.idle_end_s > 0:
            raise LaggardError(f"top: idle_end_s must be positive, got {self.idle_end_s!r}")


# ---------------------------------------------------------------------------------------------- the frame
def peer_excess(busy: np.ndarray, stage: np.ndarray) -> list[tuple[float, float, int] | None]:
    """Per rank: (its busy time / its peers' median - 1, that median, how many peers), its peers
    being the same stage's other ranks (a pipeline's stages do different work), or every other rank
    where its stage has no other; None without peers or a time."""
    out: list[tuple[float, float, int] | None] = []
    idx = np.arange(len(busy))
    ok = np.isfinite(busy)
    for i in idx:
        if not ok[i]:
            out.append(None)
            continue
        peers = ok & (idx != i) & (stage == stage[i])
        if not peers.any():
            peers = ok & (idx != i)
        ref = float(np.median(busy[peers])) if peers.any() else 0.0
        out.append((float(busy[i]) / ref - 1.0, ref, int(peers.sum())) if ref > 0 else None)
    return out


def fill_times(state: TopState, times: RankTimes | None, rows: dict[int, RankRow]) -> None:
    """The per-rank rows, the job's step time and the worst rank of ``state`` from ``times`` (rows
    already known, with their status and latest step, are kept and filled)."""
    if times is not None:
        busy = nan_median(times.busy_ms, 1)
        span = nan_median(times.span_ms, 1)
        excess = peer_excess(busy, times.stage)
        for i, r in enumerate(times.ranks.tolist()):
            row = rows.setdefault(r, RankRow(rank=r))
            row.dp_rank, row.stage = int(times.dp[i]), int(times.stage[i])
            row.step_ms = _finite(span[i])
            row.busy_ms = _finite(busy[i])
            row.recent_ms = [float(x) for x in times.busy_ms[i]]
            row.excess = excess[i][0] if excess[i] is not None else None
        longest = np.where(np.isnan(times.span_ms), -np.inf, times.span_ms).max(axis=0)
        state.step_ms = _finite(float(np.median(longest))) if len(longest) else None
        known = [(e, i) for i, e in enumerate(excess) if e is not None]
        if known:
            (ex, ref, n), i = max(known, key=lambda x: (x[0][0], -x[1]))
            state.worst = Worst(rank=int(times.ranks[i]), busy_ms=float(busy[i]), peers_ms=ref, excess=ex, num_peers=n)
    state.ranks = [rows[r] for r in sorted(rows)]


def fill_analysis(state: TopState, doc: dict[str, Any] | None, error: str | None) -> None:
    """S, the verdict, the first finding and each rank's S_w from an analysis document (or why it failed)."""
    state.error = error
    if doc is None:
        return
    state.slowdown = doc.get("slowdown")
    state.verdict = doc.get("verdict")
    findings = doc.get("findings") or []
    state.finding = findings[0] if findings else None
    state.num_findings = len(findings)
    workers = {w["rank"]: w for w in doc.get("by_worker") or [] if isinstance(w, dict) and "rank" in w}
    for row in state.ranks:
        w = workers.get(row.rank)
        if w is not None:
            row.slowdown = w.get("slowdown")
            row.dp_rank = w.get("dp_rank", row.dp_rank)
            row.stage = w.get("stage", row.stage)


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


# ---------------------------------------------------------------------------------------------- a directory
def _process_gone(st: dict[str, Any]) -> bool:
    """Whether the rank's process ran on this host and is no longer there (killed without a word)."""
    pid = st.get("pid")
    if not isinstance(pid, int) or pid <= 0 or st.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # there, another user's
        return False
    return False


@dataclass(kw_only=True, slots=True)
class _Shard:
    key: tuple[int, int, int]  # size, mtime, inode: a file replaced under the same name is read again
    first: int  # its steps
    last: int
    table: pa.Table | None  # None once wholly before the window


def _stat_key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def is_trace_dir(path: Path) -> bool:
    """A native trace directory, finished or being written: job.json, a rank's state file or an op shard."""
    return (path / JOB_FILE).is_file() or any(path.glob(STATE_GLOB)) or any(path.glob("*.parquet"))


class DirTop:
    """The job writing the trace directory ``path``; ``poll()`` reads what is new and returns the frame."""

    def __init__(self, path: str | Path, cfg: TopConfig | None = None) -> None:
        self.path = Path(path)
        self.cfg = cfg or TopConfig()
        if not self.path.exists():
            raise LaggardError(f"{self.path}: no such directory")
        if not self.path.is_dir():
            raise LaggardError(f"{self.path}: not a directory (top reads a trace directory: job.json and op shards)")
        if not is_trace_dir(self.path):
            raise LaggardError(f"{self.path}: not a laggard trace directory (no {JOB_FILE}, no rank state files, "
                               "no *.parquet op shards)")
        self._meta: tuple[tuple[int, int, int], JobMeta] | None = None
        self._reset()

    def _reset(self) -> None:
        self._shards: dict[str, _Shard] = {}
        # what the shards read so far hold: each step's ranks and each rank's latest step; steps before
        # the last window are dropped (``_below``) once complete, since no later window holds them
        self._ranks_at: dict[int, set[int]] = {}
        self._last: dict[int, int] = {}
        self._below = -(1 << 62)
        self._window: tuple[tuple[int, ...], TopState] | None = None  # the last window's steps and its frame

    def _read_meta(self) -> JobMeta | None:
        p = self.path / JOB_FILE
        try:
            key = _stat_key(p.stat())
        except FileNotFoundError:
            return None  # rank 0 has not started yet
        if self._meta is None or self._meta[0] != key:
            try:
                obj = json.loads(p.read_text())
            except FileNotFoundError:
                return None
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise LaggardError(f"{p}: not valid JSON ({e})") from None
            self._meta = (key, JobMeta.from_json(obj, where=str(p)))
        return self._meta[1]

    def _read_shards(self) -> list[str]:
        """Read the new shards; returns a line for each that could not be read (tried again next time)."""
        entries = {e.name: e for e in os.scandir(self.path) if e.name.endswith(".parquet") and e.is_file()}
        if set(self._shards) - set(entries):  # shards removed: a new job started in the directory
            self._reset()
        problems = []
        for name, entry in sorted(entries.items()):
            try:
                key = _stat_key(entry.stat())
            except FileNotFoundError:
                continue
            old = self._shards.get(name)
            if old is not None and old.key == key:
                continue
            if old is not None:  # rewritten in place (not the tracer's way): everything again
                self._reset()
                return self._read_shards()
            if key[0] == 0:
                continue
            try:
                t = _read_shard(entry.path)
            except FileNotFoundError:
                continue
            except (OSError, pa.ArrowException, LaggardError) as e:
                problems.append(f"{name}: not readable yet ({str(e).splitlines()[0]})")
                continue
            rank = to_numpy(t.column("rank")).astype(np.int64)
            step = to_numpy(t.column("step")).astype(np.int64)
            if not len(step):
                continue
            for r, s in np.unique(np.stack([rank, step]), axis=1).T.tolist():
                if s >= self._below:
                    self._ranks_at.setdefault(s, set()).add(r)
                if s > self._last.get(r, -(1 << 62)):
                    self._last[r] = s
            self._shards[name] = _Shard(key=key, first=int(step.min()), last=int(step.max()), table=t)
        return problems

    def poll(self) -> TopState:
        """The frame now: what the shards written since the last poll add, each rank's status."""
        meta = self._read_meta()
        problems = self._read_shards()
        states = read_states(self.path)
        name = meta.name if meta is not None else self.path.name
        state = TopState(source=str(self.path), name=name, updated_unix_s=time.time(), notes=problems)
        last = self._last
        world = meta.world_size if meta is not None and states else None
        expected = set(range(world)) if isinstance(world, int) else set()
        expected |= set(states) | set(last)
        rows: dict[int, RankRow] = {}
        running: set[int] = set()
        gone: list[int] = []
        for r in sorted(expected):
            st = states.get(r)
            status = str(st.get("status", "")) if st is not None else ("pending" if states else "")
            if st is not None and status == RUNNING and _process_gone(st):
                status = "gone"
                gone.append(r)
            if states and status in (RUNNING, "pending", "unreadable"):
                running.add(r)
            rows[r] = RankRow(rank=r, status=status, last_step=last.get(r))
        state.num_ranks, state.expected_ranks = len(last), len(expected)
        state.last_step = max(last.values()) if last else None
        if gone:
            state.notes.append(f"rank(s) {', '.join(map(str, gone))}: the process is gone without closing its trace "
                               "(killed or crashed); its last steps are lost")
        # without state files the directory is a finished trace (its shards are all there is), or
        # one whose tracers have not started yet (job.json alone)
        ended = not running if states else bool(self._shards)
        if ended:
            state.phase, state.ended_why = "ended", _ended_why(states, gone)
        window = tuple(self._complete(running, expected if running else set(last))[-self.cfg.window_steps:])
        if meta is None and window and ended:
            raise LaggardError(f"{self.path}: op shards but no {JOB_FILE} (not a native laggard trace)")
        if not window or meta is None:
            if meta is None:
                state.notes.append(f"no {JOB_FILE} yet (rank 0 writes it when it starts)")
            if state.phase != "ended":
                state.phase = "waiting"
            fill_times(state, None, rows)
            return state
        if self._window is None or self._window[0] != window:
            self._window = (window, self._analyze(window, meta))
            for s in [s for s in self._ranks_at if s < window[0]]:
                del self._ranks_at[s]
            self._below = window[0]
        done = self._window[1]
        state.phase = "ended" if ended else "running"
        state.window, state.num_steps = (window[0], window[-1]), len(window)
        for r, row in rows.items():  # this poll's statuses, the window's numbers
            old = done.rank_row(r)
            if old is not None:
                row.dp_rank, row.stage, row.step_ms, row.busy_ms = old.dp_rank, old.stage, old.step_ms, old.busy_ms
                row.recent_ms, row.excess, row.slowdown = old.recent_ms, old.excess, old.slowdown
        state.ranks = [rows[r] for r in sorted(rows)]
        for k in ("step_ms", "worst", "slowdown", "verdict", "finding", "num_findings", "error"):
            setattr(state, k, getattr(done, k))
        return state

    def _complete(self, running: set[int], need: set[int]) -> list[int]:
        """The steps every rank of ``need`` wrote ops of and finished, in order: a running rank has
        finished the steps before its latest one; a rank that stopped, all of its steps."""
        if not need or not self._ranks_at:
            return []
        bound = min((self._last.get(r, -1) - 1 for r in running), default=max(self._ranks_at))
        return [s for s in sorted(self._ranks_at) if s <= bound and need <= self._ranks_at[s]]

    def _analyze(self, window: tuple[int, ...], meta: JobMeta) -> TopState:
        """The per-rank times and the analysis of the window's steps (a frame holding only those)."""
        from laggard.monitor.window import WindowCut, analyze_window, build_window

        first, last = window[0], window[-1]
        parts = [s.table for s in self._shards.values() if s.table is not None and s.last >= first and s.first <= last]
        for s in self._shards.values():  # every later window starts later
            if s.last < first:
                s.table = None
        table = build_window(WindowCut(first=first, last=last, parts=parts))
        done = TopState(source=str(self.path), name=meta.name)
        if table is not None and len(window) < last - first + 1:  # steps in between that are not complete
            import pyarrow.compute as pc

            step = table.column("step")
            table = table.filter(pc.is_in(step, value_set=pa.array(window, step.type)))
        if table is None or table.num_rows == 0:
            done.error = "no ops in the window's steps"
            return done
        fill_times(done, rank_times(table), {})
        doc, err = analyze_window(table, meta, self.cfg.analysis)
        fill_analysis(done, doc, err)
        return done


def _read_shard(path: str) -> pa.Table:
    import pyarrow.parquet as pq

    from laggard.optable.ops import conform

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        return conform(pq.read_table(path), path)


def _ended_why(states: dict[int, dict[str, Any]], gone: list[int]) -> str:
    if not states:
        return "a finished trace (no tracer state files)"
    kinds: dict[str, list[int]] = {}
    for r in sorted(states):
        status = "gone" if r in gone else str(states[r].get("status", "?"))
        kinds.setdefault(status, []).append(r)
    if list(kinds) == ["closed"]:
        return "every rank closed its trace"
    return "; ".join(f"rank(s) {', '.join(map(str, rs))} {st}" for st, rs in kinds.items())


# ---------------------------------------------------------------------------------------------- a collector
def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def closed(detail: dict[str, Any]) -> bool:
    """Whether every rank of a collector's job closed its tracer (its last heartbeat said so)."""
    n = _int(detail.get("num_ranks")) or 0
    return n > 0 and (_int(detail.get("ranks_closed")) or 0) >= n


def collector_state(source: str, detail: dict[str, Any]) -> TopState:
    """The frame of a collector's job from its detail (``GET /api/v1/jobs/ID``): the ranks' progress,
    the per-rank times of its last window (``rank_steps``, ``monitor.steptimes``), every worker's S_w
    and place, its first finding; whether the job ended is the caller's."""
    from laggard.monitor.steptimes import from_json

    state = TopState(source=source, name=str(detail.get("name") or detail.get("id") or "?"),
                     updated_unix_s=time.time())
    state.num_ranks = _int(detail.get("num_ranks")) or 0
    state.expected_ranks = max(_int(detail.get("expected_ranks")) or 0, state.num_ranks)
    last = _int(detail.get("last_step"))
    state.last_step = last if last is not None and last >= 0 else None
    status = "closed" if closed(detail) else ""
    rows = {r["rank"]: RankRow(rank=r["rank"], last_step=_int(r.get("last_step")), status=status)
            for r in detail.get("ranks") or [] if isinstance(r, dict) and _int(r.get("rank")) is not None}
    times = from_json(detail.get("rank_steps"))
    fill_times(state, times, rows)
    cells = (detail.get("heatmap") or {}).get("cells") or []
    for cell in cells:  # every worker's coordinates and S_w
        row = state.rank_row(cell.get("rank")) if isinstance(cell, dict) else None
        if row is not None:
            row.dp_rank, row.stage, row.slowdown = cell.get("dp"), cell.get("stage"), cell.get("slowdown")
    analyzed = isinstance(detail.get("window"), list) and len(detail["window"]) == 2
    if times is not None:
        state.window, state.num_steps = (int(times.steps[0]), int(times.steps[-1])), len(times.steps)
    if analyzed:
        state.slowdown = detail.get("slowdown")
        state.verdict = str(detail.get("verdict"))
    findings = detail.get("findings") or []
    state.finding = findings[0] if findings else None
    state.num_findings = len(findings)
    state.error = detail.get("error")
    if detail.get("hang_suspected"):
        state.notes.append(f"hang suspected: {detail.get('verdict')}")
    state.phase = "running" if times is not None or analyzed else "waiting"
    return state


class UrlTop:
    """A job at a collector (``url``, bearer ``token``; ``job``: its id, None for the collector's only
    job); ``poll()`` asks for what is new and returns the frame."""

    def __init__(self, url: str, token: str | None, job: str | None = None, cfg: TopConfig | None = None) -> None:
        from laggard.wire.client import Client

        self.url, self.cfg = url, cfg or TopConfig()
        self._client = Client(url, token)
        self._progress: tuple[Any, Any] | None = None  # (ops, latest step) when they last changed ...
        self._moved_s = time.monotonic()  # ... and when
        self._last: TopState | None = None  # the last frame
        jobs = self._get("/api/v1/jobs")
        ids = [str(j.get("id")) for j in jobs or [] if isinstance(j, dict)]
        shown = f"{', '.join(ids[:10])}{' ...' if len(ids) > 10 else ''}"
        if job is None:
            if len(ids) != 1:
                raise LaggardError(f"the collector at {url} has {len(ids)} jobs" + (f" ({shown})" if ids else "")
                                   + ": name one with --job")
            job = ids[0]
        elif job not in ids:
            raise LaggardError(f"the collector at {url} has no job {job!r}"
                               + (f" (its jobs: {shown})" if ids else " (no job has sent ops yet)"))
        self.job = job

    def _get(self, path: str) -> Any:
        from laggard.wire.client import CollectorDown, Refused

        try:
            return self._client.request("GET", path)
        except CollectorDown as e:
            raise LaggardError(f"cannot reach the collector at {self.url} ({e})") from None
        except Refused as e:
            if e.status == 401:
                raise LaggardError(f"the collector at {self.url} refused the token (--token, or LAGGARD_TOKEN)"
                                   ) from None
            raise

    def poll(self) -> TopState:
        from urllib.parse import quote

        base = f"/api/v1/jobs/{quote(str(self.job), safe='')}"
        try:
            detail = self._get(base)
        except LaggardError as e:
            if self._last is None or "cannot reach" not in str(e):
                raise
            # the collector went away after answering (restarted, or the network): the last frame,
            # said so, until it answers again or the job counts as ended
            state, now = self._last, time.monotonic()
            state.notes = [n for n in state.notes if not n.startswith("collector unreachable")] + [
                f"collector unreachable for {now - self._moved_s:.0f} s: {e}"]
            if now - self._moved_s >= self.cfg.idle_end_s:
                state.phase, state.ended_why = "ended", f"the collector did not answer for {now - self._moved_s:.0f} s"
            return state
        state = collector_state(f"{self.url} job {self.job}", detail)
        now = time.monotonic()
        progress = (detail.get("num_ops"), detail.get("last_step"))
        if progress != self._progress:
            self._progress, self._moved_s = progress, now
        if closed(detail):
            state.phase, state.ended_why = "ended", "every rank closed its trace"
        elif now - self._moved_s >= self.cfg.idle_end_s:
            state.phase = "ended"
            state.ended_why = f"the job sent nothing for {now - self._moved_s:.0f} s"
        self._last = state
        return state

    def close(self) -> None:
        self._client.close()


__all__ = ["DirTop", "RankTimes", "TopConfig", "UrlTop", "closed", "collector_state", "rank_times"]
