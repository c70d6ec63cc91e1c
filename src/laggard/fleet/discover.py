"""Find the jobs under the paths a user names: one job per trace, whatever its format.

* a directory with ``job.json``: a native job (its subdirectories are not searched);
* each ``trace*.parquet``: an NDTimeline job (its ``meta-*.yaml`` beside it, found by the importer);
* a directory of ``*.json`` / ``*.json.gz`` files (no job.json): one PyTorch-profiler job, a file per rank;
* a manifest (``*.txt``, ``*.lst``, ``*.list``, ``*manifest*``): one job path or URL per line
  (``#`` comments; relative paths are relative to the manifest);
* any of these behind an fsspec URL (``s3://bucket/runs``, ``file:///data``): found with fsspec and
  fetched by the task that analyses it, where it runs.

Directories are searched recursively. A job's ``job`` id is its absolute path (or URL): the key
``--resume`` matches rows on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError
from laggard.optable.tracedir import JOB_FILE

MANIFEST_SUFFIXES = (".txt", ".lst", ".list")
KINETO_SUFFIXES = (".json", ".json.gz")
# files that sit beside traces but are not rank traces (laggard's own outputs, synth's truth)
NOT_TRACES = {JOB_FILE, "truth.json"}


@dataclass(kw_only=True, slots=True, frozen=True)
class JobSpec:
    """One job to analyze: where it lies and how big it is (for batching)."""

    job: str  # id: absolute path or URL
    path: str  # local path, or the path inside ``protocol``'s filesystem
    fmt: str  # native | ndtimeline | kineto
    size_bytes: int = 0
    protocol: str | None = None  # fsspec protocol of a remote job; None when local
    url: str | None = None  # the URL the user gave, for a remote job (to rebuild its filesystem)
    extra_files: tuple[str, ...] = field(default_factory=tuple)  # fetched beside a remote file (metadata)


def is_url(p: str) -> bool:
    return "://" in p and not p.startswith("file://")


def discover(paths: Sequence[str | Path], *, exclude: Path | None = None) -> list[JobSpec]:
    """All jobs under ``paths``, each once, in a stable order. ``exclude``: a directory to skip
    (the run's own output directory)."""
    seen: dict[str, JobSpec] = {}
    for p in paths:
        found = list(_discover_one(str(p), exclude.resolve() if exclude is not None else None))
        if not found:
            raise LaggardError(f"{p}: no jobs found (no job.json, trace*.parquet or profiler *.json traces)")
        for spec in found:
            seen.setdefault(spec.job, spec)
    return list(seen.values())


def _discover_one(p: str, exclude: Path | None) -> Iterator[JobSpec]:
    if p.startswith("file://"):
        p = p.removeprefix("file://")
    if is_url(p):
        yield from _discover_remote(p)
        return
    path = Path(p)
    if not path.exists():
        raise LaggardError(f"{p}: no such file or directory")
    path = path.resolve()
    if path.is_file():
        yield from _local_file(path, exclude)
    else:
        yield from _walk_local(path, exclude)


def _local_file(path: Path, exclude: Path | None) -> Iterator[JobSpec]:
    name = path.name
    if name == JOB_FILE:
        yield _local_spec(path.parent, "native")
    elif name.endswith(".parquet"):
        yield _local_spec(path, "ndtimeline")
    elif name.endswith(KINETO_SUFFIXES):
        yield _local_spec(path, "kineto")
    elif _is_manifest(name):
        yield from _manifest(path.read_text(errors="replace").splitlines(), str(path), path.parent, exclude)
    else:
        raise LaggardError(f"{path}: not a trace (job.json, *.parquet, *.json[.gz]) "
                           "nor a manifest (*.txt, *.lst, *.list)")


def _is_manifest(name: str) -> bool:
    return name.endswith(MANIFEST_SUFFIXES) or "manifest" in name.lower()


def _manifest(lines: list[str], where: str, base: Path | None, exclude: Path | None) -> Iterator[JobSpec]:
    for num, raw in enumerate(lines, 1):
        entry = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not entry:
            continue
        target = entry if "://" in entry or base is None or os.path.isabs(entry) else str(base / entry)
        try:
            yield from _discover_one(target, exclude)
        except LaggardError as e:
            raise LaggardError(f"{where}:{num}: {e}") from None


def _local_spec(path: Path, fmt: str) -> JobSpec:
    if path.is_dir():
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    else:
        size = path.stat().st_size
    return JobSpec(job=str(path), path=str(path), fmt=fmt, size_bytes=size)


def _walk_local(root: Path, exclude: Path | None) -> Iterator[JobSpec]:
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if exclude is not None and (here == exclude or exclude in here.parents):
            dirnames[:] = []
            continue
        dirnames.sort()
        kind, files = _classify(filenames)
        if kind == "native":
            dirnames[:] = []
            yield _local_spec(here, "native")
        elif kind == "ndtimeline":
            for f in files:
                yield _local_spec(here / f, "ndtimeline")
        elif kind == "kineto":
            yield _local_spec(here, "kineto")


def _classify(filenames: list[str]) -> tuple[str | None, list[str]]:
    """What a directory holds, from its file names: native, ndtimeline (the trace files), kineto."""
    if JOB_FILE in filenames:
        return "native", []
    traces = sorted(f for f in filenames if f.startswith("trace") and f.endswith(".parquet"))
    if traces:
        return "ndtimeline", traces
    if any(f.endswith(KINETO_SUFFIXES) and f not in NOT_TRACES for f in filenames):
        return "kineto", []
    return None, []


# ---------------------------------------------------------------- fsspec URLs


def _fs(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ModuleNotFoundError:
        raise LaggardError(f"{url}: reading URLs needs fsspec: pip install 'laggard[remote]'") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ValueError, ImportError) as e:
        raise LaggardError(f"{url}: cannot open this URL ({e})") from None


def _discover_remote(url: str) -> Iterator[JobSpec]:
    fs, root = _fs(url)
    proto = url.split("://", 1)[0]
    try:
        if not fs.exists(root):
            raise LaggardError(f"{url}: no such file or directory")
        if fs.isfile(root):
            yield from _remote_file(fs, proto, root)
            return
        yield from _walk_remote(fs, proto, root)
    except OSError as e:
        raise LaggardError(f"{url}: cannot list ({e})") from None


def _remote_spec(fs: Any, proto: str, path: str, fmt: str, size: int, extra: tuple[str, ...] = ()) -> JobSpec:
    url = fs.unstrip_protocol(path)
    if not url.startswith(proto + "://"):
        url = f"{proto}://{path}"
    return JobSpec(job=url, path=path, fmt=fmt, size_bytes=size, protocol=proto, url=url, extra_files=extra)


def _remote_file(fs: Any, proto: str, path: str) -> Iterator[JobSpec]:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    parent = path.rstrip("/").rsplit("/", 1)[0]
    if name == JOB_FILE:
        yield from _walk_remote(fs, proto, parent)
    elif name.endswith(".parquet"):
        metas = tuple(sorted(f for f in fs.ls(parent, detail=False) if f.rsplit("/", 1)[-1].startswith("meta")))
        yield _remote_spec(fs, proto, path, "ndtimeline", int(fs.size(path) or 0), metas)
    elif name.endswith(KINETO_SUFFIXES):
        yield _remote_spec(fs, proto, path, "kineto", int(fs.size(path) or 0))
    elif _is_manifest(name):
        text = fs.cat_file(path).decode(errors="replace")
        base = f"{proto}://{parent}"
        lines = [ln if ("://" in ln or ln.strip().startswith("#") or not ln.strip()) else f"{base}/{ln.strip()}"
                 for ln in text.splitlines()]
        yield from _manifest(lines, f"{proto}://{path}", None, None)
    else:
        raise LaggardError(f"{proto}://{path}: not a trace nor a manifest")


def _walk_remote(fs: Any, proto: str, root: str) -> Iterator[JobSpec]:
    entries = fs.ls(root, detail=True)
    files = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e for e in entries if e["type"] == "file"}
    dirs = sorted(e["name"] for e in entries if e["type"] == "directory")
    kind, traces = _classify(list(files))
    size = sum(int(e.get("size") or 0) for e in files.values())
    if kind == "native":
        yield _remote_spec(fs, proto, root, "native", size)
        return
    if kind == "ndtimeline":
        metas = tuple(sorted(files[f]["name"] for f in files if f.startswith("meta")))
        for t in traces:
            yield _remote_spec(fs, proto, files[t]["name"], "ndtimeline", int(files[t].get("size") or 0), metas)
    elif kind == "kineto":
        yield _remote_spec(fs, proto, root, "kineto", size)
    for d in dirs:
        yield from _walk_remote(fs, proto, d)
