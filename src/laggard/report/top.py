"""``laggard top``'s frame and final summary: rich renderables of a ``laggard.results.top.TopState``
(the command prints them; nothing here prints)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from laggard.report.bands import band
from laggard.report.wording import finding_text

if TYPE_CHECKING:
    from rich.console import RenderableType

    from laggard.results.top import RankRow, TopState

_BAND_STYLE = {"bad": "bold red", "warn": "yellow", "good": "green"}
_BARS = "▁▂▃▄▅▆▇█"
# a rank this much over its peers is coloured as the worst (and a straggler candidate): 5%, the
# default healthy threshold's excess (laggard.diagnose.config)
_EXCESS_WARN = 0.05
_EXCESS_BAD = 0.20  # as the bad band of S (laggard.report.bands)
# the recent steps drawn per rank: the table fits 80 columns with 16
SPARK_STEPS = 16


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def _excess_style(x: float | None) -> str:
    if x is None:
        return ""
    return "bold red" if x >= _EXCESS_BAD else "yellow" if x >= _EXCESS_WARN else ""


def sparkline(values: list[float], top: float) -> str:
    """One bar per value, scaled 0..``top`` (every rank on the same scale, so a slow rank stands
    taller); a step without a value is a blank."""
    if not top > 0:
        return ""
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append(" ")
        else:
            out.append(_BARS[min(len(_BARS) - 1, max(0, int(v / top * len(_BARS) - 1e-9)))])
    return "".join(out)


def worst_line(state: TopState) -> str:
    """"rank 2: 112 ms/step of own work, +31% over the median of the others (85.4 ms)"; "" without one."""
    w = state.worst
    if w is None:
        return ""
    peers = "the median of the others" if w.num_peers != 1 else "the other rank"
    return f"rank {w.rank}: {_ms(w.busy_ms)} ms/step of own work, {_pct(w.excess)} over {peers} ({_ms(w.peers_ms)} ms)"


def finding_lines(state: TopState, *, full: bool = True) -> list[str]:
    """The window analysis' first finding in words (what, share and gain; evidence and fix when ``full``)."""
    if state.finding is None:
        if state.error:
            return [f"analysis: {state.error}"]
        if state.verdict:
            return [f"no finding (verdict: {state.verdict})"]
        return []
    t = finding_text(state.finding)
    more = f" (+{state.num_findings - 1} more)" if state.num_findings > 1 else ""
    out = [f"finding{more}: {t.what}{t.qualifier}: {t.share}; {t.gain}"]
    if full:
        out += [f"  evidence: {t.evidence}"] + ([f"  fix: {t.fix}"] if t.fix else [])
    return out


def _header(state: TopState) -> Text:
    head = Text()
    head.append("laggard top ", style="bold")
    head.append(f"{state.name}  ", style="bold")
    head.append(state.source, style="dim")
    bits = [{"waiting": "waiting", "running": "running", "ended": "ended"}.get(state.phase, state.phase)]
    if state.last_step is not None:
        bits.append(f"step {state.last_step}")
    if state.expected_ranks:
        bits.append(f"{state.num_ranks}/{state.expected_ranks} ranks")
    if state.window is not None:
        bits.append(f"window steps {state.window[0]}-{state.window[1]} ({state.num_steps})")
    head.append("\n" + " · ".join(bits))
    return head


def _job_line(state: TopState) -> Text:
    line = Text()
    if state.step_ms is not None:
        line.append(f"step time {_ms(state.step_ms)} ms")
    if state.slowdown is not None:
        line.append("  ·  " if line else "")
        waste = 1 - 1 / state.slowdown if state.slowdown > 0 else 0.0
        line.append(f"S = {state.slowdown:.3f} (waste {100 * waste:.0f}%)", style=_BAND_STYLE[band(state.slowdown)])
    if state.verdict:
        line.append("  ·  " if line else "")
        line.append(f"verdict: {state.verdict}")
    return line


