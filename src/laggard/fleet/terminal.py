"""The fleet summary in the terminal (rich)."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from laggard.fleet.runner import FleetRun
from laggard.fleet.stats import FleetStats

TOP_SHOWN = 5


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def print_fleet_summary(run: FleetRun, s: FleetStats, html: str | None, console: Console | None = None) -> None:
    con = console or Console(highlight=False)
    rate = run.num_analysed / run.wall_s if run.wall_s > 0 else 0.0
    con.print(f"[bold]laggard fleet[/]  {s.num_jobs:,} jobs: {s.by_status.get('ok', 0):,} analysed, "
              f"{s.by_status.get('rejected', 0):,} rejected, {s.by_status.get('error', 0):,} failed"
              + (f"  ({run.num_skipped:,} done earlier, skipped)" if run.num_skipped else "")
              + f"  ({run.engine}, {run.workers} workers, {rate:.1f} jobs/s)")
    if len(s.slowdown):
        con.print(f"jobs with S >= {s.straggling_slowdown:g}: [bold]{_pct(s.straggling_share)}[/]   median S "
                  f"{float(np.median(s.slowdown)):.3f}, p90 {float(np.quantile(s.slowdown, 0.9)):.3f}   "
                  f"GPU-hours wasted {s.gpu_hours_wasted:,.3g} of {s.gpu_hours:,.3g}")
        kinds = ", ".join(f"{k} {v:,.3g}" for k, v in s.wasted_by_kind.items() if v > 0)
        corr = "n/a" if s.spearman_size is None else f"{s.spearman_size:+.2f}"
        con.print(f"wasted by op kind: {kinds or 'none'}   slowdown vs size: rank correlation {corr}")
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
    for reason, n in list(s.failure_reasons.items())[:8]:
        con.print(f"[yellow]{n:,} job(s)[/] {reason}")
    con.print(f"rows: {run.parquet}" + (f"   report: {html}" if html else ""))
