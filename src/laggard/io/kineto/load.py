"""Importer for PyTorch-profiler (Kineto) traces: one Chrome-trace JSON per rank, plain or gzipped.

``read_kineto(paths)`` reads a directory, a glob or a list of per-rank files into one op table:

1. every file is decoded, in worker processes when it pays (``laggard.io.kineto.files``), into that
   rank's ops;
2. ranks are identified (``distributedInfo.rank``, else ``rank<N>`` in the file name, with a
   warning) and checked to come from one job (one rank per file, the same world size, traced
   at the same time, common ``ProfilerStep#N`` numbers);
3. collectives are matched across ranks by process group and sequence number, or, without
   sequence numbers, by their order within the process group in each step;
4. per-rank clock offsets are estimated from the collectives' end times (a collective ends at
   the same moment on all its ranks) and removed; ranks on one host (same ``host_name`` and
   ``baseTimeNanoseconds``) share one clock. The offsets are reported (``clock_offsets_s``).

The parallel layout (each rank's DP rank, pipeline stage and TP rank) is inferred from the
traces or given (``laggard.io.kineto.layout``); ProfilerStep numbers that differ between ranks are
unified first (``laggard.io.kineto.steps``). Step 2 is ``laggard.io.kineto.identify``, steps 3 and 4
and the table itself ``laggard.io.kineto.table``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from laggard.errors import LaggardWarning
from laggard.io.kineto.files import decode_all, trace_files
from laggard.io.kineto.identify import check_same_job, common_steps, identify
from laggard.io.kineto.table import build_job

if TYPE_CHECKING:
    from laggard.optable.ops import Job


def read_kineto(
    spec: str | Path | Sequence[str | Path], *, workers: int | None = None, align_clocks: bool = True,
    layout: str | None = None, rank_map: str | Path | None = None,
) -> Job:
    """Read per-rank Kineto traces into a job (see the module docstring).

    ``layout`` (``"dp=2,pp=2"``) or ``rank_map`` (a YAML/JSON file) give the parallel layout;
    without them it is inferred from the traces (``laggard.io.kineto.layout``).
    """
    from laggard.io.kineto.layout import assign_peers, resolve_layout
    from laggard.io.kineto.missing import missing_ranks
    from laggard.io.kineto.p2p import peerless
    from laggard.io.kineto.steps import unify_steps

    files = trace_files(spec)
    ranks = decode_all(files, workers=workers)
    for r in ranks:
        for w in r.warnings:
            warnings.warn(w, LaggardWarning, stacklevel=2)
    identify(ranks)
    ranks.sort(key=lambda r: int(r.rank))  # type: ignore[arg-type]
    for w in unify_steps(ranks):
        warnings.warn(w, LaggardWarning, stacklevel=2)
    check_same_job(ranks)
    missing, left_out = missing_ranks(ranks)
    if missing:
        warnings.warn(missing, LaggardWarning, stacklevel=2)
    declared = next((r.world_size for r in ranks if r.world_size is not None), None)
    absent = sorted(set(range(declared or 0)) - {int(r.rank) for r in ranks} | left_out)  # type: ignore[arg-type]
    ranks = [r for r in ranks if int(r.rank) not in left_out]  # type: ignore[arg-type]
    ranks = common_steps(ranks)  # (transfers are matched step by step: both ends must be traced)
    pl = peerless(ranks)
    lay, lay_warnings, search = resolve_layout(ranks, spec=layout, rank_map=rank_map, pl=pl)
    matched, p2p_warnings = assign_peers(ranks, lay, pl, search)
    for w in lay_warnings + p2p_warnings:
        warnings.warn(w, LaggardWarning, stacklevel=2)
    job = build_job(ranks, files, align_clocks=align_clocks, layout=lay, peers_matched=matched)
    from laggard.optable.partial import (
        note_missing,  # (after the decode: pyarrow's threads would stop the fork)
    )

    note_missing(job.meta, absent, declared)
    return job


__all__ = ["read_kineto"]
