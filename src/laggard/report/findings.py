"""Findings (root causes) for the terminal and the HTML report."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from rich.text import Text

from laggard.report.wording import finding_text

if TYPE_CHECKING:
    from rich.console import Console

    from laggard.results.analysis import Analysis
    from laggard.results.diagnosis import Diagnosis, Finding

PATTERN = {
    "worker": "one hot cell in the DP x PP heatmap",
    "data-loading": "one hot cell in the DP x PP heatmap, its excess in the waits for the next batch",
    "stage-imbalance": "one hot stage (a whole column) in the DP x PP heatmap",
    "sequence-imbalance": "hot cells scattered at random; forward and backward of a microbatch slow together",
    "gc": "rare forward-only stalls on different ranks at different steps",
    "comm": "slow transfers on one link or group",
    "launch-delay": "measured steps longer than the replay (untraced gaps)",
    "extra-work": "one rank running ops its peers do not (more of an op type than any peer in a step)",
    "unexplained": "no known cause's pattern: the largest carrier of the slowdown",
    "late-arrival": "one rank reaching the step's first collective after the others (too few steps to judge more)",
}
# the pattern of a cost every rank pays alike (``Finding.everywhere``): no link, rank or stage stands out
JOB_WIDE_PATTERN = {
    "comm": "the same slow tail on many links and ranks alike: no one link or group stands out",
    "launch-delay": "measured steps longer than the replay on every rank alike (untraced gaps)",
}
HEADINGS = {
    "straggler": "Diagnosis: why this job straggles",
    "no straggler": "Diagnosis: no straggler stands out",
}


def pattern(f: Finding) -> str:
    """The heatmap pattern a finding was read from: the job-wide one where it names no link, rank or
    stage (a tail every link shares is no slow link), else its cause's."""
    if f.everywhere:
        return JOB_WIDE_PATTERN.get(f.cause, PATTERN.get(f.cause, ""))
    return PATTERN.get(f.cause, "")


def names_straggler(f: Finding) -> bool:
    """Whether a finding points at a straggler: not a cost every rank pays alike, nor a low-confidence
    carrier that names no rank or stage (an op type no known cause's signature fits)."""
    return not f.everywhere and (f.confidence == "high" or f.localized)


def no_straggler(d: Diagnosis) -> bool:
    """A straggling verdict none of whose findings points at a straggler: the slowdown is spread over
    every rank alike (on a busy host, the jitter of op times against their averages)."""
    return d.verdict == "straggling" and not d.one_step and not d.reason and not any(map(names_straggler, d.findings))


def no_straggler_words(d: Diagnosis, slowdown: float) -> str:
    """Why a straggling job has no straggler to name, in one sentence."""
    return (f"S = {slowdown:.3f} is over the healthy threshold {d.threshold:g}, but no rank, stage or link is slow "
            "beyond the job's noise: what is named below is no straggler to drain (a cost every rank pays, op "
            "times jittering on a busy host, or one rank's few slow steps, too few to tell from that noise)")


def heading(d: Diagnosis) -> str:
    """The diagnosis section's heading: healthy, why the job straggles, that no straggler stands out,
    or the verdict that it could not be judged."""
    if d.verdict == "straggling":
        return HEADINGS["no straggler" if no_straggler(d) else "straggler"]
    return f"Diagnosis: {d.verdict}"


def command_lines(command: str, width: int = 80, indent: int = 4) -> list[str]:
    """A shell command broken into lines of at most ``width`` with ``\\`` continuations (bash joins
    them back): the program and the trace first, then each flag with its value on a line of its own
    (a single flag and value longer than the line stays whole)."""
    import shlex

    try:
        tokens = shlex.split(command)
    except ValueError:
        return [command]
    parts: list[str] = []  # the program and its positional arguments, then each flag with its values
    for t in tokens:
        if parts and not (t.startswith("-") and len(t) > 1):
            parts[-1] += " " + shlex.quote(t)
        else:
            parts.append(shlex.quote(t))
    lines: list[str] = []
    for p in parts:
        pad = " " * indent if lines else ""
        if lines and len(lines[-1]) + 1 + len(p) + 2 <= width:
            lines[-1] += " " + p
        else:
            lines.append(pad + p)
    return [ln + " \\" for ln in lines[:-1]] + lines[-1:]


def gain_cell(f: Finding) -> str:
    """The terminal's gain column: the gain shown, and the continuous bound labelled where it is one."""
    if f.gain_layers is not None:
        return f"{f.gain_layers:.2f}x\nfaster\n(bound\n{f.gain:.2f}x)"
    return f"{f.gain:.2f}x\nfaster" + ("\n(bound)" if f.gain_is_bound else "")


