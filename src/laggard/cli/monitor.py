"""``laggard monitor serve|relay|push``: the collector service, a node's relay, and replaying a trace
into a collector. Light at import."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

# Replaying a trace 1000x slower than it ran already turns a 1 s step into 17 minutes; slower is a
# typo (and 1e-300 overflows the sleep).
MIN_SPEED = 1e-3

app = typer.Typer(help="Live monitor: a collector service with a dashboard, alerts and Prometheus metrics.",
                  no_args_is_help=True)

# HTTPS where a server listens beyond loopback (laggard.monitor.tls): tokens travel in every request
TlsCert = Annotated[Path | None, typer.Option("--tls-cert", help=(
    "PEM certificate (chain) to serve HTTPS with, with --tls-key. Needed (or --insecure) when --host is not a "
    "loopback address. Clients trust a private CA or a self-signed certificate with SSL_CERT_FILE=ca.pem."))]
TlsKey = Annotated[Path | None, typer.Option("--tls-key", help="The certificate's private key (PEM, unencrypted).")]
Insecure = Annotated[bool, typer.Option("--insecure", help=(
    "Serve plain HTTP on a non-loopback --host anyway (tokens and data in clear): only behind a TLS-terminating "
    "proxy or on a network you trust."))]


def _need_extra() -> None:
    from laggard.errors import LaggardError

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise LaggardError(f"the monitor needs {e.name}: pip install 'laggard[monitor]'") from None


SERVE_HELP = (
    "Run the collector: ingest API, sliding-window analysis, alerts, /metrics and the dashboard at /.\n\n"
    "The dashboard opens on a sign-in page: type the token there once (a session cookie, HttpOnly and "
    "SameSite=Strict, keeps you signed in for 12 hours; Sign out ends it). A token in a URL (?token=) is refused. "
    "API clients and Prometheus send 'Authorization: Bearer TOKEN'. This token is admin; "
    "'laggard monitor token create --role ingest|read|admin' makes narrower ones.\n\n"
    "Beyond loopback, serve HTTPS (--tls-cert/--tls-key) or say --insecure. Several collectors may start at once "
    "on one PostgreSQL database; a database made by a newer laggard is refused.")


@app.command(help=SERVE_HELP)
def serve(
    db: Annotated[str, typer.Option("--db", help=(
        "SQLite file, or a postgresql://user@host/db URL."))] = "laggard-monitor.db",
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8765,
    token: Annotated[str | None, typer.Option("--token", help=(
        "Bearer token (default: LAGGARD_TOKEN, else the stored one, else a new one printed once)."))] = None,
    window_steps: Annotated[int, typer.Option("--window-steps", help=(
        "Steps per analysis window (re-analyzed every window/2 steps)."))] = 6,
    webhook: Annotated[list[str] | None, typer.Option("--webhook", help=(
        "POST each alert as JSON to this URL (repeatable)."))] = None,
    metrics_top_k: Annotated[int, typer.Option("--metrics-top-k", help=(
        "Export laggard_worker_slowdown for this many workers per job."))] = 10,
    hang_after_s: Annotated[float, typer.Option("--hang-after-s", help=(
        "No rank of a job recording an op for this long (or one "
        "rank's heartbeats stopping) is a suspected hang."))] = 30.0,
    hang_collect_s: Annotated[float, typer.Option("--hang-collect-s", help=(
        "After asking a job's ranks for their hang reports, decide the verdict after "
        "this long at most (ranks that sent nothing count as missing)."))] = 10.0,
    max_report_bytes: Annotated[int, typer.Option("--max-report-bytes", help=(
        "Largest hang report (a rank's Flight Recorder dump) accepted."))] = 16 * 2**20,
    hang_reports_per_job: Annotated[int, typer.Option("--hang-reports-per-job", help=(
        "Hang reports held per job for a verdict (the oldest dropped first; said in the verdict's warnings)."))] = 4096,
    hang_report_bytes_per_job: Annotated[int, typer.Option("--hang-report-bytes-per-job", help=(
        "... and their bytes per job (at least --max-report-bytes)."))] = 256 * 2**20,
    analysis_workers: Annotated[int, typer.Option("--analysis-workers", help=(
        "Processes analyzing windows (jobs side by side); about one per 2 jobs of 1,024 ranks at 1 step/s."))] = 2,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    insecure: Insecure = False,
) -> None:
    """Run the collector (the help is SERVE_HELP)."""
    _need_extra()
    import logging

    import uvicorn

    from laggard.monitor.app import create_app
    from laggard.monitor.config import MonitorConfig
    from laggard.monitor.serving import open_collector
    from laggard.monitor.shutdown import stop_on_sigterm
    from laggard.monitor.tls import server_tls

    tls = server_tls(host, tls_cert, tls_key, insecure)  # before anything: a refusal leaves nothing behind
    cfg = MonitorConfig(window_steps=window_steps, refresh_every_steps=max(1, window_steps // 2),
                        metrics_top_k=metrics_top_k, hang_after_s=hang_after_s, hang_collect_s=hang_collect_s,
                        max_report_bytes=max_report_bytes, hang_reports_per_job=hang_reports_per_job,
                        hang_report_bytes_per_job=hang_report_bytes_per_job, analysis_workers=analysis_workers)
    given = token or os.environ.get("LAGGARD_TOKEN") or None
    collector, sock, tok, created, base = open_collector(db, host, port, given, cfg, webhook or [], https=bool(tls))
    if created:
        typer.echo(f"token: {tok}")
    # no token in a printed address (it would end up in logs and shell history): one signs in on the page
    typer.echo(f"dashboard: {base}/ (sign in with the token)   (API: {base}/api/v1/, Authorization: Bearer TOKEN)",
               err=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with stop_on_sigterm():  # SIGTERM: the clean stop below, exit code 0
        try:
            collector.start()
            server = uvicorn.Server(uvicorn.Config(create_app(collector, tok), log_level="warning", access_log=False,
                                                   **tls))
            server.run(sockets=[sock])
        finally:
            collector.stop()
            sock.close()


@app.command()
def relay(
    url: Annotated[str, typer.Option("--url", help=(
        "The collector, e.g. http://collector:8765; several comma-separated (collectors on one database): "
        "the next is tried when one cannot be reached."))] = "http://127.0.0.1:8765",
    host: Annotated[str, typer.Option("--host", help=(
        "Address to bind (loopback: the node's own ranks)."))] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help=(
        "TCP port the node's tracers post to (their monitor URL)."))] = 8766,
    token: Annotated[str | None, typer.Option("--token", help=(
        "The collector's bearer token (default: LAGGARD_TOKEN); the relay asks it of its tracers too."))] = None,
    gather_ms: Annotated[float, typer.Option("--gather-ms", help=(
        "How long a bundle waits for more of the node's batches after its first."))] = 50.0,
    max_parts: Annotated[int, typer.Option("--max-parts", help="Batches per bundle at most.")] = 256,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    insecure: Insecure = False,
) -> None:
    """Run a node's relay: its ranks' tracers (or other relays) post to it; it sends their batches to the
    collector (or a relay above it) in bundles."""
    _need_extra()
    import logging

    import uvicorn

    from laggard.errors import LaggardError
    from laggard.monitor.relay import Relay, RelayConfig, relay_app
    from laggard.monitor.serving import listen
    from laggard.monitor.shutdown import stop_on_sigterm
    from laggard.monitor.tls import server_tls
    from laggard.wire.client import Client

    tls = server_tls(host, tls_cert, tls_key, insecure)
    tok = token or os.environ.get("LAGGARD_TOKEN")
    if not tok:
        raise LaggardError("relay: the collector's token is needed: --token or LAGGARD_TOKEN")
    cfg = RelayConfig(gather_s=gather_ms / 1000.0, max_parts=max_parts)
    Client(url, tok)  # checks --url
    sock = listen(host, port)
    typer.echo(f"relay: {'https' if tls else 'http'}://{host}:{port} -> {url}", err=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # SIGTERM as Ctrl-C: uvicorn finishes the requests in flight, then the sender sends what it holds
    with stop_on_sigterm():
        r = Relay(url, tok, cfg).start()
        try:
            server = uvicorn.Server(uvicorn.Config(relay_app(r), log_level="warning", access_log=False, **tls))
            server.run(sockets=[sock])
        finally:
            r.close()
            sock.close()


@app.command()
def push(
    trace: Annotated[Path, typer.Argument(help="Trace to stream (any format laggard reads).")],
    url: Annotated[str, typer.Option("--url", help=(
        "Collector address, e.g. http://127.0.0.1:8765; several comma-separated: the next is tried when one "
        "cannot be reached."))] = "http://127.0.0.1:8765",
    token: Annotated[str | None, typer.Option("--token", help="Bearer token (default: LAGGARD_TOKEN).")] = None,
    speed: Annotated[float, typer.Option("--speed", help=(
        "Replay speed: 1 = the trace's own step times, 10 = ten times faster, 0 = as fast as possible."))] = 1.0,
    job_id: Annotated[str | None, typer.Option("--job", help=(
        "Job id at the collector (default: the trace's job name)."))] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help=(
        "Trace format: auto, native, ndtimeline, kineto."))] = "auto",
) -> None:
    """Stream an existing trace into a collector as if the job were running now."""
    from laggard.errors import LaggardError
    from laggard.io import load_job
    from laggard.monitor.push import push_job
    from laggard.wire.batch import valid_job_id
    from laggard.wire.client import Client, CollectorDown

    if not (speed == 0 or MIN_SPEED <= speed < float("inf")):
        raise LaggardError(f"--speed must be 0 (as fast as possible) or a finite number >= {MIN_SPEED:g} (got {speed})")
    job = load_job(trace, fmt=fmt)
    jid = valid_job_id(job_id or job.meta.name)
    client = Client(url, token or os.environ.get("LAGGARD_TOKEN"))
    from laggard.cli.options import progress_callback

    try:
        with progress_callback(f"pushing {jid}", "steps") as on_step:
            res = push_job(job, client, job_id=jid, speed=speed, on_step=on_step)
    except CollectorDown as e:
        hint = ("; a private CA or self-signed certificate is trusted with SSL_CERT_FILE=ca.pem"
                if "CERTIFICATE_VERIFY_FAILED" in str(e) else "")
        raise LaggardError(f"cannot reach the collector at {url} ({e}){hint}") from None
    typer.echo(f"pushed {res.num_ops:,} ops in {res.num_batches} batches to job {jid} in {res.wall_s:.1f} s"
               + (f" ({res.num_duplicates} batches were already there)" if res.num_duplicates else ""))


def register(parent: typer.Typer) -> None:
    from laggard.cli import monitor_token

    monitor_token.register(app)
    parent.add_typer(app, name="monitor")
