"""``laggard top DIR`` / ``laggard top --monitor-url URL``: a running job in the terminal, refreshed in place."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from laggard.errors import LaggardError

_DIR_HELP = "The job's trace directory (what laggard.tracer.Tracer writes: job.json, op shards, rank state files)."
_WINDOW_HELP = "Recent complete steps the numbers cover (a collector's job: the collector's own window)."
_URL_HELP = "Read the job from this collector instead of a directory, e.g. http://127.0.0.1:8765."


def top(
    trace_dir: Annotated[Path | None, typer.Argument(help=_DIR_HELP)] = None,
    monitor_url: Annotated[str | None, typer.Option("--monitor-url", help=_URL_HELP)] = None,
    token: Annotated[str | None, typer.Option("--token", help="The collector's token (default: LAGGARD_TOKEN).")
                     ] = None,
    job: Annotated[str | None, typer.Option("--job", help="The job's id at the collector (default: its only job).")
                   ] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 2.0,
    window: Annotated[int, typer.Option("--window", help=_WINDOW_HELP)] = 20,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
) -> None:
    """Watch a running job: per-rank step times, the worst rank now, its finding; exits when the job ends."""
    if (trace_dir is None) == (monitor_url is None):
        raise LaggardError("top: give a trace directory or --monitor-url (one of them)")
    if trace_dir is not None and (token is not None or job is not None):
        raise LaggardError("top: --token and --job go with --monitor-url")
    if not (0 < interval < float("inf")):
        raise LaggardError(f"--interval must be a positive number of seconds (got {interval})")
    from laggard.monitor.top import DirTop, TopConfig, UrlTop

    cfg = TopConfig(window_steps=window)
    source: Any = (DirTop(trace_dir, cfg) if trace_dir is not None
                   else UrlTop(str(monitor_url), token or os.environ.get("LAGGARD_TOKEN"), job, cfg))
    from rich.console import Console

    from laggard.report.top import top_frame, top_summary

    console = Console(highlight=False)
    polled = time.monotonic()
    state = source.poll()
    if once:
        console.print(top_frame(state))
        return

    def after(last: float) -> tuple[float, Any]:
        """The next frame, ``interval`` after the last poll began (its reading and analysis count in it)."""
        time.sleep(max(0.0, interval - (time.monotonic() - last)))
        return time.monotonic(), source.poll()

    try:
        if console.is_interactive:
            from rich.live import Live

            with Live(top_frame(state), console=console, auto_refresh=False, transient=True,
                      redirect_stdout=False, redirect_stderr=False) as live:
                while state.phase != "ended":
                    polled, state = after(polled)
                    live.update(top_frame(state), refresh=True)
        else:  # a pipe or a file: no frames in between, the last one and the summary at the end
            while state.phase != "ended":
                polled, state = after(polled)
    except KeyboardInterrupt:
        state.ended_why = state.ended_why or "stopped (Ctrl-C)"
    console.print(top_frame(state))
    console.print()
    console.print(top_summary(state))


def register(app: typer.Typer) -> None:
    app.command(name="top")(top)
