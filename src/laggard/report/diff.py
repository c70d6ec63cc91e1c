"""``laggard diff``'s outputs: the terminal summary and a one-file HTML page of a ``DiffResult``
(the JSON is its ``to_json``, written by ``laggard.report.jsonout``)."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from laggard.errors import LaggardError
from laggard.report.page import CSS, finite, pct, rich_text, secs, section
from laggard.results.diff import NOT_FROM_DURATIONS

if TYPE_CHECKING:
    from laggard.results.diff import Contribution, DiffResult, RunSummary

HIDE_BELOW = 0.0005  # the terminal and the page leave out unnamed parts smaller than this share (they print as 0.0%)
NOT_COMPARED_SHOWN = 8  # op types one run lacks, listed by their ops (most first); the rest counted


def headline(res: DiffResult) -> str:
    """'B is 12.0% slower than A: 9.1% from backward-compute on stage 3, 2.9% from ...', the part not
    from durations where it is large, and a warning when the two jobs' layouts differ."""
    text = _change_line(res)
    if res.layout_warning:
        text += f". Warning: {res.layout_warning}"
    return text


def _change_line(res: DiffResult) -> str:
    if not finite(res.change):
        return "B's step time cannot be compared with A's (A's replayed step time is 0)"
    if res.change == 0:
        return "B's step time is the same as A's"
    word = "slower" if res.change > 0 else "faster"
    shown = [c for c in res.contributions if c.selector is not None and finite(c.share) and c.share > 0][:3]
    rest = res.structure if res.structure_large else None
    if rest is not None and finite(rest.share) and rest.share > 0:
        shown = sorted([*shown, rest], key=lambda c: -c.share)
    parts = [f"{pct(abs(res.change) * c.share)} " + (NOT_FROM_DURATIONS if c is rest else f"from {c.what}")
             for c in shown]
    text = f"B is {pct(abs(res.change))} {word} than A"
    if parts:
        text += ": " + ", ".join(parts)
    if rest is not None and finite(rest.share) and rest.share < 0:
        text += f"; {pct(abs(res.change * rest.share))} the other way, {NOT_FROM_DURATIONS}"
    if res.within_noise:
        text += " (within run-to-run noise: read the shares with care)"
    return text


def _sides(res: DiffResult) -> list[tuple[str, str]]:
    rows = []
    for side, s in (("A", res.a), ("B", res.b)):
        lay = (f"dp {s.layout.get('dp')} x pp {s.layout.get('pp')}"
               + (f" x tp {s.layout['tp']}" if s.layout.get("tp", 1) > 1 else ""))
        rows.append((side, f"{_label(s)} ({s.source}): {lay}, {s.num_ranks} ranks, {s.num_steps} steps, "
                           f"{s.num_ops:,} traced ops; step {secs(s.T_s)} replayed, {secs(s.measured_step_s)} traced"))
    return rows


def print_diff(res: DiffResult, console: Console | None = None, *, commands: int = 3) -> None:
    """The terminal summary (fits 80 columns): both runs, the headline, the contributions, and the
    `laggard whatif` commands of the first ``commands`` contributions that have one."""
    con = console or Console(highlight=False)
    for side, text in _sides(res):
        con.print(f"[bold]{side}[/] {escape_rich(text)}")
    con.print(f"[bold]{escape_rich(headline(res))}[/]")
    if res.contributions:
        table = Table(show_header=True, header_style="bold", box=None, padding=(0, 1))
        table.add_column("share", justify="right", no_wrap=True)
        table.add_column("of step", justify="right", no_wrap=True)
        table.add_column("alone", justify="right", no_wrap=True)
        table.add_column("ops' time", justify="right", no_wrap=True)
        table.add_column("what (selector)", overflow="fold")
        for c in res.contributions:
            if c.selector is None and finite(c.share) and abs(c.share) < HIDE_BELOW:
                continue  # a rest of float noise (the JSON keeps it: the shares add up to 1 there)
            table.add_row(pct(c.share), _signed(res, c), pct(c.alone) if finite(c.alone) else "", _change(c),
                          escape_rich(c.what + (f"  ({c.selector})" if c.selector else "")))
        con.print(table)
    for c in [c for c in res.contributions if c.command][:commands]:
        con.print(f"replay {escape_rich(c.what)} alone:", style="dim")
        con.print(escape_rich(c.command or ""), soft_wrap=True)
    for line in res.notes:
        con.print(f"note: {escape_rich(line)}", style="yellow")
    if res.not_compared:
        shown = res.not_compared[:NOT_COMPARED_SHOWN]
        more = len(res.not_compared) - len(shown)
        tail = f"; and {more} more (--json lists every one)" if more else ""
        con.print("not compared: " + escape_rich("; ".join(shown)) + tail, style="yellow")


