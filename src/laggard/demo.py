"""`laggard demo`: analyse the shipped example trace (AR: one worker slowed 2x) end to end."""

from __future__ import annotations

from pathlib import Path

from laggard.ops import LaggardError

_DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "ndtimeline"


def example_trace() -> Path:
    trace = _DATA / "trace-AR.parquet"
    if not trace.exists():
        raise LaggardError(f"{trace}: the example trace is missing (run the demo from a laggard checkout)")
    return trace


def run_demo(out_dir: Path) -> dict[str, Path]:
    """Analyse the example trace; write JSON, HTML and Perfetto outputs; return their paths."""
    from laggard.io import load_job
    from laggard.io.perfetto import write_perfetto
    from laggard.report.html import write_html
    from laggard.report.jsonout import write_json
    from laggard.report.terminal import print_summary
    from laggard.whatif import analyze

    out_dir.mkdir(parents=True, exist_ok=True)
    res = analyze(load_job(example_trace()))
    paths = {
        "json": out_dir / "analysis.json",
        "html": out_dir / "report.html",
        "perfetto": out_dir / "timeline.perfetto.json",
    }
    write_json(res, paths["json"])
    write_html(res, paths["html"])
    write_perfetto(res, paths["perfetto"])
    print_summary(res)
    return paths