def gain_html(f: Finding) -> str:
    """The HTML report's "fix gives" cell."""
    if f.gain_layers is not None:
        return (f"{f.gain_layers:.2f}x<br><small>moving whole layers; "
                f"{f.gain:.2f}x is the bound of a continuous split</small>")
    return f"{f.gain:.2f}x" + ("<br><small>the bound of a continuous split</small>" if f.gain_is_bound else "")


def print_findings(res: Analysis, console: Console) -> None:
    """The verdict, a table of findings that fits the console, then each finding's command on lines of
    their own (continued with backslashes, so they stay runnable when copied)."""
    from rich.table import Table

    d = res.diagnosis
    if d is None:
        return
    if d.verdict == "healthy":
        console.print(f"[green bold]verdict: healthy[/] (slowdown below {d.threshold:g}); no findings")
        return
    if d.one_step:
        print_one_step(d, console)
        return
    if d.reason:
        console.print(f"[yellow bold]verdict: {d.verdict}[/] ({d.reason}); no findings", highlight=False)
        return
    if no_straggler(d):
        console.print("[yellow bold]verdict: straggling, but no straggler stands out[/]")
        console.print(no_straggler_words(d, res.slowdown), highlight=False)
    else:
        console.print("[red bold]verdict: straggling[/]")
    if d.note:
        console.print(f"[yellow]note:[/] {d.note}", highlight=False)
    t = Table(show_edge=False, pad_edge=False, expand=False, show_lines=True, highlight=False)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("finding: what, evidence, fix", overflow="fold", ratio=1)
    t.add_column("explains", justify="right", no_wrap=True)
    t.add_column("gain", justify="right", no_wrap=True)
    for i, f in enumerate(d.findings, 1):
        w = finding_text(f.to_json())
        text = Text()
        text.append(w.what, style="bold")
        text.append(w.qualifier)
        text.append(f"\nevidence: {w.evidence}")
        if w.consistency:
            text.append(f"\nconsistency: {w.consistency}")
        text.append(f"\nfix: {w.fix}")
        if w.beyond:
            text.append(f"\ngain beyond S: {w.beyond}")
        t.add_row(str(i), text, f"{100 * f.share:.0f}%\n({100 * f.score:.0f}% alone)", gain_cell(f))
    console.print(t)
    width = min(console.width, 120)
    for i, f in enumerate(d.findings, 1):
        checks = [(f"check {i} ({f.gain:.2f}x):", f.command)]
        if f.layers_plan is not None:  # the whole-layer gain's own command first, then the bound's
            checks = [(f"check {i} ({f.shown_gain:.2f}x, whole layers):", f.layers_plan["command"]),
                      (f"check {i}'s bound ({f.gain:.2f}x, a continuous split):", f.command)]
        for label, command in checks:
            if not command:
                continue
            console.print(label, highlight=False)
            for line in command_lines(command, width=width):
                console.print(Text(line), soft_wrap=True, highlight=False)
    if len(d.findings) > 1:
        beyond = ("; together they take the step below the all-ideal one S compares with"
                  if d.combined_share > 1.0 else "")
        console.print(f"fixing all {len(d.findings)} together: {d.combined_gain:.2f}x faster "
                      f"(interaction {100 * d.interaction:+.0f}% of the slowdown beyond the fixes one by one{beyond})")
    if d.unexplained_by:
        carried = ", ".join(f"{c['what']} {c['name']} (x{c['slowdown']:.3f})" for c in d.unexplained_by)
        console.print(f"[yellow]unexplained: {100 * d.unexplained:.0f}% of the slowdown[/]; carried by {carried}",
                      highlight=False)


def print_one_step(d: Diagnosis, console: Console) -> None:
    """Too few steps to judge: each step's arrivals at its first collective, and the ranks that came
    late (``laggard.diagnose.onestep``), with the caveat that one step cannot tell a steady straggler
    from a one-off."""
    from rich.table import Table

    console.print(f"[yellow bold]verdict: {d.verdict}[/] ({d.reason})", highlight=False)
    for s in d.one_step:
        console.print(f"step {s.step} ({1e3 * s.step_s:.1f} ms): each rank's start and its arrival at its first "
                      "collective, after the earliest rank's", highlight=False)
        t = Table(show_edge=False, highlight=False)
        for c in ("rank", "began +ms", "arrived +ms", "waited ms"):
            t.add_column(c, justify="right", no_wrap=True)
        for a in s.arrivals:
            t.add_row(str(a.rank), f"{1e3 * a.entry_s:.1f}", f"{1e3 * a.arrival_s:.1f}", f"{1e3 * a.waited_s:.1f}")
        console.print(t)
        if not s.late:
            console.print(f"no rank arrived late in step {s.step} (each within {1e3 * s.threshold_s:.1f} ms, "
                          f"{100 * s.threshold_s / s.step_s:.0f}% of the step, of the next)", highlight=False)
    for i, f in enumerate(d.findings, 1):
        w = finding_text(f.to_json())
        console.print(f"{i}. [bold]{w.what}[/] (low confidence: one step)", highlight=False)
        console.print(Text(f"   evidence: {w.evidence}\n   next: {w.fix}"), highlight=False)


