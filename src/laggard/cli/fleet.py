"""`laggard fleet`: analyze every job under the given paths, write fleet.parquet, hosts.parquet and fleet.html."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from laggard.cli.options import HealthyOpt


def fleet(
    paths: Annotated[list[str], typer.Argument(help=(
        "Directories to search for jobs (native job.json dirs, NDTimeline trace*.parquet + meta "
        "yaml, profiler *.json dirs), manifest files listing job paths, or fsspec URLs."))],
    engine: Annotated[str, typer.Option("--engine", help=(
        "Where to run: local (a process pool here) or ray."))] = "local",
    ray_address: Annotated[str | None, typer.Option("--ray-address", help=(
        "Ray cluster to use, e.g. ray://head:10001 or auto (default: start a local Ray)."))] = None,
    ray_ship_code: Annotated[bool, typer.Option("--ray-ship-code/--no-ray-ship-code", help=(
        "With --ray-address: ship this laggard to the cluster's workers (Ray runtime_env "
        "py_modules); --no-ray-ship-code when the nodes have laggard installed."))] = True,
    out: Annotated[Path, typer.Option("--out", "-o", help=(
        "Directory for fleet.parquet, hosts.parquet, fleet.html and jobs/*.json."))] = Path("fleet-out"),
    resume: Annotated[bool, typer.Option("--resume", help=(
        "Continue an earlier run in --out: skip the jobs it already has rows for."))] = False,
    workers: Annotated[int | None, typer.Option("--workers", "-w", help=(
        "Worker processes (default: one per CPU; 0: analyze in this process)."))] = None,
    healthy_threshold: HealthyOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar and no summary.")] = False,
) -> None:
    """Analyze many jobs (the `analyze` pipeline on each): one row per job and a fleet report."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from laggard.analysis.config import AnalysisConfig
    from laggard.cli.options import job_cache
    from laggard.fleet import FleetConfig, run_fleet
    from laggard.fleet.report import write_fleet_html
    from laggard.fleet.stats import fleet_stats
    from laggard.report.jsonout import dump_json

    cfg = FleetConfig(analysis=AnalysisConfig(healthy_threshold=healthy_threshold), job_cache=job_cache())
    console = Console(stderr=True, highlight=False)
    progress = Progress(TextColumn("analyzing jobs"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                        TimeRemainingColumn(), console=console, disable=quiet, transient=True)
    task = progress.add_task("fleet", total=None, rate="")

    def on_progress(done: int, total: int) -> None:
        t = progress.tasks[0]
        speed = t.speed
        progress.update(task, completed=done, total=total, rate=f"{speed:.1f} jobs/s" if speed else "")

    with progress:
        run = run_fleet(paths, out, engine=engine, workers=workers, ray_address=ray_address,
                        ray_ship_code=ray_ship_code, resume=resume,
                        config=cfg, on_progress=on_progress)
    from laggard.fleet.goodput import fleet_goodput
    from laggard.fleet.hosts import host_view, write_hosts

    stats = fleet_stats(run.parquet, cfg)
    hosts = host_view(run.parquet, cfg)
    write_hosts(hosts, out)
    goodput = fleet_goodput(run.parquet)
    html = write_fleet_html(stats, out / "fleet.html", hosts=hosts, goodput=goodput)
    dump_json({"run": {"num_jobs": run.num_jobs, "num_skipped": run.num_skipped, "num_analyzed": run.num_analyzed,
                       "wall_s": run.wall_s, "first_row_s": run.first_row_s, "engine": run.engine,
                       "workers": run.workers}, **stats.to_json(), "hosts": hosts.to_json(top=20),
               "goodput": goodput.to_json()},
              out / "fleet-summary.json")
    if not quiet:
        from laggard.fleet.terminal import print_fleet_summary

        print_fleet_summary(run, stats, str(html), hosts=hosts, goodput=goodput)


def register(app: typer.Typer) -> None:
    app.command(name="fleet")(fleet)
