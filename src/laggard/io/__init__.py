"""Importers and writers. ``load_job`` reads any supported trace into a :class:`laggard.ops.Job`."""

from __future__ import annotations

import warnings
from pathlib import Path

from laggard.ops import Job, LaggardError, LaggardWarning

FORMATS = ("auto", "native", "ndtimeline")


def detect_format(path: Path) -> str:
    """Guess the trace format from what is on disk."""
    if path.is_dir():
        if (path / "job.json").exists():
            return "native"
        if list(path.glob("trace*.parquet")):
            return "ndtimeline"
        raise LaggardError(f"{path}: a directory without job.json or trace*.parquet; cannot tell its format")
    if path.suffix == ".parquet":
        return "ndtimeline"
    if path.name == "job.json":
        return "native"
    raise LaggardError(f"{path}: cannot tell the trace format from the name; pass --format")


def load_job(path: str | Path, *, fmt: str = "auto", meta: str | Path | None = None, steps: str | None = None) -> Job:
    """Read a trace (``fmt``: auto, native, ndtimeline) and optionally keep only ``steps`` ("10-20,25").

    Warnings (what was skipped) are issued as ``LaggardWarning`` and kept in ``job.warnings``.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        job = _load(Path(path), fmt, meta, steps)
    for w in caught:
        if issubclass(w.category, LaggardWarning):
            job.warnings.append(str(w.message))
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return job


def _load(p: Path, fmt: str, meta: str | Path | None, steps: str | None) -> Job:
    if fmt not in FORMATS:
        raise LaggardError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if not p.exists():
        raise LaggardError(f"{p}: no such file or directory")
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt == "native":
        from laggard.io.native import read_native

        if meta is not None:
            raise LaggardError("--meta is for NDTimeline traces; a native trace carries its metadata in job.json")
        job = read_native(p.parent if p.name == "job.json" else p)
    else:
        from laggard.io.ndtimeline import read_ndtimeline

        if p.is_dir():
            found = sorted(p.glob("trace*.parquet"))
            if len(found) != 1:
                raise LaggardError(f"{p}: expected one trace*.parquet, found {len(found)}; name the file")
            p = found[0]
        job = read_ndtimeline(p, meta=Path(meta) if meta is not None else None)
    if steps is not None:
        from laggard.ops import select_steps

        job = select_steps(job, steps)
    return job


__all__ = ["FORMATS", "detect_format", "load_job"]
