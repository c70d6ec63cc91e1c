"""`laggard analyze`, `whatif`, `convert` and `synth`: the pipeline's own commands (thin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from laggard.cli.options import (
    INJECT_EPILOG,
    FormatOpt,
    HealthyOpt,
    LayoutOpt,
    MetaOpt,
    RankMapOpt,
    load_trace,
)
from laggard.errors import LaggardError, check_healthy_threshold, check_output


def analyze(
    path: Annotated[list[Path], typer.Argument(help=(
        "Trace: a native directory (job.json + *.parquet), an NDTimeline parquet "
        "file, or PyTorch-profiler traces (a directory, a glob or per-rank files)."))],
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help=(
        "Write the analysis as JSON to this file ('-' for stdout)."))] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help=(
        "Write a self-contained HTML report to this file (and, without --perfetto, "
        "the Perfetto trace it links to beside it: NAME.perfetto.json.gz)."))] = None,
    perfetto_out: Annotated[Path | None, typer.Option("--perfetto", help=(
        "Write measured and idealised timelines as Chrome/Perfetto trace JSON."))] = None,
    steps: Annotated[str | None, typer.Option("--steps", help="Analyze only these steps, e.g. '10-20,25'.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the terminal summary.")] = False,
    healthy_threshold: HealthyOpt = None,
    layout: LayoutOpt = None,
    rank_map: RankMapOpt = None,
    skip_steps: Annotated[int | None, typer.Option("--skip-steps", help=(
        "Skip this many leading (warm-up) steps; default: detected "
        "from step-time settling (0 keeps every step)."))] = None,
    num_layers: Annotated[int | None, typer.Option("--num-layers", help=(
        "The model's decoder layers, where the trace does not record them: a stage-imbalance finding then "
        "shows the speed-up of `laggard partition`'s whole-layer split, beside the continuous bound."))] = None,
) -> None:
    """Replay the job with idealised durations: straggler slowdown, who causes it and why."""
    if skip_steps is not None and skip_steps < 0:
        raise LaggardError(f"--skip-steps must be >= 0 (got {skip_steps})")
    if num_layers is not None and num_layers < 1:
        raise LaggardError(f"--num-layers must be >= 1 (got {num_layers})")
    if healthy_threshold is not None:
        check_healthy_threshold(healthy_threshold)  # before the (slow) load
    for flag, out in (("--json", json_out), ("--html", html_out), ("--perfetto", perfetto_out)):
        check_output(out, flag)
    if html_out is not None and perfetto_out is None:
        from laggard.report.html import perfetto_beside

        check_output(perfetto_beside(html_out), "--html (the Perfetto trace beside it)")
    from laggard.cli.options import progress_callback

    outputs = [(flag, out) for flag, out in (("JSON", json_out), ("Perfetto trace", perfetto_out),
                                             ("HTML report", html_out)) if out is not None and str(out) != "-"]
    with progress_callback("loading the trace", "phases", quiet=quiet) as on_progress:
        total = 3 + len(outputs)  # load, what-if, diagnosis, each file written
        on_progress(0, total, "loading the trace")
        job = load_trace(path[0] if len(path) == 1 else path, fmt, meta, steps, layout, rank_map)  # type: ignore[arg-type]
        result = _run(job, healthy_threshold, skip_steps, num_layers,
                      lambda done, _n, what: on_progress(1 + done, total, what))
        for i, (what, out) in enumerate(outputs):
            on_progress(3 + i, total, f"writing the {what}")
            _write(result, what, out, perfetto_out)
    if str(json_out) == "-":
        from laggard.report.jsonout import write_json

        write_json(result, json_out)
    if not quiet and str(json_out) != "-":
        from laggard.report.terminal import print_summary

        print_summary(result)


def _run(job, healthy_threshold, skip_steps, num_layers, on_progress):  # noqa: ANN001, ANN202 - thin CLI glue
    from laggard.analysis.config import AnalysisConfig
    from laggard.analysis.pipeline import (
        analyze as run_analysis,  # after loading: see laggard.io.kineto.files.decode_all
    )

    cfg = AnalysisConfig(healthy_threshold=healthy_threshold, skip_steps=skip_steps, num_layers=num_layers)
    return run_analysis(job, config=cfg, on_progress=on_progress)


def _write(result, what: str, out: Path, perfetto_out: Path | None) -> None:  # noqa: ANN001
    """One of analyze's files: the JSON, the Perfetto trace or the HTML report."""
    if what == "JSON":
        from laggard.report.jsonout import write_json

        write_json(result, out)
    elif what == "Perfetto trace":
        from laggard.report.perfetto import write_perfetto

        write_perfetto(result, out)
    else:
        from laggard.report.html import write_report

        write_report(result, out, perfetto=perfetto_out)