def findings_table(d: Diagnosis) -> str:
    """The HTML table of the findings (one row each), with the combined gain where there are several."""
    from laggard.report.page import rich_text

    rows = []
    for i, f in enumerate(d.findings, 1):
        w = finding_text(f.to_json())
        rows.append(
            "<tr>"
            f"<td>{i}</td><td><strong>{escape(w.cause)}</strong>{escape(w.qualifier)}<br><small>{escape(w.where)}</small></td>"
            f"<td>{100 * f.share:.0f}% ({100 * f.score:.0f}% alone)</td><td>{gain_html(f)}</td>"
            f"<td>{rich_text(w.evidence)}"
            + (f"<br>consistency: {rich_text(w.consistency)}" if w.consistency else "")
            + f"<br><small>pattern: {escape(pattern(f))}</small></td>"
            f"<td>{rich_text(w.fix)}" + (f"<br><small>gain beyond S: {escape(w.beyond)}</small>" if w.beyond else "")
            + (f"<br><small>check the {f.gain:.2f}x{' bound' if f.gain_layers is not None else ''}:"
               f"</small> <code>{escape(w.check)}</code>" if w.check else "") + "</td>"
            "</tr>"
        )
    return (
        '<table class="findings"><thead><tr><th>#</th><th>cause</th><th>explains</th><th>fix gives</th>'
        "<th>evidence</th><th>fix</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    ) + (f"<p>Fixing all {len(d.findings)} together: {d.combined_gain:.2f}x faster.</p>" if len(d.findings) > 1 else "")


def findings_html(res: Analysis) -> str | None:
    """The findings section for the top of the HTML report (None without a diagnosis)."""
    from laggard.report.page import rich_text, section

    d = res.diagnosis
    if d is None:
        return None
    if d.verdict == "healthy":
        body = f'<p class="lead">Healthy: the straggler slowdown is below {d.threshold:g}; nothing to fix.</p>'
        return section(heading(d), body, id="findings")
    if d.one_step:  # too few steps: who arrived late, read off each step (laggard.diagnose.onestep)
        items = "".join(f"<li><strong>{escape(finding_text(f.to_json()).what)}</strong> (low confidence: one step): "
                        f"{escape(f.evidence)}</li>" for f in d.findings)
        late = f"<ol>{items}</ol>" if items else "<p>No rank arrived late.</p>"
        body = f'<p class="lead">{escape(d.verdict.capitalize())}: {escape(d.reason)}.</p>{late}'
        return section(heading(d), body, id="findings")
    if d.reason:
        body = f'<p class="lead">{escape(d.verdict.capitalize())}: {escape(d.reason)}. No findings.</p>'
        return section(heading(d), body, id="findings")
    unexplained = ""
    if d.unexplained_by:
        carried = ", ".join(f"{c['what']} {c['name']} (x{c['slowdown']:.3f})" for c in d.unexplained_by)
        unexplained = (f"<p>Unexplained: {100 * d.unexplained:.0f}% of the slowdown; "
                       f"carried by {rich_text(carried)}.</p>")
    if d.note:
        unexplained = f"<p>Note: {escape(d.note)}.</p>" + unexplained
    # a straggling job with no straggler to name says so first (its findings are costs every rank pays)
    first = no_straggler_words(d, res.slowdown) + ". " if no_straggler(d) else ""
    if not d.findings:
        return section(heading(d), unexplained, id="findings", lead=first or None)
    return section(
        heading(d),
        findings_table(d) + unexplained,
        id="findings",
        lead=first + "Each finding names a cause, the share of the slowdown it explains (a what-if that fixes only "
        "that cause) and the speed-up fixing it gives.",
        howto=[
            "**explains** is the finding's share of (measured step time - ideal step time) when every finding's "
            "fix is shared out jointly (Shapley values: causes that hide each other split what fixing them "
            "together removes); in brackets, what fixing only this cause removes. Stragglers come first, then "
            "costs every rank pays alike (the launch overhead, a tail on every link), each by the speed-up its "
            "fix gives.",
            "**fix gives** is the predicted speed-up of the replayed step time: the speed-up of the "
            "`laggard whatif` command under the fix, which prints the same number when you run it. Where it is "
            "more than the job's slowdown S, *gain beyond S* says why (the fix removes time the ideal pays too, or "
            "the ideal holds the slow ops in its means).",
            "**consistency** says, for each rank, stage or link a finding names, in how many steps its time "
            "exceeds its reference (its stage peers, the other stages, the other links of its op type) beyond the "
            "job's own step-to-step noise, the median ratio and its spread; "
            "a transient straggler lists its slow steps. "
            "Nothing within the noise is named.",
            "The heatmap below shows the pattern each finding was read from.",
        ],
    )
