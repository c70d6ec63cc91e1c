"""Reading Flight Recorder dumps: pickle or JSON, any file names, the rank from the dump itself.

A dump is what ``torch._C._distributed_c10d._dump_fr_trace`` (pickle) or ``_dump_fr_trace_json``
returns: ``version``, ``pg_config`` (group name -> ranks; empty on gloo), ``pg_status`` and
``entries`` (one per collective in the rank's ring buffer: ``process_group`` (name, desc),
``collective_seq_id``, ``p2p_seq_id``, ``record_id`` (the rank's own counter across groups),
``profiling_name`` (``gloo:all_reduce``), sizes and dtypes, ``state``, ``retired``,
``time_created_ns``). Dumps written by ``laggard.tracer.flight`` add a ``laggard`` key (rank,
world size, job id, reason and time of the dump, where the main thread was, last traced op) and
fill ``pg_config``. A plain torch dump names no rank: then the last number in the file name is
used, with a warning. No torch here: pickles are read with a loader that builds only plain types.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError, LaggardWarning
from laggard.optable.tracedir import FLIGHT_DUMP_KEY, FLIGHT_REQUEST_FILE, JOB_FILE, STATE_SUFFIX

DUMP_KEY = FLIGHT_DUMP_KEY  # the key laggard.tracer.flight adds to its dumps
_RANK_IN_NAME = re.compile(r"(\d+)(?!.*\d)")
_SKIP_NAMES = re.compile(rf"^({re.escape(JOB_FILE)}|truth\.json|.*{re.escape(STATE_SUFFIX)}|.*\.parquet|.*\.tmp.*"
                         rf"|{re.escape(FLIGHT_REQUEST_FILE)})$")


@dataclass(slots=True)
class Entry:
    """One collective in a rank's buffer, normalised across formats."""

    group: str  # process group name (the same on every rank)
    seq: int  # collective_seq_id (p2p: p2p_seq_id)
    record_id: int  # the rank's own counter over all groups
    op: str  # all_reduce, broadcast, ... (profiling name without the backend)
    sig: tuple  # (op, input sizes, input dtypes, output sizes): what every rank must agree on
    created_ns: int
    is_p2p: bool
    done: bool  # completed (or ended in an error: gloo retires a timed-out collective like a finished one)


@dataclass(slots=True)
class RankDump:
    rank: int
    path: Path
    fmt: str  # pickle | json
    entries: list[Entry]
    group_ranks: dict[str, list[int]] = field(default_factory=dict)  # from pg_config, when it names ranks
    group_desc: dict[str, str] = field(default_factory=dict)
    world_size: int | None = None
    job_id: str | None = None
    dump_ns: int | None = None  # when the dump was taken (laggard dumps), else None
    reason: str | None = None
    where: dict[str, Any] | None = None  # laggard: what the main thread was doing
    last_op: dict[str, Any] | None = None
    step: int | None = None
    rank_from_name: bool = False
    tracer: dict[str, Any] = field(default_factory=dict)  # the whole ``laggard`` key (the tracer's state)
    synthetic: bool = False  # entries stand in for a Flight Recorder that was off (hang.tracer_state)

    @property
    def wrapped(self) -> bool:
        """True when the ring buffer has lost its oldest entries (the first record is not number 0)."""
        return not self.synthetic and bool(self.entries) and min(e.record_id for e in self.entries) > 0

    @property
    def seen_ns(self) -> int | None:
        """The dump time, or at least the time of its newest entry."""
        if self.dump_ns is not None:
            return self.dump_ns
        return max((e.created_ns for e in self.entries), default=None)


