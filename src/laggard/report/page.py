"""Building blocks of the HTML report's page: sections, number formatting, the glossary, the CSS.

Every module of ``laggard.report`` that draws a part of the page uses these, so the parts share one
look and one wording. Text that comes from data is escaped by whoever puts it in the page; the
helpers here escape their plain-text arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from laggard.report.bands import band

NOISE = 0.02  # slowdowns within 1 + NOISE are not called out

# Plain-language meaning of each number the report shows, used for tooltips (title attributes) and
# the glossary. Values outside 0-100% are explained, since they surprise readers: ideal durations
# are averages over all workers, so fixing a part that is faster than average makes it slower.
GLOSSARY: dict[str, str] = {
    "S": "Straggler slowdown: the replayed step time with the measured op durations divided by the one "
         "with every op at its ideal duration. 1 = no straggling; 1.5 = steps take 50% longer than they "
         "would without stragglers.",
    "waste": "1 - 1/S: the share of the job's GPU time lost to stragglers.",
    "S_w": "Worker slowdown: how slow the whole job would be if only this worker's DP replica, or only its "
           "pipeline stage, kept its measured durations and everything else ran ideally (the smaller of the "
           "two). 1 = this worker does not slow the job; 1.97 = on its own it makes steps 1.97x as long. "
           "A little below 1 is noise (ideal durations are averages).",
    "S_dp": "The job's slowdown when only this DP replica keeps its measured durations.",
    "S_stage": "The job's slowdown when only this pipeline stage keeps its measured durations.",
    "S_t": "The job's slowdown when only this op type keeps its measured durations.",
    "M_W": "The share of the slowdown (T - T_ideal) that goes away when the worst 3% of workers run ideally "
           "and everything else stays as measured. Near 100%: those workers are the problem. Over 100%: "
           "fixing them makes the job faster than the all-ideal replay, because the other workers are faster "
           "than the average the ideal uses (the ideal includes the slow workers' time). Negative: their ops "
           "were faster than average, so idealising them makes the job slower: they are not the problem.",
    "M_S": "The share of the slowdown (T - T_ideal) that goes away when the last pipeline stage runs ideally "
           "and everything else stays as measured. Near 100%: the last stage (often the loss/logits layer) "
           "is the problem. Over 100% (e.g. 122%): idealising it removes more than the whole slowdown, since "
           "the ideal duration is the average over all stages, inflated by the heavy last stage, and the other "
           "stages are lighter than it. Negative or about 0% (e.g. -0.1%): the last stage is not slower than "
           "average; idealising it changes nothing or makes the job a little slower.",
    "fidelity": "How closely the replay reproduces the traced wall-clock step times (each rank starting a step "
                "when its previous one is done, as on the real run); time the replay leaves out (CPU launch gaps, "
                "data loading) is not counted in S.",
}


def tip(term: str) -> str:
    """A ``title`` attribute with the glossary text of ``term`` (escaped), for any HTML element."""
    return f' title="{escape(GLOSSARY[term])}"'


def section(title: str, body: str, *, id: str | None = None, lead: str | None = None,
            howto: Sequence[str] | None = None, cls: str = "") -> str:
    """A report section (a card with a heading).

    ``title``, ``lead`` and the ``howto`` items are plain text, escaped here (in ``howto``,
    ``**text**`` is set in bold); ``body`` is HTML, used as is. ``howto`` becomes the
    "How to read this" box under the body.
    """
    ident = f' id="{escape(id)}"' if id else ""
    parts = [f'<section class="card {escape(cls)}"{ident}>', f"<h2>{escape(title)}</h2>"]
    if lead:
        parts.append(f'<p class="lead">{escape(lead)}</p>')
    parts.append(body)
    if howto:
        items = "".join(f"<li>{rich_text(h)}</li>" for h in howto)
        parts.append(f'<details class="howto" open><summary>How to read this</summary><ul>{items}</ul></details>')
    parts.append("</section>")
    return "\n".join(parts)


# ---------------------------------------------------------------- formatting


def rich_text(text: str) -> str:
    """Escape ``text``, then turn **bold** spans into <strong> and `code` spans into <code> (the
    terminal's and the JSON's plain text marks commands with backticks; a page shows them as code)."""
    out = escape(text).split("**")
    html = "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(out))
    parts = html.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: not markup
        return html
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def fmt(x: float | None, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if finite(x) else "n/a"


def pct(x: float | None, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%" if finite(x) else "n/a"


def secs(x: float | None) -> str:
    if not finite(x):
        return "n/a"
    assert x is not None
    if abs(x) >= 100:
        return f"{x:,.0f} s"
    if abs(x) >= 1:
        return f"{x:.2f} s"
    return f"{1e3 * x:.1f} ms"


def level(s: float) -> str:
    if not finite(s):
        return "neutral"
    return band(s)


def ranks_text(ranks: Sequence[int], limit: int = 6) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


CSS = """
:root{--ink:#1f2933;--muted:#616e7c;--line:#e4e7eb;--bg:#f5f7fa;--card:#fff;--accent:#2f6db3;
--good:#3c8d5a;--warn:#d98a14;--bad:#c8382c}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1160px;margin:0 auto;padding:24px 20px 48px}
header.top{padding:8px 0 16px}
.brand{font-size:12px;letter-spacing:.08em;text-transform:uppercase;color:var(--muted);font-weight:600}
h1{font-size:26px;margin:4px 0 2px;font-weight:650;overflow-wrap:anywhere}
.source{color:var(--muted);font-size:13px;overflow-wrap:anywhere}
.chips{margin-top:10px;display:flex;flex-wrap:wrap;gap:6px}
.chip{background:#e8edf3;border-radius:999px;padding:2px 10px;font-size:12.5px}
.kpis{display:grid;grid-template-columns:repeat(auto-fill,minmax(230px,1fr));gap:12px;margin:8px 0 18px}
.kpi{background:var(--card);border:1px solid var(--line);border-left:4px solid #b8c2cc;border-radius:8px;
padding:12px 14px}
.kpi.good{border-left-color:var(--good)}.kpi.warn{border-left-color:var(--warn)}.kpi.bad{border-left-color:var(--bad)}
.kpi-label{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em;font-weight:600}
.kpi-value{font-size:26px;font-weight:650;margin:2px 0;font-variant-numeric:tabular-nums}
.kpi.bad .kpi-value{color:var(--bad)}.kpi.warn .kpi-value{color:#b06d00}.kpi.good .kpi-value{color:var(--good)}
.kpi-sub{font-size:12.5px;color:var(--muted)}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 20px;margin:0 0 18px}
.card.warn{border-left:4px solid var(--warn)}
h2{font-size:18px;margin:0 0 6px;font-weight:650}
p.lead{color:var(--muted);margin:0 0 10px;max-width:80ch}
.note{color:var(--muted);font-size:13px}
figure.chart{margin:6px 0;min-width:0}
figcaption{font-weight:600;font-size:13px;margin-bottom:2px}
.chart-svg{display:block;max-width:100%;height:auto}
.heatmap .scroll{max-height:900px;overflow:auto}
.heatmap .chart-svg{max-width:min(100%,900px)}
.two{display:grid;grid-template-columns:1fr 1fr;gap:18px}
@media (max-width:860px){.two{grid-template-columns:1fr}}
details.howto{background:#f7f9fb;border:1px solid var(--line);border-radius:8px;padding:8px 14px;margin-top:10px}
details.howto summary{cursor:pointer;font-weight:600;font-size:13px;color:var(--accent)}
details.howto ul{margin:6px 0 2px;padding-left:20px}
details.howto li{margin:3px 0;font-size:13.5px}
table.data{border-collapse:collapse;width:100%;font-size:13.5px;font-variant-numeric:tabular-nums}
table.data th,table.data td{padding:5px 10px;border-bottom:1px solid var(--line);text-align:left}
table.data th{font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
table.data .num{text-align:right}table.data .c{text-align:center}
ul.warnings li{margin:3px 0}
dl.defs{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:0 0 8px}
dl.defs dt{font-weight:600}dl.defs dd{margin:0;color:#3e4c59}
table.workers td:nth-child(n+5),table.workers th:nth-child(n+5){text-align:right}
table.workers td:last-child,table.workers th:last-child{text-align:center}
svg.stepheat .outline{fill:none;stroke:#1f2933;stroke-width:2}
svg.stepheat text,svg.timeline text{font-family:inherit;fill:#1f2933}
.stepheat-fig .scroll,.timeline-fig .scroll{overflow:auto;max-height:900px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:6px 0 0 112px;font-size:12.5px}
.legend .key i{display:inline-block;width:14px;height:9px;margin-right:5px;vertical-align:baseline}
details.more-workers{margin-top:8px}details.more-workers summary{cursor:pointer;color:var(--accent);font-weight:600}
th[title],.kpi[title]{cursor:help}
p.hint{margin:-10px 0 14px}
@media print{body{background:#fff}.card,.kpi{break-inside:avoid}.heatmap .scroll{max-height:none}}
"""

__all__ = ["CSS", "GLOSSARY", "NOISE", "finite", "fmt", "level", "pct", "ranks_text", "rich_text", "secs", "section",
           "tip"]
