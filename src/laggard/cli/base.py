"""The `laggard` command: thin; parses arguments, calls the library, prints.

User mistakes (``LaggardError``, bad flags) end in one line on stderr and exit code 2;
warnings (``LaggardWarning``) are printed as one line each and the command goes on.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated

import typer
from click import exceptions as click_exc

from laggard.errors import LaggardError, LaggardWarning, check_healthy_threshold, check_output

app = typer.Typer(
    name="laggard",
    help="Find, explain and fix stragglers in distributed training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

FormatOpt = Annotated[
    str, typer.Option("--format", "-f", help="Trace format: auto, native, ndtimeline, kineto.")
]
MetaOpt = Annotated[
    Path | None, typer.Option("--meta", help="NDTimeline metadata YAML (dp/pp/tp/vpp sizes); default: meta-*.yaml beside the trace.")
]

LayoutOpt = Annotated[
    str | None, typer.Option("--layout", help="Profiler traces: the parallel layout, e.g. dp=2,pp=2[,tp=T] (outermost dimension first, as ranks are numbered); default: inferred from the traces.")
]
RankMapOpt = Annotated[
    Path | None, typer.Option("--rank-map", help="Profiler traces: a YAML/JSON file mapping each rank to {dp: D, pp: P[, tp: T]}.")
]


def _load(path: Path, fmt: str, meta: Path | None, steps: str | None = None, layout: str | None = None,
          rank_map: Path | None = None):
    from laggard.io import load_job

    return load_job(path, fmt=fmt, meta=meta, steps=steps, layout=layout, rank_map=rank_map)


@app.command()
def analyze(
    path: Annotated[list[Path], typer.Argument(help="Trace: a native directory (job.json + *.parquet), an NDTimeline parquet file, or PyTorch-profiler traces (a directory, a glob or per-rank files).")],
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the analysis as JSON to this file ('-' for stdout).")] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report to this file (and, without --perfetto, the Perfetto trace it links to beside it: NAME.perfetto.json.gz).")] = None,
    perfetto_out: Annotated[Path | None, typer.Option("--perfetto", help="Write measured and idealised timelines as Chrome/Perfetto trace JSON.")] = None,
    steps: Annotated[str | None, typer.Option("--steps", help="Analyse only these steps, e.g. '10-20,25'.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the terminal summary.")] = False,
    healthy_threshold: Annotated[float, typer.Option("--healthy-threshold", help="Call the job healthy (no findings) below this slowdown.")] = 1.05,
    layout: LayoutOpt = None,
    rank_map: RankMapOpt = None,
    skip_steps: Annotated[int | None, typer.Option("--skip-steps", help="Skip this many leading (warm-up) steps; default: detected from step-time settling (0 keeps every step).")] = None,
) -> None:
    """Replay the job with idealised durations: straggler slowdown, who causes it and why."""
    if skip_steps is not None and skip_steps < 0:
        raise LaggardError(f"--skip-steps must be >= 0 (got {skip_steps})")
    check_healthy_threshold(healthy_threshold)  # before the (slow) load
    for flag, out in (("--json", json_out), ("--html", html_out), ("--perfetto", perfetto_out)):
        check_output(out, flag)
    if html_out is not None and perfetto_out is None:
        from laggard.report.html import perfetto_beside

        check_output(perfetto_beside(html_out), "--html (the Perfetto trace beside it)")
    job = _load(path[0] if len(path) == 1 else path, fmt, meta, steps, layout, rank_map)  # type: ignore[arg-type]
    from laggard.analysis.pipeline import analyze as run_analysis  # after loading: see laggard.io.kineto.load.decode_all
    result = run_analysis(job, healthy_threshold=healthy_threshold, skip_steps=skip_steps)
    if json_out is not None:
        from laggard.report.jsonout import write_json

        write_json(result, json_out)
    if perfetto_out is not None:
        from laggard.report.perfetto import write_perfetto

        write_perfetto(result, perfetto_out)
    if html_out is not None:
        from laggard.report.html import write_report

        write_report(result, html_out, perfetto=perfetto_out)
    if not quiet and str(json_out) != "-":
        from laggard.report.terminal import print_summary

        print_summary(result)


@app.command()
def whatif(
    path: Annotated[list[Path], typer.Argument(help="Trace: a native directory, an NDTimeline parquet file, or PyTorch-profiler traces (a directory, a glob or per-rank files).")],
    fix: Annotated[list[str] | None, typer.Option("--fix", help="Idealise these ops: stage=3, dp=1, rank=17, worker=dp0:pp1, optype=forward-compute, step=12, all.")] = None,
    zero: Annotated[list[str] | None, typer.Option("--zero", help="Make these ops take no time: comm, compute, or any --fix selector.")] = None,
    scale: Annotated[list[str] | None, typer.Option("--scale", help="Scale measured durations: SELECTOR:FACTOR, e.g. stage=3:0.8.")] = None,
    peer: Annotated[list[str] | None, typer.Option("--peer", help="Set these ops to the mean of their op type on their stage over the ops no --peer names, e.g. rank=5,compute.")] = None,
    even: Annotated[list[str] | None, typer.Option("--even", help="Set these ops to the mean of their op type, stage and step (balanced microbatches), e.g. optype=forward-compute.")] = None,
    despike: Annotated[list[str] | None, typer.Option("--despike", help="Set rare stalls to what they should take: a forward pass far above its usual ratio to the backward of its microbatch gets that ratio; other ops far above the median of their rank and op type get that median. E.g. optype=forward-compute.")] = None,
    gap_share: Annotated[float | None, typer.Option("--gap-share", help="Model untraced host gaps as host ops from this share of a step on (0: every gap; default 0.02).")] = None,
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    steps: Annotated[str | None, typer.Option("--steps", help="Analyse only these steps, e.g. '10-20,25'.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the result as JSON to this file ('-' for stdout).")] = None,
    layout: LayoutOpt = None,
    rank_map: RankMapOpt = None,
) -> None:
    """Replay the job with a change of your own and print the new step time and speed-up."""
    from laggard.whatif.custom import custom_whatif, parse_changes

    changes = parse_changes(fix or [], zero or [], scale or [], peer=peer, even=even, despike=despike)
    check_output(json_out, "--json")
    from laggard.whatif.custom import gap_config

    gap_config(gap_share)  # checked before the load
    job = _load(path[0] if len(path) == 1 else path, fmt, meta, steps, layout, rank_map)  # type: ignore[arg-type]
    res = custom_whatif(job, changes, gap_share=gap_share)
    if json_out is not None:
        from laggard.report.jsonout import dump_json

        dump_json(res, json_out)
        if str(json_out) == "-":
            return
    from laggard.report.terminal import print_whatif

    print_whatif(res)


@app.command()
def convert(
    path: Annotated[Path, typer.Argument(help="Trace to convert (any format laggard reads).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the native trace (job.json + parquet) to.")],
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    layout: LayoutOpt = None,
    rank_map: RankMapOpt = None,
) -> None:
    """Convert a trace to laggard's native format (job.json + Parquet op shards)."""
    from laggard.optable.ops import write_native

    check_output(out, "--out", directory=True)
    job = _load(path, fmt, meta, None, layout, rank_map)
    write_native(job, out)
    typer.echo(f"wrote {job.num_ops} ops to {out}")


