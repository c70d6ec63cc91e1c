"""Options and helpers the `laggard` commands share (one definition each)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from laggard.diagnose.config import HEALTHY_THRESHOLD

FormatOpt = Annotated[
    str, typer.Option("--format", "-f", help="Trace format: auto, native, ndtimeline, kineto.")
]
MetaOpt = Annotated[
    Path | None, typer.Option("--meta", help="NDTimeline metadata YAML (dp/pp/tp/vpp sizes); default: meta-*.yaml beside the trace.")
]

LayoutOpt = Annotated[
    str | None, typer.Option("--layout", help="Profiler traces: the parallel layout, e.g. dp=2,pp=2[,tp=T] (outermost dimension first, as ranks are numbered); default: inferred from the traces.")
]
RankMapOpt = Annotated[
    Path | None, typer.Option("--rank-map", help="Profiler traces: a YAML/JSON file mapping each rank to {dp: D, pp: P[, tp: T]}.")
]


def load_trace(path: Path, fmt: str, meta: Path | None, steps: str | None = None, layout: str | None = None,
          rank_map: Path | None = None):
    from laggard.io import load_job

    return load_job(path, fmt=fmt, meta=meta, steps=steps, layout=layout, rank_map=rank_map)


HealthyOpt = Annotated[
    float | None, typer.Option("--healthy-threshold", help=f"Call the job healthy (no findings) below this slowdown (default {HEALTHY_THRESHOLD:g}).")
]
