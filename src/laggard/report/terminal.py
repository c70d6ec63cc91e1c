"""Terminal summaries with rich."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from laggard.optable.hosts import cpu_job
from laggard.optable.partial import MISSING_KEY
from laggard.report.bands import band

if TYPE_CHECKING:
    from laggard.optable.ops import JobMeta
    from laggard.results.analysis import Analysis
    from laggard.whatif.custom import WhatIfResult


def _s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _fixing(what: str, share: float | None, label: str) -> str:
    """'fixing X removes 12.0% of the slowdown (M_W)'; a negative share (the fixed ops were faster
    than ideal more than slower) says so instead of 'removes -2.4%'."""
    if share is None:
        return f"fixing {what}: {label} n/a"
    if share < 0:
        return (f"fixing {what} does not reduce the slowdown ({label} = {_pct(share)}: "
                "it is no slower than the average the ideal uses)")
    if share > 1.02:
        return (f"fixing {what} removes {_pct(share)} of the slowdown ({label}; over 100%: the rest of the job "
                "is faster than the ideal average, so this explains all of it)")
    return f"fixing {what} removes {_pct(share)} of the slowdown ({label})"


_HEAT = {"bad": "bold red", "warn": "yellow", "good": "green"}  # rich styles of the health bands


def _heat(s: float) -> str:
    return _HEAT[band(s)]


def print_layout(m: JobMeta, con: Console) -> None:
    """The lines under the headline: the ranks a partial trace lacks, and the layout where it was read
    off the trace (profiler traces, zero-code traces)."""
    absent = m.extra.get(MISSING_KEY)
    if isinstance(absent, dict) and absent.get("ranks"):  # a partial trace: said where it is read first
        few = ", ".join(map(str, absent["ranks"][:8])) + (" ..." if len(absent["ranks"]) > 8 else "")
        con.print(f"[yellow bold]partial:[/] {len(absent['ranks'])} of {absent['of']} ranks not analyzed (rank(s) "
                  f"{few}: no trace, or left out with their pipeline); the figures cover the others only")
    layout = m.extra.get("layout")
    if isinstance(layout, dict) and "how" in layout:  # profiler traces: the layout and where it comes from
        dims = ([f"dp {layout['dp']}", f"pp {layout['pp']}"]
                + ([f"tp {layout['tp']}"] if layout.get("tp", 1) > 1 else []))
        con.print(f"layout: {' x '.join(dims)} ({layout['how']})", markup=False)
    elif isinstance(m.extra.get("layout_inferred"), str):  # a zero-code trace's (laggard.io.native_layout)
        dims = [f"dp {m.dp_size}", f"pp {m.pp_size}"] + ([f"tp {m.tp_size}"] if m.tp_size > 1 else [])
        con.print(f"layout: {' x '.join(dims)} (inferred: {m.extra['layout_inferred']})", markup=False)


def print_summary(res: Analysis, console: Console | None = None, *, top: int = 6) -> None:
    con = console or Console(highlight=False)
    m = res.meta
    d = res.to_json()
    con.print(
        f"[bold]laggard[/] {m.name}  ({m.source})  dp={m.dp_size} pp={m.pp_size} tp={m.tp_size}"
        + (f" vpp={m.vpp_size}" if m.vpp_size > 1 else "")
        + f"  {res.num_workers} workers, {len(res.steps)} steps, {res.num_ops:,} ops"
    )
    print_layout(m, con)
    style = _heat(res.slowdown)
    line = (
        f"straggler slowdown S = [{style}]{res.slowdown:.3f}[/]   waste {_pct(res.waste)}"
        f"   step {res.T_s:.3f} s -> ideal {res.T_ideal_s:.3f} s"
    )
    if d["gpu_hours_wasted"] is not None:
        # a job that ran on CPUs spent rank-hours, not GPU-hours: the same figure, named for what it counts
        what, unit = ("rank-hours", "CPU ranks") if cpu_job(m.extra) else ("GPU-hours", "GPUs")
        line += f"   {what} wasted {d['gpu_hours_wasted']:.2f} of {d['gpu_hours']:.2f} ({m.num_gpus} {unit})"
    con.print(line)
    from laggard.report.findings import print_findings

    print_findings(res, con)
    fidelity = res.replay_fidelity
    note = "good" if abs(fidelity - 1) < 0.05 else ("untraced gaps (CPU launch delay, data loading?)" if fidelity > 1
                                                   else "the replay is slower than the job")
    con.print(f"replay fidelity {fidelity:.3f}: wall clock / steps replayed back to back ({note})")
    gaps = d.get("untraced_gaps") or {}
    if gaps.get("num_positions"):
        per = gaps["modelled_per_rank_s_per_step"]
        worst = max(per, key=per.get)
        con.print(f"untraced host time modelled as host ops at {gaps['num_positions']} position(s); "
                  f"most on rank {worst}: {1e3 * per[worst]:.1f} ms per step")
    n = len(res.fixed_workers)
    workers = f"worker (rank {res.fixed_workers[0]})" if n == 1 else f"{n} workers (ranks {res.fixed_workers})"
    con.print(f"{_fixing(f'the worst {workers}', d['M_W'], 'M_W')}; {_fixing('the last stage', d['M_S'], 'M_S')}")

    # two tables, one under the other, each with its own title: side by side, a row read as if its op
    # type belonged to the rank beside it
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    t.add_column("op type", overflow="ellipsis", no_wrap=True, max_width=40)
    t.add_column("S_t", justify="right", no_wrap=True)
    for name, s in sorted(res.by_optype.items(), key=lambda kv: -kv[1])[:top]:
        t.add_row(name, f"[{_heat(s)}]{s:.3f}[/]")
    w = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    tp = any("tp_rank" in row for row in res.by_worker)  # tensor parallel: a rank is also its TP slice's
    for c in ("rank", "dp", "stage", *(("tp",) if tp else ()), "S_w"):
        w.add_column(c, justify="right", no_wrap=True)
    for row in res.by_worker[:top]:
        w.add_row(str(row["rank"]), str(row["dp_rank"]), str(row["stage"]),
                  *((str(row.get("tp_rank", "")),) if tp else ()),
                  f"[{_heat(row['slowdown'])}]{row['slowdown']:.3f}[/]")
    con.print("op types by S_t (the job replayed with only this type measured):")
    con.print(t)
    con.print(f"worst workers by S_w = min(S_dp, S_stage{', S_tp' if tp else ''}):")
    con.print(w)
    stages = list(res.by_stage.items())
    shown_st = stages if len(stages) <= 8 else sorted(stages, key=lambda kv: -kv[1])[:8]
    con.print(
        "stages:   " + "  ".join(f"pp{k}=[{_heat(v)}]{v:.3f}[/]" for k, v in shown_st)
        + (f"  ... ({len(stages)} in all)" if len(stages) > len(shown_st) else "")
    )
    dps = list(res.by_dp_rank.items())
    shown = sorted(dps, key=lambda kv: -kv[1])[:8]
    con.print(
        "DP ranks: " + "  ".join(f"dp{k}=[{_heat(v)}]{v:.3f}[/]" for k, v in shown)
        + (f"  ... ({len(dps)} in all)" if len(dps) > len(shown) else "")
    )
    worst_step = max(res.per_step.items(), key=lambda kv: kv[1])
    con.print(f"steps: worst step {worst_step[0]} S={worst_step[1]:.3f}; best S={min(res.per_step.values()):.3f}")
    if res.extras.get("arrivals"):
        print_arrivals(res.extras, con, top=top)
    if res.warnings:
        con.print(f"[yellow]{len(res.warnings)} warning(s)[/] (printed on stderr once the command ends)")


def print_arrivals(extras: dict, console: Console | None = None, *, top: int = 6) -> None:
    """Arrival skew at collectives (Kineto traces): who arrives last and how late."""
    con = console or Console(highlight=False)
    arr = extras.get("arrivals") or {}
    n = extras.get("num_collectives", 0)
    t = Table(title=f"arrivals at {n} collective(s) (lag behind the first rank)", title_justify="left", show_edge=False)
    for c in ("rank", "last", "mean lag ms", "p99 lag ms", "clock offset ms"):
        t.add_column(c, justify="right")
    offs = extras.get("clock_offsets_s") or {}
    rows = sorted(arr.items(), key=lambda kv: (-kv[1]["last_count"], -kv[1]["mean_lag_s"]))
    for rank, a in rows[:top]:
        off = offs.get(rank)
        t.add_row(
            rank,
            f"{a['last_count']}/{a['num_collectives']}",
            f"{1e3 * a['mean_lag_s']:.3f}",
            f"{1e3 * a['p99_lag_s']:.3f}",
            "n/a" if off is None else f"{1e3 * off:.3f}",
        )
    con.print(t)
    groups = extras.get("arrivals_by_group") or {}
    if len(groups) > 1:
        for g, per in groups.items():
            worst = max(per.items(), key=lambda kv: (kv[1]["last_count"], kv[1]["mean_lag_s"]), default=None)
            if worst:
                con.print(f"  group {g}: rank {worst[0]} last at "
                          f"{worst[1]['last_count']}/{worst[1]['num_collectives']}")


def print_whatif(res: WhatIfResult, console: Console | None = None) -> None:
    con = console or Console(highlight=False)
    con.print("what-if: " + "; ".join(res.changes) + f"  ({res.num_ops_changed:,} ops changed)")
    con.print(
        f"step time {res.T_s:.4f} s -> [bold]{res.T_new_s:.4f} s[/]   speed-up [bold]{res.speedup:.3f}x[/]"
        f"   (fully idealised: {res.T_ideal_s:.4f} s, {res.T_s / res.T_ideal_s:.3f}x)"
    )
