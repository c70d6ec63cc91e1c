"""The HTML report: one self-contained file (inline CSS and SVG; no script, no external loads).

``write_html(result, path)`` writes the report of a :class:`laggard.whatif.Analysis`. Later work
adds its own sections without touching this module: ``top_sections`` go right under the headline
numbers (e.g. findings), ``extra_sections`` after the built-in charts; each is an HTML string,
best built with :func:`section` so it shares the page's look. Every text that comes from data is
escaped here; section bodies passed in are trusted HTML (escape what you put in them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.ops import LaggardError
from laggard.report import plots

if TYPE_CHECKING:
    from laggard.whatif import Analysis

MAX_ROWS = 64  # heatmap rows (DP ranks) before neighbouring ranks are merged into one row
MAX_COLS = 48  # heatmap columns (stages) before neighbouring stages are merged
TOP_WORKERS = 12
MAX_OUTLINED = 24  # heatmap cells outlined at most
NOISE = 0.02  # slowdowns within 1 + NOISE are not called out
FIDELITY_WARN = 0.10  # replay error above which the report says to treat attributions with care


# ---------------------------------------------------------------- public API


def write_html(
    result: Analysis,
    path: str | Path,
    *,
    top_sections: Sequence[str] | None = None,
    extra_sections: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Write the report to ``path`` (parents created). See :func:`render_html` for the sections."""
    page = render_html(result, top_sections=top_sections, extra_sections=extra_sections, title=title)
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(page, encoding="utf-8")
    except OSError as e:
        raise LaggardError(f"{p}: cannot write the HTML report ({e.strerror or e})") from None
    return p


def render_html(
    result: Analysis,
    *,
    top_sections: Sequence[str] | None = None,
    extra_sections: Sequence[str] | None = None,
    title: str | None = None,
) -> str:
    """The report as one HTML string.

    Order: header and headline numbers; ``top_sections`` (by default the diagnosis findings); the
    worker heatmap; stages and DP ranks; op types; steps; worst workers; ``extra_sections``;
    warnings; method.
    """
    if top_sections is None and getattr(result, "diagnosis", None) is not None:
        from laggard.report.findings import findings_html

        found = findings_html(result)
        top_sections = [found] if found else None
    name = result.meta.name
    page_title = title or f"laggard report: {name}"
    body = [
        _header(result, title or name),
        _kpis(result),
        *(top_sections or ()),
        _heatmap_section(result),
        _stage_dp_section(result),
        _optype_section(result),
        _steps_section(result),
        _workers_section(result),
        _arrivals_section(result),
        *(extra_sections or ()),
        _warnings_section(result),
        _method_section(),
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="generator" content="laggard">\n'
        f"<title>{escape(page_title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(body)
        + "\n</main>\n</body>\n</html>\n"
    )


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
        items = "".join(f"<li>{_rich(h)}</li>" for h in howto)
        parts.append(f'<details class="howto" open><summary>How to read this</summary><ul>{items}</ul></details>')
    parts.append("</section>")
    return "\n".join(parts)


# ---------------------------------------------------------------- formatting


