"""The `laggard demo` command: a real traced training job, analyzed. Light at import."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from laggard.demo.launch import JobConfig
    from laggard.groundtruth.inject import Injection


def demo(
    quick: Annotated[bool, typer.Option("--quick", help=(
        "A shorter run (under a minute): fewer steps, a smaller model."))] = False,
    inject: Annotated[list[str] | None, typer.Option("--inject", help=(
        "Inject a straggler cause, CAUSE[:key=value,...] (repeatable; the causes are listed below)."))] = None,
    out: Annotated[Path, typer.Option("--out", help=(
        "Directory for the trace (OUT/trace) and the reports."))] = Path("out/demo"),
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel replicas.")] = 2,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages (one process per dp x pp rank).")] = 2,
    steps: Annotated[int | None, typer.Option("--steps", help=(
        "Traced training steps (default 200, 24 with --quick; 3 untraced warm-up steps come first)."))] = None,
    microbatches: Annotated[int, typer.Option("--microbatches", help="Microbatches per step (1F1B schedule).")] = 4,
    seed: Annotated[int, typer.Option("--seed", help=(
        "Seed of the model, the data order and the injected randomness."))] = 0,
    trace: Annotated[Path | None, typer.Option("--trace", help=(
        "Analyze this existing trace instead of running the job (any trace laggard analyze reads)."))] = None,
    monitor: Annotated[bool, typer.Option("--monitor", help=(
        "Also stream the job live into a local collector (OUT/monitor.db) and print the dashboard address."))] = False,
    monitor_port: Annotated[int | None, typer.Option("--monitor-port", help=(
        "Port of the local collector (--monitor; default 8765)."))] = None,
    monitor_linger_s: Annotated[float | None, typer.Option("--monitor-linger-s", help=(
        "Keep the local collector up this long after the job (default: until Ctrl-C)."))] = None,
    monitor_url: Annotated[str | None, typer.Option("--monitor-url", help=(
        "Stream into the collector already running at this address (e.g. "
        "http://127.0.0.1:8765) instead of starting one; implies --monitor."))] = None,
    token: Annotated[str | None, typer.Option("--token", help=(
        "Bearer token of the --monitor-url collector (default: LAGGARD_TOKEN)."))] = None,
    act: Annotated[bool, typer.Option("--act", help=(
        "Runtime actions (the Controller of laggard.mitigate): shift samples off a "
        "slow DP rank and back, planned GC / balanced packing on the collector's "
        "findings; logged to OUT/actions.json. Kill switch: LAGGARD_ACT=0."))] = False,
    shot: Annotated[bool, typer.Option("--screenshot/--no-screenshot", help=(
        "Save a screenshot of the HTML report beside it (OUT/report.png) when Chromium is installed."))] = True,
) -> None:
    """Train a small GPT on dp x pp CPU processes with the tracer on, analyze it, write the HTML report."""
    from laggard.demo.run import demo_config
    from laggard.errors import LaggardError
    from laggard.groundtruth.inject import parse_injections

    injections = parse_injections(inject)
    if trace is not None:
        if injections:
            raise LaggardError("--inject applies to the demo job; with --trace nothing is run")
        _report_trace(trace, out, shot)
        return
    cfg = demo_config(quick=quick, dp=dp, pp=pp, steps=steps, microbatches=microbatches, seed=seed,
                      injections=injections, trace_dir=out / "trace", act=act, actions_path=out / "actions.json")
    collector = _monitor(cfg, out, monitor=monitor, port=monitor_port, linger_s=monitor_linger_s, url=monitor_url,
                         token=token)
    _run_and_report(cfg, injections, out, collector, shot)
    _after_run(cfg, collector, monitor_linger_s)


def _run_and_report(cfg: JobConfig, injections: list[Injection], out: Path, collector: Any, shot: bool) -> None:
    """Run the demo job (``cfg``, with ``injections``), analyze its trace and write and name the
    reports; the local collector (``collector``, when there is one) is stopped if the run fails."""
    from laggard.demo.run import DemoOutput, analyze_and_report, pre_action, run_traced_job, summary_lines
    from laggard.errors import LaggardError
    from laggard.optable.tracedir import JOB_FILE
    from laggard.report.terminal import print_summary

    typer.echo(
        f"training the demo GPT: dp={cfg.dp} x pp={cfg.pp} = {cfg.world_size} processes (gloo, CPU), "
        f"{cfg.steps} steps of {cfg.microbatches} microbatches"
        + (f"; injected: {', '.join(i.spec() for i in injections)}" if injections else "")
    )
    try:
        job = _run_with_progress(cfg, run_traced_job)
    except BaseException:
        if collector is not None:
            collector.stop()
        raise
    for rank, why in sorted(job.failures.items()):
        typer.echo(f"laggard: warning: demo job rank {rank}: {why}", err=True)
    if not (Path(cfg.trace_dir or "") / JOB_FILE).exists():
        raise LaggardError("the demo job wrote no trace" + (" (it failed)" if job.failures else ""))
    result, paths, _ = analyze_and_report(Path(cfg.trace_dir or ""), out)
    print_summary(result)
    pre = pre_action(Path(cfg.trace_dir or ""), job, cfg)
    for line in summary_lines(DemoOutput(analysis=result, paths=paths, job=job, config=cfg, pre_action=pre)):
        typer.echo(line)
    typer.echo(f"trace: {cfg.trace_dir}")
    if cfg.act:
        typer.echo(f"actions: {cfg.actions_path}")
    for kind, p in paths.items():
        typer.echo(f"wrote {kind}: {p}")
    _report_lines(paths["html"], shot)


def _report_trace(trace: Path, out: Path, shot: bool) -> None:
    """``--trace``: analyze an existing trace and write the demo's reports, nothing run."""
    from laggard.demo.run import analyze_and_report
    from laggard.report.terminal import print_summary

    result, paths, _ = analyze_and_report(trace, out)
    print_summary(result)
    for kind, p in paths.items():
        typer.echo(f"wrote {kind}: {p}")
    _report_lines(paths["html"], shot)