@app.command()
def synth(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the native trace and truth.json to.")],
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel size.")] = 2,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 4,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size (GPUs per worker).")] = 1,
    vpp: Annotated[int, typer.Option("--vpp", help="Virtual pipeline chunks per stage (interleaved 1F1B).")] = 1,
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", help="Microbatches per step.")] = 8,
    steps: Annotated[int, typer.Option("--steps", help="Training steps.")] = 10,
    inject: Annotated[list[str] | None, typer.Option("--inject", help="Straggler cause CAUSE[:key=value,...] (repeatable), e.g. slow-worker:rank=3,factor=2.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    jitter: Annotated[float, typer.Option("--jitter", help="Lognormal sigma of per-op duration noise.")] = 0.03,
) -> None:
    """Write a synthetic 1F1B job with known injected stragglers (native trace + truth.json)."""
    from laggard.groundtruth.inject import parse_injections
    from laggard.optable.ops import write_native
    from laggard.report.jsonout import dump_json
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

    check_output(out, "--out", directory=True)
    injections = parse_injections(inject)
    cfg = SynthConfig(dp=dp, pp=pp, tp=tp, vpp=vpp, microbatches=microbatches, steps=steps, seed=seed, jitter=jitter)
    res = synthesize_with_truth(cfg, injections)
    write_native(res.job, out)
    dump_json(res.truth, out / "truth.json")
    causes = ", ".join(i.spec() for i in injections) or "none"
    typer.echo(f"wrote {res.job.num_ops:,} ops ({dp * pp} workers, {steps} steps) to {out}; injected: {causes}")


# Command groups and commands that live beside their library code. A module listed here
# defines typer apps (mounted under a name) and/or ``register(app)`` for top-level commands.
# Keep those modules light at import: `laggard` start-up time is benchmarked.
_SUBCOMMANDS: tuple[tuple[str, str, str | None], ...] = (
    ("laggard.cli.simulate", "app", "simulate"),
    ("laggard.cli.collectives", "app", "collectives"),
    ("laggard.cli.collectives", "bench_app", "bench"),
    ("laggard.cli.mitigate", "register", None),  # outside the package: importing laggard.mitigate costs ~40 ms
    ("laggard.cli.demo", "register", None),
    ("laggard.cli.hang", "register", None),
    ("laggard.cli.fleet", "register", None),
    ("laggard.cli.dessim", "register", None),  # simpy loads inside the command
    ("laggard.cli.monitor", "app", "monitor"),
)


def _mount_subcommands() -> None:
    import importlib

    for module, attr, name in _SUBCOMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:  # a part not built yet
            if e.name is None or not module.startswith(e.name):
                raise
            continue
        obj = getattr(mod, attr, None)
        if obj is None:
            continue
        if name is None:
            obj(app)
        else:
            app.add_typer(obj, name=name)


_mount_subcommands()


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors with exit code 2, warnings as one line each."""
    command = typer.main.get_command(app)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        try:
            command.main(args=argv, prog_name="laggard", standalone_mode=False)
            code = 0
        except LaggardError as e:
            _flush_warnings(caught)
            print(f"laggard: error: {e}", file=sys.stderr)
            return 2
        except (click_exc.Exit, typer.Exit) as e:
            code = e.exit_code
        except (click_exc.Abort, typer.Abort):
            print("laggard: aborted", file=sys.stderr)
            return 130
        except click_exc.UsageError as e:
            ctx = f" (see 'laggard {e.ctx.command_path.split(' ', 1)[1]} --help')" if e.ctx and " " in e.ctx.command_path else ""
            print(f"laggard: error: {e.format_message()}{ctx}", file=sys.stderr)
            return 2
        except click_exc.ClickException as e:
            print(f"laggard: error: {e.format_message()}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            return 0
        except OSError as e:  # an output that became unwritable mid-run (disk full, removed directory)
            _flush_warnings(caught)
            where = f" {e.filename}" if e.filename else ""
            print(f"laggard: error: cannot read or write{where}: {e.strerror or e}", file=sys.stderr)
            return 2
    _flush_warnings(caught)
    return code or 0


def _flush_warnings(caught: list[warnings.WarningMessage]) -> None:
    for w in caught:
        if issubclass(w.category, LaggardWarning):
            print(f"laggard: warning: {w.message}", file=sys.stderr)


def entry() -> None:
    """Console entry point (see laggard.startup: no pandas, no OpenBLAS thread pool)."""
    from laggard.startup import lean_process

    lean_process()
    sys.exit(main())


if __name__ == "__main__":
    entry()
