"""Findings (root causes) for the terminal and the HTML report."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from laggard.whatif import Analysis

PATTERN = {
    "worker": "one hot cell in the DP x PP heatmap",
    "stage-imbalance": "one hot stage (a whole column) in the DP x PP heatmap",
    "sequence-imbalance": "hot cells scattered at random; forward and backward of a microbatch slow together",
    "gc": "rare forward-only stalls on different ranks at different steps",
    "comm": "slow transfers on one link or group",
    "launch-delay": "measured steps longer than the replay (untraced gaps)",
}


def _where(f) -> str:
    parts = []
    if f.workers:
        shown = ", ".join(f"rank {w['rank']} (dp{w['dp_rank']}/pp{w['stage']})" for w in f.workers[:4])
        parts.append(shown + (f" and {len(f.workers) - 4} more" if len(f.workers) > 4 else ""))
    if f.stages and f.cause == "stage-imbalance":
        parts.append("stage " + ", ".join(str(s) for s in f.stages))
    return "; ".join(parts)


def print_findings(res: Analysis, console: Console) -> None:
    d = res.diagnosis
    if d is None:
        return
    if d.verdict == "healthy":
        console.print(f"[green bold]verdict: healthy[/] (slowdown below {d.threshold:g}); no findings")
        return
    if not d.findings:
        console.print("[yellow bold]verdict: straggling[/]; no single cause explains it: see the attributions below")
        return
    console.print("[red bold]verdict: straggling[/]")
    for i, f in enumerate(d.findings, 1):
        where = _where(f)
        console.print(
            f"[bold]{i}. {f.cause}[/]" + (f" — {where}" if where else "")
            + f"  explains {100 * f.score:.0f}% of the slowdown; fixing it: {f.gain:.2f}x faster"
        )
        console.print(f"   evidence: {f.evidence}", highlight=False)
        console.print(f"   fix: {f.fix}", highlight=False)


def findings_html(res: Analysis) -> str | None:
    """The findings section for the top of the HTML report (None without a diagnosis)."""
    from laggard.report.html import section

    d = res.diagnosis
    if d is None:
        return None
    if d.verdict == "healthy":
        body = f'<p class="lead">Healthy: the straggler slowdown is below {d.threshold:g}; nothing to fix.</p>'
        return section("Diagnosis", body, id="findings")
    if not d.findings:
        body = "<p>The job straggles but no single cause explains it; see the attributions below.</p>"
        return section("Diagnosis", body, id="findings")
    rows = []
    for i, f in enumerate(d.findings, 1):
        rows.append(
            "<tr>"
            f"<td>{i}</td><td><strong>{escape(f.cause)}</strong><br><small>{escape(_where(f))}</small></td>"
            f"<td>{100 * f.score:.0f}%</td><td>{f.gain:.2f}x</td>"
            f"<td>{escape(f.evidence)}<br><small>pattern: {escape(PATTERN.get(f.cause, ''))}</small></td>"
            f"<td>{escape(f.fix)}</td>"
            "</tr>"
        )
    body = (
        '<table class="findings"><thead><tr><th>#</th><th>cause</th><th>explains</th><th>fix gives</th>'
        "<th>evidence</th><th>fix</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
    return section(
        "Diagnosis: why this job straggles",
        body,
        id="findings",
        lead="Each finding names a cause, the share of the slowdown it explains (a what-if that fixes only "
        "that cause) and the speed-up fixing it gives.",
        howto=[
            "**explains** is the share of (measured step time - ideal step time) that disappears when only this "
            "cause is made healthy in the replay; findings are sorted by it.",
            "**fix gives** is the predicted speed-up of the replayed step time.",
            "The heatmap below shows the pattern each finding was read from.",
        ],
    )