def whatif(
    path: Annotated[list[Path], typer.Argument(help=(
        "Trace: a native directory, an NDTimeline parquet file, or "
        "PyTorch-profiler traces (a directory, a glob or per-rank files)."))],
    fix: Annotated[list[str] | None, typer.Option("--fix", help=(
        "Idealise these ops: stage=3, dp=1, rank=17, worker=dp0:pp1, optype=forward-compute, step=12, all."))] = None,
    zero: Annotated[list[str] | None, typer.Option("--zero", help=(
        "Make these ops take no time: comm, compute, or any --fix selector."))] = None,
    scale: Annotated[list[str] | None, typer.Option("--scale", help=(
        "Scale measured durations: SELECTOR:FACTOR, e.g. stage=3:0.8."))] = None,
    peer: Annotated[list[str] | None, typer.Option("--peer", help=(
        "Set these ops to the mean of their op type on their stage "
        "over the ops no --peer names, e.g. rank=5,compute."))] = None,
    even: Annotated[list[str] | None, typer.Option("--even", help=(
        "Set these ops to the mean of their op type, stage and step "
        "(balanced microbatches), e.g. optype=forward-compute."))] = None,
    despike: Annotated[list[str] | None, typer.Option("--despike", help=(
        "Set rare stalls to what they should take: a forward pass far above its usual ratio "
        "to the backward of its microbatch gets that ratio; other ops far above the median "
        "of their rank and op type get that median. E.g. optype=forward-compute."))] = None,
    gap_share: Annotated[float | None, typer.Option("--gap-share", help=(
        "Model untraced host gaps as host ops from this share of a step on (0: every gap; default 0.02)."))] = None,
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    steps: Annotated[str | None, typer.Option("--steps", help="Analyze only these steps, e.g. '10-20,25'.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help=(
        "Write the result as JSON to this file ('-' for stdout)."))] = None,
    layout: LayoutOpt = None,
    rank_map: RankMapOpt = None,
) -> None:
    """Replay the job with a change of your own and print the new step time and speed-up."""
    from laggard.whatif.custom import custom_whatif, parse_changes

    changes = parse_changes(fix or [], zero or [], scale or [], peer=peer, even=even, despike=despike)
    check_output(json_out, "--json")
    from laggard.whatif.custom import gap_config

    gap_config(gap_share)  # checked before the load
    job = load_trace(path[0] if len(path) == 1 else path, fmt, meta, steps, layout, rank_map)  # type: ignore[arg-type]
    res = custom_whatif(job, changes, gap_share=gap_share)
    if json_out is not None:
        from laggard.report.jsonout import dump_json

        dump_json(res, json_out)
        if str(json_out) == "-":
            return
    from laggard.report.terminal import print_whatif

    print_whatif(res)


def convert(
    path: Annotated[Path, typer.Argument(help="Trace to convert (any format laggard reads).")],
    out: Annotated[Path, typer.Option("--out", "-o", help=(
        "Directory to write the native trace (job.json + parquet) to."))],
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    layout: LayoutOpt = None,
    rank_map: RankMapOpt = None,
) -> None:
    """Convert a trace to laggard's native format (job.json + Parquet op shards)."""
    from laggard.optable.ops import write_native

    check_output(out, "--out", directory=True)
    job = load_trace(path, fmt, meta, None, layout, rank_map)
    write_native(job, out)
    typer.echo(f"wrote {job.num_ops} ops to {out}")


def synth(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the native trace and truth.json to.")],
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel size.")] = 2,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 4,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size (GPUs per worker).")] = 1,
    vpp: Annotated[int, typer.Option("--vpp", help="Virtual pipeline chunks per stage (interleaved 1F1B).")] = 1,
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", help="Microbatches per step.")] = 8,
    steps: Annotated[int, typer.Option("--steps", help="Training steps.")] = 10,
    inject: Annotated[list[str] | None, typer.Option("--inject", help=(
        "Straggler cause CAUSE[:key=value,...] (repeatable; the causes are listed below)."))] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    jitter: Annotated[float, typer.Option("--jitter", help="Lognormal sigma of per-op duration noise.")] = 0.03,
) -> None:
    """Write a synthetic 1F1B job with known injected stragglers (native trace + truth.json)."""
    from laggard.groundtruth.inject import parse_injections
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth
    from laggard.optable.ops import write_native
    from laggard.report.jsonout import dump_json

    check_output(out, "--out", directory=True)
    injections = parse_injections(inject)
    cfg = SynthConfig(dp=dp, pp=pp, tp=tp, vpp=vpp, microbatches=microbatches, steps=steps, seed=seed, jitter=jitter)
    res = synthesize_with_truth(cfg, injections)
    write_native(res.job, out)
    dump_json(res.truth, out / "truth.json")
    causes = ", ".join(i.spec() for i in injections) or "none"
    typer.echo(f"wrote {res.job.num_ops:,} ops ({dp * pp} workers, {steps} steps) to {out}; injected: {causes}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
    app.command("whatif")(whatif)
    app.command("convert")(convert)
    app.command("synth", epilog=INJECT_EPILOG)(synth)
