"""Importers and writers. ``load_job`` reads any supported trace into a :class:`laggard.optable.ops.Job`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from laggard.errors import LaggardError, LaggardWarning
from laggard.io.paths import is_glob
from laggard.optable.tracedir import JOB_FILE

if TYPE_CHECKING:
    from collections.abc import Callable

    from laggard.io.cache import JobCacheConfig
    from laggard.optable.ops import Job

# laggard.optable.ops (and so pyarrow) is imported inside the functions: Kineto traces are decoded in
# worker processes forked before pyarrow is loaded (see laggard.io.kineto.files.decode_all)


FORMATS = ("auto", "native", "ndtimeline", "kineto")


def detect_format(path: Path) -> str:
    """Guess the trace format from what is on disk."""
    if is_glob(path):
        return "kineto"
    if path.is_dir():
        if (path / JOB_FILE).exists():
            return "native"
        if list(path.glob("trace*.parquet")):
            return "ndtimeline"
        if any(p.name.endswith((".json", ".json.gz")) for p in path.iterdir()):
            return "kineto"
        raise LaggardError(f"{path}: a directory without job.json, trace*.parquet or *.json traces; "
                           "cannot tell its format")
    if path.suffix == ".parquet":
        return "ndtimeline"
    if path.name == JOB_FILE:
        return "native"
    if path.name.endswith((".json", ".json.gz")):
        return "kineto"
    raise LaggardError(f"{path}: cannot tell the trace format from the name; pass --format")


def load_job(
    path: str | Path | Sequence[str | Path], *, fmt: str = "auto", meta: str | Path | None = None,
    steps: str | None = None, layout: str | None = None, rank_map: str | Path | None = None,
    cache: JobCacheConfig | None = None,
) -> Job:
    """Read a trace (``fmt``: auto, native, ndtimeline, kineto) and optionally keep only ``steps`` ("10-20,25").

    Kineto (PyTorch profiler) traces are one file per rank: ``path`` may be a directory, a glob
    or a list of files.

    ``layout`` (``"dp=2,pp=2[,tp=T]"``, outermost dimension first) or ``rank_map`` (a YAML/JSON
    file rank -> {dp, pp[, tp]}) give a profiler trace's parallel layout instead of inferring it.

    ``cache``: keep the loaded op table there and map it on the next load of the same, unchanged
    files with the same options (``laggard.io.cache``; the CLI's default). Steps are selected after it.

    Warnings (what was skipped) are issued as ``LaggardWarning`` and kept in ``job.warnings``.
    """
    if fmt not in FORMATS:
        raise LaggardError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    paths = [Path(path)] if isinstance(path, str | Path) else [Path(p) for p in path]
    if len(paths) > 1:
        if fmt not in ("auto", "kineto"):
            raise LaggardError(f"several trace files are read only as Kineto traces, not {fmt!r}")
        _check_several(paths)
    options = {"fmt": fmt, "meta": None if meta is None else str(meta), "layout": layout,
               "rank_map": None if rank_map is None else str(rank_map)}
    key = None
    if cache is not None:
        from laggard.io.cache import entry_key, read_entry

        key = entry_key(paths, options, cache.settle_s)
        hit = read_entry(cache, key[0]) if key is not None else None
        if hit is not None:
            job = _collected(lambda: _rewarn(hit))
            return _selected(job, steps, options, paths)
    job = _collected(lambda: _load_any(paths, fmt, meta, layout, rank_map))
    if key is not None and key[1]:
        from laggard.io.cache import write_entry

        write_entry(cache, key[0], job, [str(p.absolute()) for p in paths])  # type: ignore[arg-type]
    return _selected(job, steps, options, paths)


def _load_any(paths: list[Path], fmt: str, meta: str | Path | None, layout: str | None,
              rank_map: str | Path | None) -> Job:
    if len(paths) == 1:
        return _load(paths[0], fmt, meta, layout, rank_map)
    return _load_kineto(paths, meta, layout, rank_map)


def _rewarn(job: Job) -> Job:
    """A cached job's load warnings, issued again (``_collected`` keeps them in ``job.warnings``)."""
    said, job.warnings = job.warnings, []
    for message in said:
        warnings.warn(message, LaggardWarning, stacklevel=3)
    return job


def _collected(load: Callable[[], Job]) -> Job:
    """``load()``, its LaggardWarnings kept in the job's ``warnings`` and every warning passed on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        job = load()
    for w in caught:
        if issubclass(w.category, LaggardWarning):
            job.warnings.append(str(w.message))
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return job


def _selected(job: Job, steps: str | None, options: dict, paths: list[Path]) -> Job:
    """The job with only ``steps`` (as asked) and how it was loaded (``Job.load_args``)."""
    if steps is not None:
        from laggard.optable.ops import select_steps

        job = _collected(lambda: select_steps(job, steps))
    job.load_args = {"paths": [str(p) for p in paths], "fmt": options["fmt"], "meta": options["meta"], "steps": steps,
                     "layout": options["layout"], "rank_map": options["rank_map"]}
    return job


def _check_several(paths: Sequence[str | Path]) -> None:
    """Several paths are per-rank profiler traces: say so when one is another format's file."""
    several = (f"several paths are read as per-rank PyTorch-profiler JSON traces (one file per rank), "
               f"and {len(paths)} were given")
    for item in paths:
        p = Path(item)
        if is_glob(p) or not p.exists():
            continue
        if p.is_dir():
            if (p / JOB_FILE).exists() or list(p.glob("trace*.parquet")):
                raise LaggardError(f"{several}; {p} is not one: it is a {detect_format(p)} trace, pass it alone")
        elif p.suffix == ".parquet" or p.name == JOB_FILE:
            what = "an NDTimeline parquet" if p.suffix == ".parquet" else "a native job.json"
            raise LaggardError(f"{several}; {p} is not one: {what} is passed alone")
        elif not p.name.endswith((".json", ".json.gz")) and p.stat().st_size > 0:
            from laggard.io.kineto.files import looks_like_kineto

            if not looks_like_kineto(p):
                raise LaggardError(f"{several}; {p} is not one (no traceEvents in its first bytes)")


def _load_kineto(paths: Sequence[str | Path] | Path, meta: str | Path | None,
                 layout: str | None = None, rank_map: str | Path | None = None) -> Job:
    from laggard.io.kineto.load import read_kineto

    if meta is not None:
        raise LaggardError("--meta is for NDTimeline traces; "
                           "give a profiler trace's layout with --layout or --rank-map")
    return read_kineto(paths, layout=layout, rank_map=rank_map)


def _load(p: Path, fmt: str, meta: str | Path | None, layout: str | None = None,
          rank_map: str | Path | None = None) -> Job:
    if (fmt in ("auto", "kineto")) and is_glob(p):
        return _load_kineto(p, meta, layout, rank_map)
    if not p.exists():
        raise LaggardError(f"{p}: no such file or directory")
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt == "kineto":
        return _load_kineto(p, meta, layout, rank_map)
    if layout is not None or rank_map is not None:
        flag = "--layout" if layout is not None else "--rank-map"
        raise LaggardError(f"{flag} is for PyTorch-profiler traces; a {fmt} trace carries its layout "
                           + ("in its meta YAML (--meta)" if fmt == "ndtimeline" else "in job.json"))
    if fmt == "native":
        from laggard.io.native import read_native

        if meta is not None:
            raise LaggardError("--meta is for NDTimeline traces; a native trace carries its metadata in job.json")
        job = read_native(p.parent if p.name == JOB_FILE else p)
    else:
        from laggard.io.ndtimeline.load import read_ndtimeline

        if p.is_dir():
            found = sorted(p.glob("trace*.parquet"))
            if len(found) != 1:
                raise LaggardError(f"{p}: expected one trace*.parquet, found {len(found)}; name the file")
            p = found[0]
        job = read_ndtimeline(p, meta=Path(meta) if meta is not None else None)
    return job


__all__ = ["FORMATS", "detect_format", "load_job"]
