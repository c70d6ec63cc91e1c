"""The strongest floor for bench_fleet: what `laggard analyze JOB --json OUT` does, called as library
functions (no CLI parsing per job), one job per pool task. Importable by pool workers; ``init``
sets a worker up as the `laggard` command sets itself up (laggard.startup: pandas hidden)."""

from __future__ import annotations


def init() -> None:
    from laggard.startup import hide_pandas

    hide_pandas()


def analyze_to_json(args: tuple[str, str]) -> None:
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job
    from laggard.report.jsonout import write_json

    write_json(analyze(load_job(args[0])), args[1])