def _change(c: Contribution) -> str:
    """How much longer (+) or shorter (-) the part's ops take in B than at A's level."""
    x = c.duration_change
    return ("+" if finite(x) and x > 0 else "") + pct(x) if finite(x) else ""


def _signed(res: DiffResult, c: Contribution) -> str:
    x = res.change * c.share if finite(res.change) else float("nan")
    return ("+" if finite(x) and x > 0 else "") + pct(x)


def escape_rich(text: str) -> str:
    from rich.markup import escape as esc

    return esc(text)


def _label(s: RunSummary) -> str:
    """A run's short name: its path when it was read from one (two runs of one job share a name)."""
    return s.paths[0] if len(s.paths) == 1 else s.name


def render_diff_html(res: DiffResult) -> str:
    """The page: both runs, the headline, a bar per contribution, notes and what was not compared."""
    rows = []
    scale = max((abs(c.share) for c in res.contributions if finite(c.share)), default=1.0) or 1.0
    for c in res.contributions:
        if c.selector is None and finite(c.share) and abs(c.share) < HIDE_BELOW:
            continue
        width = 100 * abs(c.share) / scale if finite(c.share) else 0
        colour = "#c0392b" if (c.share or 0) * (res.change or 0) > 0 else "#2e86c1"
        sel = f"<code>{escape(c.selector)}</code>" if c.selector else "<em>no selector</em>"
        cmd = f"<details><summary>what-if</summary><code>{escape(c.command)}</code></details>" if c.command else ""
        rows.append(
            f"<tr><td>{escape(c.what)}<br>{sel}{cmd}</td><td class='num'>{pct(c.share)}</td>"
            f"<td class='num'>{_signed(res, c)}</td><td class='num'>{pct(c.alone) if finite(c.alone) else ''}</td>"
            f"<td class='num'>{_change(c)}</td>"
            "<td style='min-width:160px'>"
            f"<div style='background:{colour};height:12px;width:{width:.1f}%'></div></td></tr>")
    table = ("<table class='data'><thead><tr><th>part of the job</th><th>share of the change</th><th>of B's step</th>"
             "<th>alone</th><th>ops' time</th><th></th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    sides = "<ul>" + "".join(f"<li><strong>{s}</strong> {escape(t)}</li>" for s, t in _sides(res)) + "</ul>"
    body = [
        f"<header><h1>laggard diff: {escape(_label(res.a))} vs {escape(_label(res.b))}</h1>{sides}</header>",
        section("What changed", f"<p class='lead'><strong>{escape(headline(res))}</strong></p>" + table,
                id="contributions",
                howto=["Each part's **share** is its Shapley value: B replayed with A's durations for every set of "
                       "parts, averaged over the orders they could be fixed in; the shares add up to 100%.",
                       "**alone**: what putting only this part at A's level removes from B's change.",
                       "**of B's step**: the share times the change, as a change of the step time.",
                       "**ops' time**: how much longer (+) the part's ops take in B than in A. A part whose ops "
                       "changed a lot may move the step little (other ranks had slack), and one rank can carry a "
                       "stage's change.",
                       "A part with no selector is everything else, or what B's structure changes (not durations)."]),
    ]
    extra = [rich_text(n) for n in res.notes] + [f"not compared: {escape(n)}"
                                                 for n in res.not_compared[:NOT_COMPARED_SHOWN]]
    if len(res.not_compared) > NOT_COMPARED_SHOWN:
        extra.append(f"and {len(res.not_compared) - NOT_COMPARED_SHOWN} more op types not compared "
                     "(<code>laggard diff --json</code> lists every one)")
    if extra:
        body.append(section("What could not be compared", "<ul>" + "".join(f"<li>{e}</li>" for e in extra) + "</ul>",
                            id="notes"))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            '<meta name="generator" content="laggard">\n'
            f"<title>laggard diff: {escape(_label(res.a))} vs {escape(_label(res.b))}</title>\n<style>{CSS}</style>\n"
            "</head>\n<body>\n<main>\n" + "\n".join(body) + "\n</main>\n</body>\n</html>\n")


def write_diff_html(res: DiffResult, path: str | Path) -> Path:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(render_diff_html(res), encoding="utf-8")
    except OSError as e:
        raise LaggardError(f"{p}: cannot write the HTML report ({e.strerror or e})") from None
    return p


__all__ = ["headline", "print_diff", "render_diff_html", "write_diff_html"]