class _PlainUnpickler(pickle.Unpickler):
    """Flight Recorder pickles hold only dicts, lists, tuples, strings and numbers: refuse anything
    else (a pickle can run code when it builds objects)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to build {module}.{name} (a Flight Recorder dump has plain types only)")


def _decode(raw: bytes, path: Path) -> tuple[dict[str, Any], str]:
    if not raw:
        raise LaggardError(f"{path}: empty file, not a Flight Recorder dump")
    if raw[:1] == b"\x80":
        try:
            obj = _PlainUnpickler(io.BytesIO(raw)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as e:
            raise LaggardError(f"{path}: unreadable pickle (truncated or corrupt: {e})") from None
        fmt = "pickle"
    elif raw.lstrip()[:1] == b"{":
        try:
            obj = json.loads(raw)
        except ValueError as e:
            raise LaggardError(f"{path}: unreadable JSON ({e})") from None
        fmt = "json"
    else:
        raise LaggardError(f"{path}: neither a pickle nor a JSON Flight Recorder dump")
    if not isinstance(obj, dict) or not isinstance(obj.get("entries"), list) or "version" not in obj:
        raise LaggardError(f"{path}: not a Flight Recorder dump (no 'version' and 'entries')")
    return obj, fmt


def _int(x: Any, default: int = 0) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _entry(e: dict[str, Any], completed: dict[int, int]) -> Entry:
    pg = e.get("process_group") or ("?", "")
    name = str(e.get("profiling_name", "?"))
    op = name.split(":", 1)[1] if ":" in name else name
    is_p2p = bool(e.get("is_p2p", False))
    sizes = tuple(tuple(s) for s in e.get("input_sizes") or ())
    dtypes = tuple(e.get("input_dtypes") or ())
    out_sizes = tuple(tuple(s) for s in e.get("output_sizes") or ())
    # done: NCCL marks the state; gloo leaves it 'scheduled' and counts the last completed op id
    # per group in pg_status (the entry's op_id, in the same per-group counter)
    state = str(e.get("state", ""))
    last = completed.get(_int(e.get("pg_id"), -1))
    done = state == "completed" or (last is not None and _int(e.get("op_id"), 1 << 62) <= last)
    return Entry(group=str(pg[0]), seq=_int(e.get("p2p_seq_id" if is_p2p else "collective_seq_id")),
                 record_id=_int(e.get("record_id")), op=op, sig=(op, sizes, dtypes, out_sizes),
                 created_ns=_int(e.get("time_created_ns")), is_p2p=is_p2p, done=done)


def _dict_or_none(x: Any) -> dict[str, Any] | None:
    return x if isinstance(x, dict) else None


def _ranks_of(cfg: Any) -> list[int] | None:
    ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
    if isinstance(ranks, str):
        try:
            ranks = json.loads(ranks)
        except ValueError:
            return None
    if isinstance(ranks, list) and ranks and all(isinstance(r, int) for r in ranks):
        return sorted(ranks)
    return None


def read_dump(path: Path) -> RankDump:
    """One rank's dump; ``LaggardError`` (one line) when it is not a readable dump."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise LaggardError(f"{path}: cannot read ({e.strerror or e})") from None
    return parse_dump(raw, path)


def parse_dump(raw: bytes, path: Path) -> RankDump:
    """One rank's dump from its bytes (``path`` names it in errors; the collector gets uploads)."""
    obj, fmt = _decode(raw, path)
    status = obj.get("pg_status") if isinstance(obj.get("pg_status"), dict) else {}
    completed = {_int(k, -1): _int(v.get("last_completed_collective"), -1) for k, v in status.items()
                 if isinstance(v, dict)}
    try:
        entries = [_entry(e, completed) for e in obj["entries"]]
    except (TypeError, AttributeError, IndexError) as e:
        raise LaggardError(f"{path}: malformed Flight Recorder entries ({e})") from None
    extra = obj.get(DUMP_KEY) if isinstance(obj.get(DUMP_KEY), dict) else {}
    rank = extra.get("rank")
    from_name = False
    if not isinstance(rank, int):
        m = _RANK_IN_NAME.search(path.name)
        if m is None:
            raise LaggardError(f"{path}: the dump names no rank (not written by laggard) and its file name has no "
                               "rank number")
        rank, from_name = int(m.group(1)), True
    groups: dict[str, list[int]] = {}
    descs: dict[str, str] = {}
    cfgs = obj.get("pg_config")
    for name, cfg in (cfgs.items() if isinstance(cfgs, dict) else ()):
        ranks = _ranks_of(cfg)
        if ranks is not None:
            groups[str(name)] = ranks
            descs[str(name)] = str(cfg.get("desc", ""))
    ws = extra.get("world_size")
    return RankDump(rank=rank, path=path, fmt=fmt, entries=entries, group_ranks=groups, group_desc=descs,
                    world_size=ws if isinstance(ws, int) else None,
                    job_id=str(extra["job_id"]) if extra.get("job_id") is not None else None,
                    dump_ns=extra.get("dump_unix_ns") if isinstance(extra.get("dump_unix_ns"), int) else None,
                    reason=extra.get("reason"), where=_dict_or_none(extra.get("where")),
                    last_op=_dict_or_none(extra.get("last_op")),
                    step=extra.get("step") if isinstance(extra.get("step"), int) else None, rank_from_name=from_name,
                    tracer=extra)


