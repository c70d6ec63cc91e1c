"""The real corpus's figures (benchmarks/real_corpus.py): side by side with the simulator sweep's stored
ones, every job that went wrong, and the entry in benchmarks/results.json."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.json"


SWEEPS = {"simulator": "mixture (1-4 causes)", "sim, real noise": "mixture, real-job noise (1-4 causes)"}


def simulator_figures(path: Path = RESULTS) -> dict[str, dict]:
    """Per sweep of ``SWEEPS`` (bench_diagnose_mixed's mixture of 1-4 causes with the simulator's own
    noise, and the same sweep with the noise measured on the real corpus's clean jobs), its stored
    figures from results.json: precision, recall, the share of clean jobs called healthy."""
    try:
        figs = json.loads(path.read_text())["benchmarks"]["bench_diagnose_mixed"]["figures"]
    except (OSError, ValueError, KeyError):
        return {}
    out: dict[str, dict] = {}
    for col, tag in SWEEPS.items():
        for f in figs:
            name = f["name"]
            if not name.startswith(tag + ":"):
                continue
            key = next((k for part, k in ((": precision of named causes", "precision"),
                                          (": recall of named causes", "recall"),
                                          (": clean jobs called healthy", "clean_healthy_rate")) if part in name), None)
            if key:
                out.setdefault(col, {})[key] = f["value"] / 100 if key == "clean_healthy_rate" else f["value"]
    return out


def figures(summary: dict, sims: dict[str, dict]) -> list[dict]:
    """The corpus's figures in benchmarks/run.py's format, the simulator sweep's as each one's baseline
    and the sweep with real-job noise in its detail."""
    base = "simulator sweep (bench_diagnose_mixed, stored figure)"
    sim, real = sims.get("simulator", {}), sims.get("sim, real noise", {})
    rows = []
    for which in ("tracer", "profiler"):
        s = summary[which]
        if s["num_jobs"] and s["errors"] == s["num_jobs"]:
            continue  # no trace of this kind (generate --no-profiler): no figure, not a zero
        tag = f"real corpus, {which} traces ({s['num_jobs']} jobs)"
        low = s["recall_by_factor"].get("1.15-1.25", {})
        rows += [
            {"name": f"{tag}: precision of named causes (cause + ranks/stage/link)", "value": s["precision"],
             "baseline": base, "baseline_value": sim.get("precision"), "target": ">= 0.95",
             "ok": s["precision"] >= 0.95, "detail": {**{k: s[k] for k in ("num_findings", "verdicts", "errors")},
                                                      "sim_real_noise": real.get("precision")}},
            {"name": f"{tag}: recall of named causes, factor >= 1.25", "value": s["recall_factor_ge_1.25"],
             "baseline": base, "baseline_value": sim.get("recall"), "target": ">= 0.9",
             "ok": s["recall_factor_ge_1.25"] >= 0.9,
             "detail": {"recall_all": s["recall"], "num_causes": s["num_causes"],
                        "sim_real_noise_recall": real.get("recall"),
                        "by_factor": s["recall_by_factor"], "by_kind": s["recall_by_kind"]}},
            {"name": f"{tag}: recall of named causes, factor 1.15-1.25", "value": low.get("recall", float("nan")),
             "detail": low},
            {"name": f"{tag}: recall of jobs with one cause, measured impact >= 1.25 (against the clean twin)",
             "value": s["recall_by_impact"]["single_cause"].get("1.25+", {}).get("recall", float("nan")),
             "target": ">= 0.9", "detail": s["recall_by_impact"]},
            {"name": f"{tag}: precision of named ranks (1 - extra ranks / ranks named)", "value": s["rank_precision"],
             "target": ">= 0.95", "ok": s["rank_precision"] >= 0.95,
             "detail": {k: s.get(k) for k in ("named_ranks", "extra_ranks", "jobs_with_extra_ranks",
                                              "extra_ranks_slow_by_own_timers", "rank_precision_own_timers")}},
            {"name": f"{tag}: clean jobs with a false alarm (a rank, stage or link named)",
             "value": 100 * s["clean_false_alarm_rate"], "unit": "%", "target": "0%",
             "ok": s["clean_false_alarm_rate"] == 0,
             "detail": {"clean_jobs": s["clean_jobs"], "clean_healthy_rate": s["clean_healthy_rate"],
                        "clean_rank_alarm_rate": s.get("clean_rank_alarm_rate"),
                        "sim_clean_healthy_rate": sim.get("clean_healthy_rate"),
                        "sim_real_noise_clean_healthy_rate": real.get("clean_healthy_rate")}},
        ]
    return rows


def print_report(summary: dict, sims: dict[str, dict]) -> None:
    """The figures side by side: real jobs traced by the Tracer, by torch.profiler, the simulator sweeps
    (its own noise, and the noise of the real jobs)."""
    def pct(v: float | None) -> str:
        return "-" if v is None or v != v else f"{100 * v:5.1f}%"

    def bucket(b: str):  # noqa: ANN202
        return lambda s: s["recall_by_factor"].get(b, {}).get("recall")

    rows = [("precision of named causes", lambda s: s["precision"], "precision"),
            ("recall (all causes)", lambda s: s["recall"], "recall"),
            ("recall, factor >= 1.25", lambda s: s["recall_factor_ge_1.25"], None),
            *[(f"recall, factor {b}", bucket(b), None) for b in ("1.15-1.25", "1.25-1.50", "1.50+", "no factor")],
            ("precision of named ranks", lambda s: s["rank_precision"], None),
            ("  counting own-timer-slow ranks right", lambda s: s.get("rank_precision_own_timers"), None),
            ("jobs naming an extra rank", lambda s: s["jobs_with_extra_ranks"], None),
            ("clean jobs: false alarm", lambda s: s["clean_false_alarm_rate"], None),
            ("clean jobs: a rank named", lambda s: s.get("clean_rank_alarm_rate"), None),
            ("clean jobs: called healthy", lambda s: s["clean_healthy_rate"], "clean_healthy_rate")]
    t, p = summary["tracer"], summary["profiler"]
    cols = list(SWEEPS)
    print(f"{'':34} {'tracer':>9} {'profiler':>9}" + "".join(f" {c:>15}" for c in cols))
    for label, get, sim_key in rows:
        print(f"{label:34} {pct(get(t)):>9} {pct(get(p)):>9}"
              + "".join(f" {pct(sims.get(c, {}).get(sim_key) if sim_key else None):>15}" for c in cols))
    print(f"jobs {t['num_jobs']}, causes {t['num_causes']}; analysis errors: tracer {t['errors']}, "
          f"profiler {p['errors']};"
          f" verdicts: tracer {t['verdicts']}, profiler {p['verdicts']}")
    for b in ("0.00-1.05", "1.05-1.25", "1.25+"):
        a, c = (x["recall_by_impact"]["single_cause"].get(b, {}) for x in (t, p))
        print(f"{'recall, one cause, impact ' + b:34} {pct(a.get('recall')):>9} {pct(c.get('recall')):>9}"
              f"   ({a.get('causes', 0)} jobs, measured against the clean twin)")
    tw = t["recall_by_impact"]["clean_twin_ratio"]
    if tw["n"]:
        print(f"  clean jobs against their twins: median ratio {tw['median']:.3f}, "
              f"worst |ratio - 1| {tw['max_abs_dev']:.3f}"
              " (the run-to-run noise)")
    for kind in sorted(t["recall_by_kind"]):
        a, b = t["recall_by_kind"][kind], p["recall_by_kind"].get(kind, {})
        print(f"  {kind:20} named: tracer {a['named']}/{a['causes']}, "
              f"profiler {b.get('named', 0)}/{b.get('causes', 0)}")


def print_problems(out: dict, truths: dict[str, dict]) -> None:
    for job, by in out["jobs"].items():
        tr = truths[job]
        lines = []
        for which, s in by.items():
            if s["misses"] or s["wrong"] or s["extra_ranks"] or s["status"] != "ok":
                lines.append(f"    {which:8} {s['status']}, verdict {s['verdict']}; missed {s['misses'] or '-'}; "
                             f"unmatched findings {s['wrong'] or '-'}; extra ranks {s['extra_ranks'] or '-'}"
                             + (f" (slow by the job's own timers: {s['extra_slow_by_own_timers']})"
                                if s.get("extra_slow_by_own_timers") else ""))
        if lines:
            specs = " + ".join(c["spec"] for c in tr["causes"]) or "clean"
            print(f"  {job} {tr['layout']['name']}: {specs}")
            print("\n".join(lines))


def write_results(rows: list[dict], seconds: float, path: Path = RESULTS, key: str = "real_corpus") -> None:
    doc = json.loads(path.read_text()) if path.exists() else {"benchmarks": {}}
    doc.setdefault("benchmarks", {})[key] = {"seconds": round(seconds, 2), "figures": rows}
    path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
