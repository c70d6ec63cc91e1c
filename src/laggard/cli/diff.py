"""`laggard diff A B`: why run B's step time differs from run A's (thin: load, ``whatif.diff``, report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from laggard.cli.options import FormatOpt, load_trace
from laggard.errors import LaggardError, check_output


def diff(
    a: Annotated[Path, typer.Argument(help=(
        "Run A, the reference (e.g. last week's good run): a native directory, an "
        "NDTimeline parquet file, or a directory of PyTorch-profiler traces."))],
    b: Annotated[Path, typer.Argument(help=(
        "Run B, the one to explain (e.g. today's run), in any format laggard reads."))],
    fmt: FormatOpt = "auto",
    meta_a: Annotated[Path | None, typer.Option("--meta-a", help=(
        "NDTimeline metadata YAML of A; default: meta-*.yaml beside it."))] = None,
    meta_b: Annotated[Path | None, typer.Option("--meta-b", help=(
        "NDTimeline metadata YAML of B; default: meta-*.yaml beside it."))] = None,
    steps_a: Annotated[str | None, typer.Option("--steps-a", help=(
        "Compare only these steps of A, e.g. '10-20'."))] = None,
    steps_b: Annotated[str | None, typer.Option("--steps-b", help=(
        "Compare only these steps of B, e.g. '10-20'."))] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help=(
        "Write the comparison as JSON to this file ('-' for stdout): change, and "
        "contributions sorted by share, each with its what-if selector."))] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help=(
        "Write a self-contained HTML page of the comparison to this file."))] = None,
    max_parts: Annotated[int, typer.Option("--max-parts", help=(
        "Parts of the job named separately (1-10; 2^(n+1) replays of B); the rest is one part."))] = 7,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the terminal summary.")] = False,
    max_regression: Annotated[str | None, typer.Option(
        "--max-regression", metavar="PCT",
        help="A CI gate: exit 1 when B's step is more than PCT percent slower than A's (e.g. 5 or 5%), after the "
             "comparison is printed and written.")] = None,
) -> None:
    """Explain why B's step time differs from A's: B replayed with A's durations, part by part."""
    from laggard.whatif.diff import DiffConfig

    limit = _percent(max_regression) if max_regression is not None else None
    if not 1 <= max_parts <= 10:
        raise LaggardError(f"--max-parts must be 1 to 10 (2^(n+1) replays of B), got {max_parts}")
    cfg = DiffConfig(max_parts=max_parts)  # checked before the (slow) loads
    check_output(json_out, "--json")
    check_output(html_out, "--html")
    for side, path in (("A", a), ("B", b)):
        if not path.exists() and not any(ch in str(path) for ch in "*?["):
            raise LaggardError(f"{side}: {path}: no such file or directory")
    from laggard.cli.options import progress_callback
    from laggard.whatif.diff import diff as run_diff

    total = 2 + 4 + (html_out is not None)  # two loads, the comparison's phases, the page
    with progress_callback("loading run A", "phases", quiet=quiet) as on_progress:
        on_progress(0, total, "loading run A")
        job_a = load_trace(a, fmt, meta_a, steps_a)
        on_progress(1, total, "loading run B")
        job_b = load_trace(b, fmt, meta_b, steps_b)
        res = run_diff(job_a, job_b, cfg, on_progress=lambda done, _n, what: on_progress(2 + done, total, what))
        if html_out is not None:
            from laggard.report.diff import write_diff_html

            on_progress(total - 1, total, "writing the HTML page")
            write_diff_html(res, html_out)
    if json_out is not None:
        from laggard.report.jsonout import dump_json

        dump_json(res, json_out, flag="--json")
    if not quiet and str(json_out) != "-":
        from laggard.report.diff import print_diff

        print_diff(res)
    if limit is not None and res.change > limit:
        import sys

        print(f"laggard: regression: B's step is {100 * res.change:.1f}% slower than A's (--max-regression "
              f"{100 * limit:g}%)", file=sys.stderr)
        raise typer.Exit(1)


def _percent(text: str) -> float:
    """``5``, ``5%`` or ``2.5 %`` as a fraction (0.05); one clear line for anything else."""
    raw = text.strip().removesuffix("%").strip()
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise LaggardError(f"--max-regression: cannot read {text!r} (a percentage at least 0, e.g. 5 or 5%)")
    return value / 100.0


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)