def expand_paths(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(candidate dump files, directories given). Directories are searched recursively for files
    that are not laggard's own trace files (shards, job.json, state files)."""
    files: list[Path] = []
    dirs: list[Path] = []
    for p in paths:
        if p.is_dir():
            dirs.append(p)
            files.extend(sorted(f for f in p.rglob("*") if f.is_file() and not _SKIP_NAMES.match(f.name)))
        elif p.exists():
            files.append(p)
        else:
            raise LaggardError(f"{p}: no such file or directory")
    return files, dirs


def _job_of(d: RankDump, spans: list[tuple[int, int, str]], slack_ns: int) -> str:
    """A dump's job: its laggard job id, else the job whose time span its entries overlap."""
    if d.job_id is not None:
        return d.job_id
    times = [e.created_ns for e in d.entries if e.created_ns > 0]
    if not times:
        return "?"
    lo, hi = min(times), max(times)
    for a, b, key in spans:
        if lo <= b + slack_ns and hi >= a - slack_ns:
            return key
    key = f"time:{lo}"
    spans.append((lo, hi, key))
    return key


def load_dumps(paths: list[Path], *, job_slack_s: float = 3600.0) -> list[RankDump]:
    """Every readable dump under ``paths`` of one job, one per rank.

    Unreadable files, dumps of another job and duplicate ranks are skipped, each with one warning
    (``LaggardWarning``); ``LaggardError`` when nothing is left. ``job_slack_s``: plain torch dumps
    carry no job id; two are taken as one job when their entries' times overlap within this.
    """
    files, _dirs = expand_paths(paths)
    dumps: list[RankDump] = []
    errors: list[LaggardError] = []
    for f in dict.fromkeys(f.resolve() for f in files):  # a file named twice (and inside a directory given) once
        try:
            dumps.append(read_dump(f))
        except LaggardError as e:
            errors.append(e)
    if not dumps and len(errors) == 1:
        raise errors[0]
    for e in errors:
        warnings.warn(f"skipped {e}", LaggardWarning, stacklevel=2)
    if not dumps:
        raise LaggardError(f"no readable Flight Recorder dump in {', '.join(str(p) for p in paths)}")
    named = [d for d in dumps if d.rank_from_name]
    if named:
        warnings.warn(f"{len(named)} dump(s) name no rank (plain torch dumps): rank taken from the file name "
                      f"({named[0].path.name} -> rank {named[0].rank})", LaggardWarning, stacklevel=2)
    spans: list[tuple[int, int, str]] = []
    slack = int(job_slack_s * 1e9)
    jobs: dict[str, list[RankDump]] = {}
    for d in sorted(dumps, key=lambda d: (d.job_id is None, str(d.path))):
        jobs.setdefault(_job_of(d, spans, slack), []).append(d)
    main = max(jobs, key=lambda k: (len({d.rank for d in jobs[k]}), -list(jobs).index(k)))
    for k, ds in jobs.items():
        if k != main:
            for d in ds:
                warnings.warn(f"skipped {d.path}: from another job ({k}, not {main})", LaggardWarning, stacklevel=2)
    by_rank: dict[int, RankDump] = {}
    for d in sorted(jobs[main], key=lambda d: (d.seen_ns or 0), reverse=True):
        if d.rank in by_rank:
            warnings.warn(f"skipped {d.path}: duplicate rank {d.rank} (kept the later dump {by_rank[d.rank].path})",
                          LaggardWarning, stacklevel=2)
            continue
        by_rank[d.rank] = d
    return [by_rank[r] for r in sorted(by_rank)]