def _rich(text: str) -> str:
    """Escape ``text``, then turn **bold** spans into <strong>."""
    out = escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(out))


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _fmt(x: float | None, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if _finite(x) else "n/a"


def _pct(x: float | None, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%" if _finite(x) else "n/a"


def _secs(x: float | None) -> str:
    if not _finite(x):
        return "n/a"
    assert x is not None
    if abs(x) >= 100:
        return f"{x:,.0f} s"
    if abs(x) >= 1:
        return f"{x:.2f} s"
    return f"{1e3 * x:.1f} ms"


def _level(s: float) -> str:
    if not _finite(s):
        return "neutral"
    return "bad" if s >= 1.2 else "warn" if s >= 1.05 else "good"


def _ranks(ranks: Sequence[int], limit: int = 6) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


# ---------------------------------------------------------------- header and numbers


def _header(res: Analysis, heading: str) -> str:
    m = res.meta
    layout = f"DP {m.dp_size} × PP {m.pp_size} × TP {m.tp_size}"
    for dim, size in (("CP", m.cp_size), ("DSP", m.dsp_size), ("EP", m.ep_size)):
        if size > 1:
            layout += f" × {dim} {size}"
    if m.vpp_size > 1:
        layout += f" (VPP {m.vpp_size})"
    facts = [
        layout,
        f"{m.num_gpus:,} GPUs" if m.world_size is not None else None,
        f"{res.num_workers:,} workers",
        f"{len(res.steps):,} steps" + (f" ({res.steps[0]}–{res.steps[-1]})" if len(res.steps) > 1 else ""),
        f"{res.num_ops:,} ops",
    ]
    chips = "".join(f'<span class="chip">{escape(f)}</span>' for f in facts if f)
    return (
        '<header class="top">'
        '<div class="brand">laggard · straggler report</div>'
        f"<h1>{escape(heading)}</h1>"
        f'<div class="source">{escape(m.source)}</div>'
        f'<div class="chips">{chips}</div>'
        "</header>"
    )


def replay_error(res: Analysis) -> tuple[float, float]:
    """(mean, max) over steps of |replayed - wall-clock| / wall-clock step time."""
    meas = np.asarray(res.step_wall_s, dtype=float)
    sim = np.asarray(res.step_simulated_s, dtype=float)
    ok = meas > 0
    if not ok.any():
        return float("nan"), float("nan")
    err = np.abs(sim[ok] - meas[ok]) / meas[ok]
    return float(err.mean()), float(err.max())


def _goes_away(share: float | None, when: str) -> str:
    if share is not None and share < 0:  # their ops were faster than ideal more than slower
        return f"none of the slowdown goes away when {when}: the replay gets slower"
    return f"of the slowdown goes away when {when}"


def _kpi(label: str, value: str, sub: str, level: str = "neutral") -> str:
    return (
        f'<div class="kpi {level}"><div class="kpi-label">{escape(label)}</div>'
        f'<div class="kpi-value">{escape(value)}</div><div class="kpi-sub">{_rich(sub)}</div></div>'
    )


def _kpis(res: Analysis) -> str:
    S = res.slowdown
    cards = [
        _kpi("Straggler slowdown S", _fmt(S), f"steps take **{_fmt(S, 2)}×** as long as with no stragglers", _level(S)),
        _kpi("Waste", _pct(res.waste), "of the job's GPU time is lost to stragglers (1 − 1/S)", _level(S)),
        _kpi("Step time", _secs(res.T_s), f"replayed; **{_secs(res.T_ideal_s)}** if every op took its ideal time"),
    ]
    gh = res.gpu_hours
    if gh is not None:
        cards.append(_kpi("GPU-hours wasted", f"{gh * res.waste:,.2f}",
                          f"of {gh:,.2f} GPU-hours traced on {res.meta.num_gpus:,} GPUs"))
    fixed = res.fixed_workers
    who = (f"the worst worker (rank {_ranks(fixed)}) runs" if len(fixed) == 1
           else f"the worst {len(fixed)} workers (ranks {_ranks(fixed)}) run")
    cards.append(_kpi("M_W: worst workers explain", _pct(res.M_W), _goes_away(res.M_W, f"{who} ideally"), "neutral"))
    last = max(res.by_stage) if res.by_stage else None
    cards.append(_kpi("M_S: last stage explains", _pct(res.M_S),
                      _goes_away(res.M_S, f"the last stage (stage {last}) runs ideally"), "neutral"))
    mean_err, max_err = replay_error(res)
    lvl = "warn" if _finite(mean_err) and mean_err > FIDELITY_WARN else "neutral"
    sub = (f"mean per-step gap between the replay and the trace (max {_pct(max_err)}); "
           f"time left out of the replay: {_pct(res.replay_fidelity - 1)}")
    if lvl == "warn":
        sub += "; **the replay does not match the trace well: read the attributions with care**"
    cards.append(_kpi("Replay fidelity", f"{_pct(mean_err)} error", sub, lvl))
    return f'<section class="kpis" id="summary">{"".join(cards)}</section>'


# ---------------------------------------------------------------- heatmap


@dataclass(kw_only=True, slots=True)
class HeatGrid:
    """The S_w grid as drawn: rows = DP ranks (or bins of them), columns = stages (or bins)."""

    values: np.ndarray
    row_labels: list[str]
    col_labels: list[str]
    cell_ids: list[list[str]]
    tooltips: list[list[str]]
    highlight: list[tuple[int, int]]
    row_bin: int  # DP ranks per row
    col_bin: int  # stages per column


def _bins(values: list[int], limit: int) -> tuple[int, list[list[int]]]:
    size = max(1, math.ceil(len(values) / limit))
    return size, [values[i : i + size] for i in range(0, len(values), size)]


def _span(vals: list[int], what: str) -> str:
    return f"{what} {vals[0]}" if len(vals) == 1 else f"{what} {vals[0]}–{vals[-1]}"


def worker_grid(res: Analysis, *, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> HeatGrid:
    """Bin the per-worker S_w into at most max_rows x max_cols cells (the maximum of each bin)."""
    dps = sorted({int(w["dp_rank"]) for w in res.by_worker})
    stages = sorted({int(w["stage"]) for w in res.by_worker})
    rb, rows = _bins(dps, max_rows)
    cb, cols = _bins(stages, max_cols)
    r_of = {d: i for i, grp in enumerate(rows) for d in grp}
    c_of = {s: j for j, grp in enumerate(cols) for s in grp}
    vals = np.full((len(rows), len(cols)), np.nan)
    who: dict[tuple[int, int], dict[str, Any]] = {}
    for w in res.by_worker:
        key = (r_of[int(w["dp_rank"])], c_of[int(w["stage"])])
        s = float(w["slowdown"])
        if not (np.isfinite(vals[key]) and vals[key] >= s):
            vals[key] = s
            who[key] = w
    binned = rb > 1 or cb > 1
    row_labels = [_span(g, "dp") for g in rows]
    col_labels = [_span(g, "pp") if cb > 1 else str(g[0]) for g in cols]
    ids, tips = [], []
    for i, rg in enumerate(rows):
        id_row, tip_row = [], []
        for j, cg in enumerate(cols):
            id_row.append(f"cell-r{i}-c{j}" if binned else f"cell-dp{rg[0]}-pp{cg[0]}")
            w = who.get((i, j))
            if w is None:
                tip_row.append(f"{_span(rg, 'dp')} / {_span(cg, 'pp')}: no worker in the trace")
            else:
                where = f"{_span(rg, 'dp')} / {_span(cg, 'pp')}: max " if binned else ""
                tip_row.append(f"{where}dp{w['dp_rank']} / pp{w['stage']} (rank {w['rank']}): "
                               f"S_w = {float(w['slowdown']):.4f}")
        ids.append(id_row)
        tips.append(tip_row)
    hot = sorted({(r_of[int(w["dp_rank"])], c_of[int(w["stage"])]) for w in outlined_workers(res)})
    return HeatGrid(values=vals, row_labels=row_labels, col_labels=col_labels, cell_ids=ids, tooltips=tips,
                    highlight=hot, row_bin=rb, col_bin=cb)


def outlined_workers(res: Analysis, *, limit: int = MAX_OUTLINED) -> list[dict[str, Any]]:
    """The workers the heatmap outlines: those M_W fixes that clearly stand out.

    A worker stands out when its excess S_w - 1 is at least half the worst worker's (and above
    noise); at most ``limit`` of them, worst first.
    """
    if not res.by_worker:
        return []
    fixed = set(res.fixed_workers)
    worst = max(float(w["slowdown"]) for w in res.by_worker)
    cut = 1.0 + max(0.5 * (worst - 1.0), NOISE)
    hot = [w for w in res.by_worker if int(w["rank"]) in fixed and float(w["slowdown"]) >= cut]
    return sorted(hot, key=lambda w: -float(w["slowdown"]))[:limit]


def _heatmap_section(res: Analysis) -> str:
    if not res.by_worker:
        return section("Who is slow: workers", "<p>No workers in the analysis.</p>", id="workers-heatmap")
    g = worker_grid(res)
    svg = plots.heatmap_svg(g.values, g.row_labels, g.col_labels, cell_ids=g.cell_ids, tooltips=g.tooltips,
                            highlight=g.highlight, cbar_label="S_w  (1 = not slowed)", prefix="heat")
    nr, nc = g.values.shape
    note = []
    if g.row_bin > 1:
        note.append(f"each row merges {g.row_bin} DP ranks")
    if g.col_bin > 1:
        note.append(f"each column merges {g.col_bin} stages")
    lead = ("S_w of each worker: the slowdown of the job when only that worker's DP rank, or only its stage, "
            "keeps its measured durations (the smaller of the two). Outlined: the workers that clearly stand "
            "out among the worst 3% (the ones M_W fixes). Hover a cell for its exact value.")
    if note:
        lead += " To fit the page, " + " and ".join(note) + "; a merged cell shows the worst worker in it."
    body = (f'<figure class="chart heatmap" data-rows="{nr}" data-cols="{nc}" data-cells="{nr * nc}">'
            f'<div class="scroll">{svg}</div></figure>')
    howto = [
        "**One hot cell**: one worker is slow (a faulty or throttled GPU, a busy host, a bad link). Through the "
        "pipeline and the gradient sync it holds back every other worker; look at that host first.",
        "**A hot row**: a whole DP replica is slow on every stage: its data is heavier (longer sequences) or "
        "its nodes share a slow network path.",
        "**A hot column**: one stage is slow on every DP rank: the model is split unevenly across stages.",
        "**A hot last column**: the last stage also runs the output layer and the loss; give it fewer "
        "layers (M_S shows how much that would recover).",
        "**Everything pale but S high**: the slowdown is not tied to particular workers; see the op types "
        "and steps below (e.g. sequence-length imbalance between microbatches, slow collectives).",
        "Values a little below 1 are noise: ideal durations are averages.",
    ]
    return section("Who is slow: worker slowdown by DP rank and stage", body, id="workers-heatmap",
                   lead=lead, howto=howto)


# ---------------------------------------------------------------- bars


def _stage_dp_section(res: Analysis) -> str:
    stages = sorted(res.by_stage)
    last = stages[-1] if stages else None
    st_cols = [plots.RED if s == last else plots.BLUE for s in stages]
    st_svg = plots.bars_svg([str(s) for s in stages], [res.by_stage[s] for s in stages], horizontal=False,
                            colours=st_cols, category_label="pipeline stage", value_label="S_stage",
                            reference=res.slowdown, reference_label="S (all ops measured)", width_in=5.2,
                            prefix="stages")
    dps = sorted(res.by_dp_rank)
    dp_vals = [res.by_dp_rank[d] for d in dps]
    dp_svg = plots.bars_svg([str(d) for d in dps], dp_vals, horizontal=False, category_label="DP rank",
                            value_label="S_dp", reference=res.slowdown, reference_label="S (all ops measured)",
                            width_in=5.2, prefix="dpranks")
    body = ('<div class="two">'
            f'<figure class="chart"><figcaption>By pipeline stage (last stage in red)</figcaption>{st_svg}</figure>'
            f'<figure class="chart"><figcaption>By DP rank</figcaption>{dp_svg}</figure></div>')
    howto = [
        "Each bar is the job's slowdown when only that stage (or DP rank) keeps its measured durations and "
        "everything else runs ideally. A bar at 1 contributes nothing; a bar reaching the dotted line "
        "explains the whole slowdown on its own.",
        "**A tall last-stage bar**: the last stage carries more work than the others (output layer, loss); "
        "rebalance the layers across stages.",
        "**One tall stage bar that is not the last**: either that stage is overloaded or one worker in it is "
        "slow; the heatmap above tells which.",
        "**One tall DP bar**: a straggler sits in that replica; the heatmap shows its stage.",
    ]
    return section("Stages and DP ranks", body, id="stages", howto=howto)


def _optype_section(res: Analysis) -> str:
    items = sorted(res.by_optype.items(), key=lambda kv: (-(kv[1] if _finite(kv[1]) else -1.0), kv[0]))
    comm = _comm_types(res)
    labels = [k for k, _ in items]
    cols = [plots.COMM if k in comm else plots.COMPUTE for k in labels]
    legend = {plots.COMPUTE: "compute / other", plots.COMM: "communication"} if comm else None
    svg = plots.bars_svg(labels, [v for _, v in items], horizontal=True, colours=cols, legend=legend,
                         reference=res.slowdown, reference_label="S (all ops measured)",
                         value_label="S_t: slowdown with only this op type measured", prefix="optypes")
    howto = [
        "Each bar is the job's slowdown when only that op type keeps its measured durations. The longest "
        "bars name what makes the job slow; bars at 1 do not matter.",
        "**Compute bars (forward/backward)**: slow computation: a slow GPU, or uneven work between "
        "microbatches or ranks (sequence lengths).",
        "**Communication bars** (all-gather, reduce-scatter, pipeline send/receive): slow links or a slow "
        "peer; a pipeline-communication bar often mirrors a slow neighbouring stage.",
        "The bars do not add up to S: op types interact through the dependencies.",
    ]
    return section("Op types", f'<figure class="chart">{svg}</figure>', id="optypes", howto=howto)


def _comm_types(res: Analysis) -> set[str]:
    """Attribution types of communication ops (empty without the baseline)."""
    b = res.base
    if b is None or not len(b.attr_code):
        return set()
    from laggard.ops import COMM_KINDS

    comm_kind = np.array([k in COMM_KINDS for k in b.kinds], dtype=bool)
    is_comm = comm_kind[b.kind_code]
    codes = np.unique(b.attr_code[is_comm])
    return {b.attr_names[int(c)] for c in codes}


def _steps_section(res: Analysis) -> str:
    if not res.steps:
        return section("Steps", "<p>No steps.</p>", id="steps")
    svg = plots.per_step_svg(res.steps, [res.per_step[s] for s in res.steps], res.step_measured_s,
                             res.step_simulated_s, res.step_ideal_s, overall=res.slowdown, prefix="steps")
    howto = [
        "Top: each step's time as traced, as replayed with the measured durations, and as replayed with ideal "
        "durations. Bottom: the slowdown of each step (replayed / ideal).",
        "**A flat, high slowdown**: a persistent straggler (the same worker or stage every step): hardware or "
        "the model split.",
        "**Spikes**: transient stragglers: garbage collection, a noisy neighbour, an unlucky batch of long "
        "sequences.",
        "**A gap between traced and replayed**: time the replay leaves out (kernel-launch and CPU stalls "
        "between ops); it is not counted in S.",
    ]
    return section("Steps", f'<figure class="chart">{svg}</figure>', id="steps", howto=howto)


# ---------------------------------------------------------------- tables


def _workers_section(res: Analysis) -> str:
    rows = res.by_worker[:TOP_WORKERS]
    if not rows:
        return ""
    vmax = plots.heat_vmax([w["slowdown"] for w in res.by_worker])
    fixed = set(res.fixed_workers)
    trs = []
    for i, w in enumerate(rows, 1):
        s = float(w["slowdown"])
        bg = plots.heat_colour(s, vmax)
        s_dp = res.by_dp_rank.get(int(w["dp_rank"]))
        s_pp = res.by_stage.get(int(w["stage"]))
        mark = "✔" if int(w["rank"]) in fixed else ""
        trs.append(
            f"<tr><td>{i}</td><td>{int(w['rank'])}</td><td>{int(w['dp_rank'])}</td><td>{int(w['stage'])}</td>"
            f'<td class="num" style="background:{bg};color:{plots.text_on(bg)}">{s:.3f}</td>'
            f'<td class="num">{_fmt(s_dp)}</td><td class="num">{_fmt(s_pp)}</td><td class="c">{mark}</td></tr>'
        )
    more = len(res.by_worker) - len(rows)
    foot = f'<p class="note">…and {more:,} more workers.</p>' if more > 0 else ""
    table = (
        '<table class="data"><thead><tr><th>#</th><th>rank</th><th>DP rank</th><th>stage</th>'
        '<th class="num">S_w</th><th class="num">S_dp</th><th class="num">S_stage</th>'
        '<th class="c">fixed in M_W</th></tr></thead><tbody>' + "".join(trs) + "</tbody></table>" + foot
    )
    return section("Worst workers", table, id="worst-workers",
                   lead="Workers by S_w = min(S_dp, S_stage), worst first. Ranks are global ranks of the trace.")


def _arrivals_section(res: Analysis) -> str:
    """Arrival skew at collectives (``extras["arrivals"]``, e.g. from Kineto traces)."""
    arr = res.extras.get("arrivals") if res.extras else None
    if not arr:
        return ""
    offs = res.extras.get("clock_offsets_s") or {}
    rows = sorted(arr.items(), key=lambda kv: (-kv[1]["last_count"], -kv[1]["mean_lag_s"]))[:TOP_WORKERS]
    vmax = max((a["last_share"] for _, a in rows), default=0.0) or 1.0
    trs = []
    for rank, a in rows:
        share = float(a["last_share"])
        bar = f'<span class="bar" style="display:inline-block;height:.7em;width:{100 * share / vmax:.0f}px;background:#c0392b"></span>'
        off = offs.get(rank)
        trs.append(
            f"<tr><td>{escape(str(rank))}</td><td class=\"num\">{int(a['last_count'])} / {int(a['num_collectives'])}</td>"
            f"<td>{bar} {100 * share:.0f}%</td><td class=\"num\">{1e3 * a['mean_lag_s']:.3f}</td>"
            f"<td class=\"num\">{1e3 * a['p99_lag_s']:.3f}</td>"
            f"<td class=\"num\">{'n/a' if off is None else f'{1e3 * off:.3f}'}</td></tr>"
        )
    groups = res.extras.get("arrivals_by_group") or {}
    gtxt = ""
    if len(groups) > 1:
        items = []
        for g, per in groups.items():
            worst = max(per.items(), key=lambda kv: (kv[1]["last_count"], kv[1]["mean_lag_s"]), default=None)
            if worst:
                items.append(
                    f"<li>group {escape(str(g))}: rank {escape(str(worst[0]))} last at "
                    f"{int(worst[1]['last_count'])} of {int(worst[1]['num_collectives'])}</li>"
                )
        gtxt = "<ul>" + "".join(items) + "</ul>"
    table = (
        '<table class="data"><thead><tr><th>rank</th><th class="num">arrived last</th><th>share</th>'
        '<th class="num">mean lag (ms)</th><th class="num">p99 lag (ms)</th><th class="num">clock offset (ms)</th>'
        "</tr></thead><tbody>" + "".join(trs) + "</tbody></table>" + gtxt
    )
    n = int(res.extras.get("num_collectives", 0))
    return section(
        "Arrivals at collectives", table, id="arrivals",
        lead=f"How late each rank reaches the {n:,} collectives, behind the first rank to arrive "
        "(clocks aligned on the collectives' end times; offsets removed are shown).",
        howto=["A rank that arrives **last** most often makes the others wait: look at its compute before the collective.",
               "Lags are start times of the collective on each rank minus the earliest start."],
    )


def _warnings_section(res: Analysis) -> str:
    if not res.warnings:
        return section("Warnings", '<p class="note">No warnings.</p>', id="warnings")
    items = "".join(f"<li>{escape(w)}</li>" for w in res.warnings)
    return section("Warnings", f'<ul class="warnings">{items}</ul>', id="warnings", cls="warn",
                   lead="Parts of the trace were skipped or adjusted; the numbers above are for what remains.")


def _method_section() -> str:
    dl = [
        ("Replay", "Each step is replayed from its dependency graph (ops on a stream in order, collectives "
                   "waiting for all participants, pipeline sends for their receivers), without launch gaps."),
        ("Ideal duration", "The mean duration of the op's type over all workers, steps and microbatches "
                           "(compute), or the median transfer time (communication)."),
        ("S", "T / T_ideal: replayed step time with measured durations over the one with ideal durations."),
        ("Waste", "1 − 1/S: the share of GPU time stragglers cost."),
        ("S_t, S_stage, S_dp", "The slowdown when only that op type, stage or DP rank keeps its measured "
                               "durations; S_w = min(S_dp, S_stage) for a worker."),
        ("M_W, M_S", "The share of T − T_ideal that disappears when the worst 3% of workers (M_W) or the "
                     "last stage (M_S) run ideally while everything else stays measured."),
    ]
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in dl)
    body = (f'<dl class="defs">{items}</dl><p class="note">Method: what-if analysis after Lin et al., '
            "“Understanding Stragglers in Large Model Training Using What-if Analysis”, OSDI ’25. "
            f"Generated by laggard {escape(_version())}.</p>")
    return section("How these numbers are computed", body, id="method", cls="method")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("laggard")
    except PackageNotFoundError:
        return "(development)"


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
@media print{body{background:#fff}.card,.kpi{break-inside:avoid}.heatmap .scroll{max-height:none}}
"""

__all__ = ["HeatGrid", "render_html", "replay_error", "section", "worker_grid", "write_html"]