def _after_run(cfg, collector, linger_s: float | None) -> None:  # noqa: ANN001 - thin CLI glue
    """The collector after the job: it must hold the job's ops (else one line, exit 2); a local one
    lingers for the dashboard, a running one's dashboard address is printed."""
    from laggard.errors import LaggardError
    from laggard.monitor.local import dashboard_url, job_arrived

    if not cfg.monitor_url:
        return
    why = job_arrived(cfg.monitor_url, cfg.monitor_token, cfg.monitor_job or "")
    if why:
        if collector is not None:
            collector.stop()
        raise LaggardError(why)
    if collector is not None:
        _linger(collector, linger_s)
    else:
        typer.echo(f"live dashboard: {dashboard_url(cfg.monitor_url, cfg.monitor_token)}  (job {cfg.monitor_job})")


def _monitor(cfg, out: Path, *, monitor: bool, port: int | None, linger_s: float | None, url: str | None,  # noqa: ANN001
             token: str | None):  # noqa: ANN202 - thin CLI glue
    """Where the job streams to (``cfg.monitor_*``): a local collector started here (returned, to stop),
    or the one at ``url`` once it takes the token (None); nothing without --monitor/--monitor-url."""
    import os
    import time

    from laggard.errors import LaggardError
    from laggard.monitor.local import dashboard_url, probe_collector, start_local_collector

    if url is None:
        if token is not None:
            raise LaggardError("--token is the token of --monitor-url's collector; "
                               "a local one (--monitor) makes its own")
        if not monitor:
            if port is not None or linger_s is not None:
                raise LaggardError("--monitor-port and --monitor-linger-s apply with --monitor")
            return None
    elif port is not None or linger_s is not None:
        raise LaggardError("--monitor-port and --monitor-linger-s apply to a local collector, not to --monitor-url")
    cfg.monitor_job = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    if url is None:
        collector = start_local_collector(out / "monitor.db", port or 8765, log=out / "monitor.log")
        cfg.monitor_url, cfg.monitor_token = collector.url, collector.token
        typer.echo(f"live dashboard: {collector.dashboard}")
        return collector
    token = token or os.environ.get("LAGGARD_TOKEN") or None
    why = probe_collector(url, token)
    if why:
        raise LaggardError(f"--monitor-url: {why}")
    cfg.monitor_url, cfg.monitor_token = url.rstrip("/"), token
    typer.echo(f"live dashboard: {dashboard_url(cfg.monitor_url, token)}  (job {cfg.monitor_job})")
    return None


def _report_lines(html: Path, shot: bool) -> None:
    """The last lines of the demo: the report to open and, where Chromium is, its screenshot."""
    typer.echo(f"report: {html.resolve()}  (open it in a browser)")
    if not shot:
        return
    from laggard.demo.run import report_screenshot

    png, why = report_screenshot(html)
    typer.echo(f"screenshot of the report: {png.resolve()}" if png is not None else f"no screenshot: {why}")


def _linger(collector, linger_s: float | None) -> None:  # noqa: ANN001 - thin CLI glue
    import time

    typer.echo(f"live dashboard: {collector.dashboard}  (job {collector.url}/api/v1/jobs)")
    try:
        if linger_s is None:
            typer.echo("the collector keeps running; Ctrl-C to stop it")
            while collector.proc.poll() is None:
                time.sleep(0.5)
        else:
            time.sleep(max(linger_s, 0.0))
    except KeyboardInterrupt:
        pass
    finally:
        collector.stop()


def _run_with_progress(cfg, run):  # noqa: ANN001, ANN202 - thin CLI glue
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("starting ranks", total=cfg.steps)

        def progress(done: int, total: int, loss: float | None) -> None:
            bar.update(task, completed=done, description=f"training (loss {loss:.3f})" if loss else "training")

        return run(cfg, on_progress=progress)


def register(app: typer.Typer) -> None:
    from laggard.cli.options import INJECT_EPILOG

    app.command("demo", epilog=INJECT_EPILOG)(demo)
