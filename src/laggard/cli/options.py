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
    Path | None, typer.Option("--meta", help=(
        "NDTimeline metadata YAML (dp/pp/tp/vpp sizes); default: meta-*.yaml beside the trace."))
]

LayoutOpt = Annotated[
    str | None, typer.Option("--layout", help=(
        "Profiler traces: the parallel layout, e.g. dp=2,pp=2[,tp=T] (outermost "
        "dimension first, as ranks are numbered); default: inferred from the traces."))
]
RankMapOpt = Annotated[
    Path | None, typer.Option("--rank-map", help=(
        "Profiler traces: a YAML/JSON file mapping each rank to {dp: D, pp: P[, tp: T]}."))
]


def load_trace(path: Path, fmt: str, meta: Path | None, steps: str | None = None, layout: str | None = None,
          rank_map: Path | None = None):
    from laggard.io import load_job

    return load_job(path, fmt=fmt, meta=meta, steps=steps, layout=layout, rank_map=rank_map, cache=job_cache())


def job_cache():  # noqa: ANN201 - a JobCacheConfig or None; laggard.io.cache is imported only here
    """The job cache of this command (``laggard.io.cache.cli_config``): off under ``laggard --no-cache``."""
    import click

    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.find_root().params.get("_no_cache"):
        return None  # without importing the cache module
    from laggard.io.cache import cli_config

    return cli_config(no_cache=False)


HealthyOpt = Annotated[
    float | None, typer.Option("--healthy-threshold", help=(
        f"Call the job healthy (no findings) below this slowdown (default {HEALTHY_THRESHOLD:g})."))
]


# the causes `--inject` takes (laggard.groundtruth.inject.CAUSES; a test keeps the two alike), listed
# under the options of the commands that take it: one per line, so no cause is cut at 80 columns
INJECT_CAUSES = (
    ("slow-worker:rank=R,factor=F", "rank R computes F x as long (repeatable for other ranks)"),
    ("heavy-last-stage:factor=F", "the loss layer on the last stage costs F x a normal layer more"),
    ("seqlen-imbalance:sigma=S", "lognormal sequence lengths, cost ~ their squares"),
    ("gc-pauses:prob=P,pause_ms=M", "GC pauses of M ms at a share P of forward passes"),
    ("slow-link:src=A,dst=B,delay_ms=D", "transfers from rank A to rank B D ms late"),
    ("launch-delay:ms=D", "D ms of CPU-side work before each compute launch"),
    ("host-stall:rank=R,ms=M,every=K", "M ms of untraced host work on rank R every K-th step"),
    ("heavy-stage:stage=S,factor=F", "every rank of pipeline stage S does F x its work"),
)
INJECT_EPILOG = "Causes for --inject CAUSE[:key=value,...] (repeatable):\n\n" + "\n\n".join(
    f"  {spec}  {what}" for spec, what in INJECT_CAUSES)



def _no_progress(done: int, total: int | None, what: str | None = None) -> None:
    """The progress callback of a quiet command: nothing to show."""


def progress_callback(description: str, unit: str, *, quiet: bool = False):  # noqa: ANN201 - a context manager of a callback
    """A rich progress bar on stderr (transient; off when stderr is not a terminal, or ``quiet``) and the
    ``on_progress(done, total, what=None)`` callback that moves it (``what``, where given, replaces
    the description: the phase under way): for commands that run longer than ~2 s. With ``quiet``
    rich is not imported (~30 ms of a `laggard analyze -q`, see ``laggard.startup``)."""
    import contextlib

    if quiet:
        return contextlib.nullcontext(_no_progress)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextlib.contextmanager
    def bar():  # noqa: ANN202
        console = Console(stderr=True)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                      TimeElapsedColumn(), console=console, transient=True,
                      disable=quiet or not console.is_terminal) as p:
            task = p.add_task(description, total=None)

            def on_progress(done: int, total: int | None, what: str | None = None) -> None:
                p.update(task, completed=done, total=total, **({"description": what} if what else {}))

            yield on_progress

    return bar()
