"""A cache of loaded jobs: the op table of a trace as read once, kept as an Arrow IPC stream file.

Loading a trace is the import work (Parquet decoding and NDTimeline's template expansion, Kineto's
JSON parsing in worker processes); a command run again on the same trace (another `laggard whatif`,
the analysis after a `--healthy-threshold` change) maps the cached table instead. Measured on
trace-AR (117k ops, this 2-core VM): loading 31-71 ms against 0.7 ms to map the cached file
(14 MB, uncompressed: compressed ones took 6-10 ms to read back).

What makes an entry (``entry_key``): the size and mtime of every source file of the importers
(``laggard.io``, ``laggard.optable``), so an edited or reinstalled importer never reads an old table;
the format and the load options; and (path, size, mtime, ctime, inode) of every file the load could
read: a file and the NDTimeline meta YAML files beside it, a directory's trace, metadata and rank-state
files, a glob's matches, ``--meta`` and ``--rank-map``. Step selection (``--steps``) is applied after
the cache, so one entry serves every selection.

A file changed within a file-system timestamp tick keeps its mtime: as git does with its index, a
load whose inputs changed in the last ``JobCacheConfig.settle_s`` is not cached (a trace being
written, a test's fresh file). Entries are written to a temporary name and renamed into place (a
reader sees a whole file or none), read by memory map, and never written again in place; an entry
that fails to read is removed and the trace loaded. Over ``max_bytes`` the least recently used
entries go (a hit touches its entry).

The CLI caches by default (``laggard --no-cache`` or ``LAGGARD_NO_CACHE=1``: off; directory:
``LAGGARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/laggard/jobs``, else ``~/.cache/laggard/jobs``);
``laggard.io.load_job`` caches only when given a ``JobCacheConfig``.
"""

from __future__ import annotations

import glob as globmod
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laggard.io.paths import is_glob
from laggard.optable.tracedir import STATE_SUFFIX

if TYPE_CHECKING:
    from laggard.optable.ops import Job

# bump when what an entry holds changes (its schema metadata, how a key is made)
CACHE_FORMAT = 1
_META_KEY = b"laggard.job"
_SUFFIX = ".arrow"
# what the importers read in a directory: traces, job.json, meta YAML, the tracer's rank state files
_READ_SUFFIXES = (".parquet", ".json", ".json.gz", ".yaml", ".yml", STATE_SUFFIX)
# a directory with more files than this is not cached (stating them all would cost more than it saves)
_MAX_INPUT_FILES = 100_000


@dataclass(frozen=True)
class JobCacheConfig:
    """Where loaded jobs are cached and how much of the disk they may take."""

    directory: Path
    # 4 GiB: trace-AR's entry is 14 MB, a 4,096-worker job's (7.7M ops) about 1 GB; a handful of
    # big jobs fit, and the user's cache directory is not filled by one that is analyzed once
    max_bytes: int = 4 << 30
    # 2 s: file-system timestamps move in ticks of up to a few ms (ext4 with the kernel's coarse
    # clock), some file systems in 1-2 s (FAT, some network mounts); a file changed in place within a
    # tick keeps its mtime and size, so a load of inputs this fresh is not cached (module doc)
    settle_s: float = 2.0


def _log():  # noqa: ANN202 - logging is imported only when there is something to say (start-up time)
    import logging

    return logging.getLogger(__name__)