def _rows_shown(state: TopState, max_rows: int) -> list[RankRow]:
    """Every rank in order, or, beyond ``max_rows``, the ones furthest over their peers."""
    if len(state.ranks) <= max_rows:
        return state.ranks
    key = {r.rank: -(r.excess if r.excess is not None else -math.inf) for r in state.ranks}
    keep = sorted(state.ranks, key=lambda r: (key[r.rank], r.rank))[:max_rows]
    return sorted(keep, key=lambda r: r.rank)


def _table(state: TopState, max_rows: int) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold")
    for name, just in (("rank", "right"), ("dp/pp", "right"), ("status", "left"), ("step", "right"),
                       ("step ms", "right"), ("work ms", "right"), ("excess", "right"), ("S_w", "right"),
                       ("recent work", "left")):
        t.add_column(name, justify=just, no_wrap=True)
    rows = _rows_shown(state, max_rows)
    # the busiest rank's median at 3/4 of the full bar: a one-off stall clips at the top instead of
    # flattening every other step
    top = max((r.busy_ms for r in state.ranks if r.busy_ms is not None), default=0.0) * 4 / 3
    worst = state.worst.rank if state.worst is not None else None
    for r in rows:
        coords = f"{r.dp_rank}/{r.stage}" if r.dp_rank is not None and r.stage is not None else "-"
        style = _excess_style(r.excess) if r.rank == worst else ""
        t.add_row(str(r.rank), coords, r.status or "-", "-" if r.last_step is None else str(r.last_step),
                  _ms(r.step_ms), _ms(r.busy_ms), Text(_pct(r.excess), style=_excess_style(r.excess)),
                  "-" if r.slowdown is None else f"{r.slowdown:.3f}", sparkline(r.recent_ms[-SPARK_STEPS:], top),
                  style=style)
    return t


def top_frame(state: TopState, *, max_rows: int = 32) -> RenderableType:
    """One frame: the job, its worst rank now, the window analysis' first finding and every rank's
    step times (at most ``max_rows`` ranks: those furthest over their peers)."""
    parts: list[RenderableType] = [_header(state)]
    if state.phase == "waiting" or (state.window is None and not state.ranks):
        started = sum(1 for r in state.ranks if r.last_step is not None)
        waiting = "waiting for the first steps"
        if state.expected_ranks:
            waiting += f" ({started} of {state.expected_ranks} ranks have written ops)"
        parts.append(Text(waiting, style="yellow"))
    job = _job_line(state)
    if job:
        parts.append(job)
    line = worst_line(state)
    if line:
        parts.append(Text("worst: " + line, style=_excess_style(state.worst.excess if state.worst else None)))
    for f in finding_lines(state):
        parts.append(Text(f))
    if state.ranks:
        parts.append(Text(""))
        parts.append(_table(state, max_rows))
        if len(state.ranks) > max_rows:
            parts.append(Text(f"... {len(state.ranks) - max_rows} more ranks (the ones closest to their peers)",
                              style="dim"))
    for n in state.notes:
        parts.append(Text(f"note: {n}", style="dim"))
    if state.phase == "ended":
        parts.append(Text(f"job ended: {state.ended_why}", style="bold"))
    return Group(*parts)


def top_summary(state: TopState) -> RenderableType:
    """The lines printed when top stops: why, what it saw last, the worst rank and the finding."""
    why = state.ended_why or "stopped"
    lines = [Text(f"laggard top: {state.name}: {why}", style="bold")]
    if state.window is None:
        lines.append(Text("no complete step was seen" if state.phase != "waiting" or state.ended_why
                          else "waiting for the first steps"))
    else:
        seen = f"last window: steps {state.window[0]}-{state.window[1]} ({state.num_steps} steps)"
        if state.step_ms is not None:
            seen += f", step time {_ms(state.step_ms)} ms"
        if state.slowdown is not None:
            seen += f", S = {state.slowdown:.3f}"
        lines.append(Text(seen))
    line = worst_line(state)
    if line:
        lines.append(Text("worst: " + line))
    lines += [Text(f) for f in finding_lines(state, full=False)]
    return Group(*lines)


__all__ = ["finding_lines", "sparkline", "top_frame", "top_summary", "worst_line"]
