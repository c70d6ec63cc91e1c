"""The fleet summary in the terminal (rich)."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from laggard.fleet.goodput import FleetGoodput
from laggard.fleet.hosts import HostsView
from laggard.fleet.runner import FleetRun
from laggard.fleet.stats import FleetStats

TOP_SHOWN = 5


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def run_line(run: FleetRun) -> str:
    """What this run did: its own jobs by status, the jobs an earlier run had done, where and how fast."""
    c = run.status_counts
    n = run.num_analyzed
    done = (f"{n:,} job{'s' if n != 1 else ''} analyzed in this run: {c.get('ok', 0):,} ok, "
            f"{c.get('rejected', 0):,} rejected, {c.get('error', 0):,} failed") if n else "no job left to analyze"
    earlier = f"; {run.num_skipped:,} done by an earlier run, skipped" if run.num_skipped else ""
    if not n:
        return done + earlier
    where = "in this process" if run.engine == "inline" else \
        f"{run.engine}, {run.workers} worker{'s' if run.workers != 1 else ''}"
    rate = n / run.wall_s if run.wall_s > 0 else 0.0
    return f"{done}{earlier}  ({where}, {rate:.1f} jobs/s)"


def print_fleet_summary(run: FleetRun, s: FleetStats, html: str | None, console: Console | None = None,
                        hosts: HostsView | None = None, goodput: FleetGoodput | None = None) -> None:
    con = console or Console(highlight=False)
    con.print(f"[bold]laggard fleet[/]  {run_line(run)}")
    if run.num_skipped:  # the figures below are the whole fleet's, earlier runs' rows included
        con.print(f"the fleet in {run.parquet.parent}: {s.num_jobs:,} jobs, {s.by_status.get('ok', 0):,} analyzed, "
                  f"{s.by_status.get('rejected', 0):,} rejected, {s.by_status.get('error', 0):,} failed")
    if len(s.slowdown):
        con.print(f"jobs with S >= {s.straggling_slowdown:g}: [bold]{_pct(s.straggling_share)}[/]   median S "
                  f"{float(np.median(s.slowdown)):.3f}, p90 {float(np.quantile(s.slowdown, 0.9)):.3f}   "
                  f"GPU-hours wasted {s.gpu_hours_wasted:,.3g} of {s.gpu_hours:,.3g}")
        kinds = ", ".join(f"{k} {v:,.3g}" for k, v in s.wasted_by_kind.items() if v > 0)
        corr = "n/a" if s.spearman_size is None else f"{s.spearman_size:+.2f}"
        con.print(f"wasted by op kind: {kinds or 'none'}   slowdown vs size: rank correlation {corr}")
    if goodput is not None and goodput.num_jobs:
        con.print(f"goodput [bold]{_pct(goodput.goodput)}[/]: {goodput.productive:,.3g} of {goodput.gpu_hours:,.3g} "
                  f"GPU-hours productive, {goodput.stragglers:,.3g} lost to stragglers, {goodput.hangs:,.3g} to hangs "
                  f"({goodput.num_hung_jobs} hung job(s))")
    if s.wasted_by_cause:
        t = Table(title="GPU-hours wasted by cause", title_justify="left", show_edge=False)
        t.add_column("cause")
        t.add_column("GPU-hours", justify="right")
        t.add_column("jobs (top finding)", justify="right")
        for c, v in s.wasted_by_cause.items():
            t.add_row(c, f"{v:,.3g}", str(s.top_cause_counts.get(c, "")))
        con.print(t)
    if s.top_jobs:
        t = Table(title=f"worst {min(TOP_SHOWN, len(s.top_jobs))} jobs by GPU-hours wasted", title_justify="left",
                  show_edge=False)
        for col in ("job", "S", "GPUs", "GPU-h wasted", "top finding"):
            t.add_column(col, overflow="fold")
        for j in s.top_jobs[:TOP_SHOWN]:
            f = j["findings"][0] if j["findings"] else None
            t.add_row(j["job"], f"{j['slowdown']:.3f}", str(j["num_gpus"]), f"{j['gpu_hours_wasted']:,.3g}",
                      f"{f['cause']} ({_pct(f['score'])})" if f else "-")
        con.print(t)
    if hosts is not None and any(h.num_named for h in hosts.hosts):
        _print_hosts(con, hosts)
    for reason, n in list(s.failure_reasons.items())[:8]:
        con.print(f"[yellow]{n:,} job(s)[/] {reason}")
    con.print(f"rows: {run.parquet}" + (f"   report: {html}" if html else ""))


def _print_hosts(con: Console, view: HostsView) -> None:
    named = [h for h in view.hosts if h.num_named][:TOP_SHOWN]
    t = Table(title=f"hosts named most ({len(named)} of {len(view.hosts)}; all in hosts.parquet)", title_justify="left",
              show_edge=False)
    for col in ("host", "verdict", "named in", "GPU-h cost"):
        t.add_column(col, overflow="fold")
    for h in named:
        t.add_row(h.host, h.verdict, f"{h.num_named} of {h.num_jobs} jobs", f"{h.gpu_hours_cost:,.3g}")
    con.print(t)
