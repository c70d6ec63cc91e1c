"""The fleet report: one self-contained HTML page (inline CSS and SVG, no script) at DIR/fleet.html.

Sections: headline numbers; CDFs of slowdown and waste; GPU-hours wasted by cause and by op kind;
top causes; goodput (productive GPU-hours, lost to stragglers by cause and to hangs); slowdown against
job size; the top jobs by GPU-hours wasted with their findings; hosts ranked by what their slowness
cost (``laggard.fleet.hosts``); coverage (analyzed, rejected, failed and why).
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from laggard.errors import LaggardError
from laggard.fleet import charts
from laggard.fleet.goodput import FleetGoodput
from laggard.fleet.hosts import HostsView
from laggard.fleet.stats import FleetStats
from laggard.report.html import CSS, section


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def _kpi(label: str, value: str, sub: str) -> str:
    return (f'<div class="kpi neutral"><div class="kpi-label">{escape(label)}</div>'
            f'<div class="kpi-value">{escape(value)}</div><div class="kpi-sub">{escape(sub)}</div></div>')


def _kpis(s: FleetStats) -> str:
    ok = s.by_status.get("ok", 0)
    cards = [
        _kpi("Jobs analyzed", f"{ok:,} of {s.num_jobs:,}",
             f"{s.by_status.get('rejected', 0):,} rejected, {s.by_status.get('error', 0):,} failed (see coverage)"),
        _kpi(f"Jobs with S ≥ {s.straggling_slowdown:g}", _pct(s.straggling_share),
             "of the analyzed jobs run at least 10% slower than without stragglers"),
        _kpi("GPU-hours wasted", f"{s.gpu_hours_wasted:,.2f}",
             f"of {s.gpu_hours:,.2f} traced ({_pct(s.gpu_hours_wasted / s.gpu_hours if s.gpu_hours else None)})"
             + (f"; {s.num_without_gpu_hours} jobs of unknown size left out" if s.num_without_gpu_hours else "")),
    ]
    if len(s.slowdown):
        import numpy as np

        cards.append(_kpi("Median slowdown", f"{float(np.median(s.slowdown)):.3f}",
                          f"p90 {float(np.quantile(s.slowdown, 0.9)):.3f}, max {float(s.slowdown[-1]):.3f}"))
    return f'<section class="kpis" id="summary">{"".join(cards)}</section>'


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="data"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _waste_sections(s: FleetStats) -> list[str]:
    out = []
    if s.wasted_by_cause:
        causes = list(s.wasted_by_cause)
        svg = charts.hbars_svg(causes, [s.wasted_by_cause[c] for c in causes], xlabel="GPU-hours wasted",
                               prefix="cause")
        counts = _table(["top finding", "jobs"], [[escape(c), f"{n:,}"] for c, n in s.top_cause_counts.items()])
        out.append(section("GPU-hours wasted by cause", svg + counts, id="by-cause",
                           lead="Each job's waste split over its findings by the share of its slowdown each explains."))
    kinds = [k for k, v in s.wasted_by_kind.items() if v > 0 or k != "neither"]
    svg = charts.hbars_svg(kinds, [s.wasted_by_kind[k] for k in kinds], xlabel="GPU-hours wasted",
                           colours=[charts.KIND_COLOURS[k] for k in kinds], prefix="kind")
    out.append(section("GPU-hours wasted by op kind", svg, id="by-kind",
                       lead="Split by S_t of all compute vs all communication ops (each kind alone measured, "
                            "everything else ideal)."))
    return out


def _top_jobs(s: FleetStats) -> str:
    rows = []
    for i, j in enumerate(s.top_jobs, 1):
        finds = "<br>".join(
            f"<strong>{escape(f['cause'])}</strong> ({_pct(f['score'])} of S): {escape(f['evidence'])}"
            for f in j["findings"]) or "no finding"
        rows.append([str(i), escape(j["job"]), f"{j['slowdown']:.3f}", f"{j['num_gpus']:,}",
                     f"{j['gpu_hours_wasted']:,.3g}", finds])
    body = _table(["#", "job", "S", "GPUs", "GPU-h wasted", "findings"], rows) if rows else "<p>No analyzed jobs.</p>"
    return section(f"Top {len(rows)} jobs by GPU-hours wasted", body, id="top-jobs",
                   lead="Fix these first; each job's full analysis is in jobs/*.json beside fleet.parquet.")


def _goodput(g: FleetGoodput | None) -> str:
    if g is None or not g.num_jobs:
        return ""
    parts = ["productive"] + [f"stragglers: {c}" for c in g.stragglers_by_cause] + ["hangs"]
    values = [g.productive] + list(g.stragglers_by_cause.values()) + [g.hangs]
    svg = charts.hbars_svg(parts, values, xlabel="GPU-hours", prefix="goodput")
    rows = [[escape(j["job"]), f"{j['gpu_hours']:,.3g}", _pct(j["goodput"]), f"{j['stragglers']:,.3g}",
             f"{j['hangs']:,.3g}", escape(j["hang_verdict"] or "-")] for j in g.worst_jobs]
    table = _table(["job", "GPU-h", "goodput", "lost to stragglers", "lost to hangs", "hang verdict"], rows)
    verdicts = ", ".join(f"{n} {v}" for v, n in g.hang_verdicts.items())
    lead = (f"Goodput {_pct(g.goodput)}: {g.productive:,.3g} of {g.gpu_hours:,.3g} GPU-hours productive; "
            f"{g.stragglers:,.3g} lost to stragglers, {g.hangs:,.3g} to hangs "
            f"({g.num_hung_jobs} job(s) with a hang verdict beside the trace{': ' + verdicts if verdicts else ''}). "
            "A hang's window (first rank stuck to last dump) is lost whole; the stragglers' loss is the "
            "analysis' waste outside it.")
    return section("Goodput", svg + f"<h3>Jobs that lost most</h3>{table}", id="goodput", lead=lead)


HOSTS_SHOWN = 30  # hosts in the table (all of them are in hosts.parquet)


def _hosts(view: HostsView | None) -> str:
    if view is None:
        return ""
    if not view.hosts:
        return section("Hosts", "<p>No analyzed job's trace names its hosts (the Tracer records them in job.json; "
                                "profiler traces carry host_name in newer versions).</p>", id="hosts")
    rows = []
    for i, h in enumerate(view.hosts[:HOSTS_SHOWN], 1):
        causes = ", ".join(sorted(h.causes, key=lambda c: -h.causes[c])) or "-"
        named = (", ".join(escape(j) for j in h.named_jobs[:4])
                 + (f" and {len(h.named_jobs) - 4} more" if len(h.named_jobs) > 4 else ""))
        rows.append([str(i), escape(h.host), f"<strong>{escape(h.verdict)}</strong>", f"{h.num_jobs:,}",
                     f"{h.num_named:,} ({_pct(h.named_share)})", f"{h.gpu_hours_cost:,.3g}", escape(causes),
                     named or "-"])
    body = _table(["#", "host", "verdict", "jobs", "named in", "GPU-h cost", "causes", "jobs named in"], rows)
    more = f" {len(view.hosts) - HOSTS_SHOWN} more in hosts.parquet." if len(view.hosts) > HOSTS_SHOWN else ""
    left = (f" {view.num_jobs_without_hosts:,} analyzed jobs name no host and are left out."
            if view.num_jobs_without_hosts else "")
    return section("Hosts that keep straggling", body, id="hosts",
                   lead="Per host: the analyzed jobs it ran in, how many of them had a finding (slow worker, link, "
                        "host time) naming one of its ranks, and the GPU-hours that cost the job (all its GPUs wait). "
                        "Chronic: named in several jobs and a good share of its jobs; one-off: once." + more + left)


def _coverage(s: FleetStats) -> str:
    status = _table(["status", "jobs"], [[escape(k), f"{v:,}"] for k, v in sorted(s.by_status.items())])
    reasons = _table(["reason", "jobs", "example"], [
        [escape(k), f"{n:,}", escape(s.failure_examples.get(k, ""))] for k, n in s.failure_reasons.items()
    ]) if s.failure_reasons else "<p>Every job was analyzed.</p>"
    return section("Coverage", status + reasons, id="coverage",
                   lead="Rejected jobs were analyzed but their numbers are not trusted (too few steps, a replay "
                        "that does not fit the trace); failed jobs could not be read or analyzed.")


def render_fleet_html(s: FleetStats, *, title: str = "laggard fleet report", hosts: HostsView | None = None,
                      goodput: FleetGoodput | None = None) -> str:
    body = [
        f'<header class="top"><div class="brand">laggard · fleet report</div><h1>{escape(title)}</h1></header>',
        _kpis(s),
        section("How slow are the jobs?", charts.cdf_svg(s.slowdown, s.waste, threshold=s.straggling_slowdown),
                id="cdf", lead="Cumulative share of analyzed jobs by slowdown S = T / T_ideal and waste 1 - 1/S."),
        *_waste_sections(s),
        _goodput(goodput),
        section("Slowdown against job size", charts.size_svg(s.size_gpus, s.size_slowdown, corr=s.spearman_size),
                id="size", lead=f"Spearman rank correlation {_fmt(s.spearman_size)}; Pearson against log2(GPUs) "
                                f"{_fmt(s.pearson_log_size)}."),
        _top_jobs(s),
        _hosts(hosts),
        _coverage(s),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
            + "\n".join(b for b in body if b) + "\n</main>\n</body>\n</html>\n")


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def write_fleet_html(s: FleetStats, path: str | Path, *, hosts: HostsView | None = None,
                     goodput: FleetGoodput | None = None) -> Path:
    p = Path(path)
    try:
        p.write_text(render_fleet_html(s, hosts=hosts, goodput=goodput), encoding="utf-8")
    except OSError as e:
        raise LaggardError(f"{p}: cannot write the fleet report ({e.strerror or e})") from None
    return p
