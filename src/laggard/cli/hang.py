"""``laggard hang PATH...``: the verdict on Flight Recorder dumps, printed and optionally as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def _print(rep) -> None:  # noqa: ANN001 - a HangReport
    who = f" rank(s) {rep.culprit_ranks}" if rep.culprit_ranks else ""
    where = ""
    if rep.group is not None:
        where = f" at {rep.op} seq {rep.seq} of group {rep.group} (ranks {rep.group_ranks})"
    typer.echo(f"verdict: {rep.verdict}{who}{where}")
    typer.echo(f"dumps from {len(rep.ranks_with_dumps)} of {rep.world_size} ranks"
               + (f"; missing: {rep.missing_ranks}" if rep.missing_ranks else ""))
    for line in rep.evidence:
        typer.echo(f"  - {line}")
    for line in rep.undecided:
        typer.echo(f"  ? {line}")
    for line in rep.notes:
        typer.echo(f"  note: {line}")


def hang(
    path: Annotated[list[Path], typer.Argument(help=(
        "Flight Recorder dumps (pickle or JSON, any names) and/or "
        "directories holding them and laggard tracer state files."))],
    json_out: Annotated[Path | None, typer.Option("--json", help=(
        "Write the verdict as JSON to this file ('-' for stdout)."))] = None,
) -> None:
    """Hangs and desyncs from Flight Recorder dumps: who never arrived, where, and why (exit 0 whatever the verdict)."""
    from laggard.hang import analyze_hang

    rep = analyze_hang(path)
    if json_out is not None:
        from laggard.report.jsonout import dump_json

        dump_json(rep.to_json(), json_out)
        if str(json_out) == "-":
            return
    _print(rep)


def register(app: typer.Typer) -> None:
    app.command(name="hang")(hang)