def default_directory() -> Path:
    """``LAGGARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/laggard/jobs``, else ``~/.cache/laggard/jobs``."""
    if os.environ.get("LAGGARD_CACHE_DIR"):
        return Path(os.environ["LAGGARD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "laggard" / "jobs"


def switched_off() -> bool:
    """Whether ``LAGGARD_NO_CACHE`` turns the CLI's cache off (set to anything but 0 or empty)."""
    return os.environ.get("LAGGARD_NO_CACHE", "") not in ("", "0")


def cli_config(no_cache: bool) -> JobCacheConfig | None:
    """The CLI's cache (``configured``); None with ``--no-cache`` or under ``LAGGARD_NO_CACHE``."""
    return None if no_cache or switched_off() else configured()


def configured() -> JobCacheConfig:
    """The cache the environment describes, whether or not it is switched off: its directory
    (``default_directory``) and ``LAGGARD_CACHE_MAX_GIB``, its size cap (default
    ``JobCacheConfig.max_bytes``)."""
    cfg = JobCacheConfig(directory=default_directory())
    cap = os.environ.get("LAGGARD_CACHE_MAX_GIB")
    if cap:
        try:
            gib = float(cap)
        except ValueError:
            gib = float("nan")
        if not gib >= 0 or gib == float("inf"):
            from laggard.errors import LaggardError

            raise LaggardError(f"LAGGARD_CACHE_MAX_GIB={cap!r}: expected a size in GiB, "
                               "a number >= 0 (0: cache nothing)")
        cfg = JobCacheConfig(directory=cfg.directory, max_bytes=int(gib * 2**30), settle_s=cfg.settle_s)
    return cfg


def _stat_row(p: Path) -> list:
    s = p.stat()
    return [str(p), s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino]


def _files_of(path: Path) -> list[Path]:
    """The files a load of ``path`` could read (module doc): a glob's matches; a directory's trace,
    metadata and rank-state files (not its subdirectories: no importer reads them); a file and the
    NDTimeline meta YAML files beside it."""
    if is_glob(path):  # a glob of profiler traces
        return sorted(Path(x) for x in globmod.glob(str(path)) if Path(x).is_file())
    if path.is_dir():
        return sorted(f for f in path.iterdir() if f.name.endswith(_READ_SUFFIXES) and f.is_file())
    return [path, *sorted(f for f in path.parent.glob("meta*.y*ml") if f.is_file())]


def _code_rows() -> list:
    """Size and mtime of the importers' source files (an edited importer makes new keys)."""
    root = Path(__file__).resolve().parents[1]  # the laggard package
    rows = []
    for sub in ("io", "optable"):
        for f in sorted((root / sub).rglob("*.py")):
            s = f.stat()
            rows.append([str(f.relative_to(root)), s.st_size, s.st_mtime_ns])
    return rows


def entry_key(paths: list[Path], options: dict[str, Any], settle_s: float) -> tuple[str, bool] | None:
    """(the entry's name, whether its inputs have settled), or None where the inputs cannot be listed
    (missing files: the load reports them) or are too many."""
    try:
        files: list[Path] = []
        for p in paths:
            files += _files_of(p.absolute())
        for extra in ("meta", "rank_map"):
            if options.get(extra) is not None:
                files.append(Path(options[extra]).absolute())
        if len(files) > _MAX_INPUT_FILES:
            return None
        rows = [_stat_row(f) for f in files]
    except (OSError, ValueError):
        return None
    # by mtime: a change after it has settled moves it to a later tick (one that sets it back moves
    # the ctime, which is in the key)
    settled = max((r[2] for r in rows), default=0) < time.time_ns() - int(settle_s * 1e9)
    blob = json.dumps({"format": CACHE_FORMAT, "code": _code_rows(),
                       "paths": [str(p.absolute()) for p in paths], "options": options, "inputs": rows},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32], settled


def read_entry(cfg: JobCacheConfig, key: str) -> Job | None:
    """The cached job, or None (no entry, or one that cannot be read: removed)."""
    path = cfg.directory / f"{key}{_SUFFIX}"
    if not path.exists():
        return None
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from laggard.optable.ops import Job, JobMeta

    try:
        with pa.memory_map(str(path)) as src:
            table = ipc.open_stream(src).read_all()
        stored = json.loads(table.schema.metadata[_META_KEY])
        meta = JobMeta.from_json(stored["meta"], where=str(path))
        warnings_ = [str(w) for w in stored["warnings"]]
    except Exception as e:  # noqa: BLE001 - any unreadable entry is a miss, whatever broke it
        _log().warning("job cache: %s unreadable (%s); removed, loading the trace", path, e)
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # recently used: the last to be evicted
    except OSError:
        pass
    return Job(table=table.replace_schema_metadata(None), meta=meta, warnings=warnings_)


def write_entry(cfg: JobCacheConfig, key: str, job: Job, source: list[str]) -> None:
    """Store ``job`` (its table, metadata and load warnings) under ``key``, with the ``source`` paths
    it was loaded from (for `laggard cache`); a failure only logs."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    if job.table.nbytes > cfg.max_bytes:
        return
    meta = json.dumps({"meta": job.meta.to_json(), "warnings": list(job.warnings), "source": source}).encode()
    table = job.table.replace_schema_metadata({_META_KEY: meta})
    tmp = cfg.directory / f".{key}.{os.getpid()}.tmp"
    try:
        cfg.directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # traces are the user's: not for others to read
        with ipc.new_stream(str(tmp), table.schema) as w:  # a stream: chunks may have their own dictionaries
            w.write_table(table)
        os.replace(tmp, cfg.directory / f"{key}{_SUFFIX}")
    except (OSError, pa.ArrowException) as e:
        _log().warning("job cache: could not write to %s (%s)", cfg.directory, e)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the directory itself is not there (a file in the way)
            pass
        return
    evict(cfg)


def entries(cfg: JobCacheConfig) -> list[tuple[Path, int, float]]:
    """(path, bytes, last used as a Unix time) of each entry, least recently used first."""
    out = []
    try:
        for f in cfg.directory.glob(f"*{_SUFFIX}"):
            try:
                s = f.stat()
            except OSError:  # removed meanwhile by another process
                continue
            out.append((f, s.st_size, s.st_mtime))
    except OSError:
        return []
    return sorted(out, key=lambda e: e[2])


def entry_source(path: Path) -> list[str]:
    """The paths an entry was loaded from ([] where it cannot be read)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        with pa.memory_map(str(path)) as src:
            return [str(s) for s in json.loads(ipc.open_stream(src).schema.metadata[_META_KEY])["source"]]
    except Exception:  # noqa: BLE001 - removed meanwhile, or not one of ours: nothing to show
        return []


def evict(cfg: JobCacheConfig) -> int:
    """Remove the least recently used entries until the rest fit ``max_bytes``; returns how many."""
    found = entries(cfg)
    total = sum(size for _, size, _ in found)
    removed = 0
    for f, size, _ in found:
        if total <= cfg.max_bytes:
            break
        f.unlink(missing_ok=True)
        total -= size
        removed += 1
    return removed


def clear(cfg: JobCacheConfig) -> tuple[int, int]:
    """Remove every entry (and leftover temporary files); returns (entries, bytes) removed."""
    found = entries(cfg)
    for f, _, _ in found:
        f.unlink(missing_ok=True)
    for tmp in cfg.directory.glob(".*.tmp") if cfg.directory.is_dir() else []:
        tmp.unlink(missing_ok=True)
    return len(found), sum(size for _, size, _ in found)


__all__ = ["CACHE_FORMAT", "JobCacheConfig", "clear", "cli_config", "default_directory", "entries", "entry_key",
           "entry_source", "evict", "read_entry", "write_entry"]
