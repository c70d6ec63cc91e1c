"""``laggard dessim``: simulate a job with the independent discrete-event simulator (thin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def dessim(
    out: Annotated[Path, typer.Argument(help="Output directory: native op table (job.json + Parquet) and truth.json")],
    dp: Annotated[int, typer.Option(help="Data-parallel size")] = 2,
    pp: Annotated[int, typer.Option(help="Pipeline stages")] = 4,
    vpp: Annotated[int, typer.Option(help="Virtual pipeline chunks per stage (interleaved 1F1B)")] = 1,
    microbatches: Annotated[int, typer.Option(help="Microbatches per step")] = 8,
    steps: Annotated[int, typer.Option(help="Training steps")] = 4,
    seed: Annotated[int, typer.Option(help="Random seed (the truth runs reuse it)")] = 0,
    inject: Annotated[list[str] | None, typer.Option(
        "--inject", help="Inject a cause (repeatable), as `laggard synth` and `laggard demo` spell them: "
        "slow-worker:rank=3+9,factor=1.5 | heavy-stage:stage=3,factor=1.5 | seqlen-imbalance:sigma=0.5 | "
        "gc-pauses:prob=0.05,pause_ms=50 | slow-link:src=1,dst=2,delay_ms=10 | launch-delay:ms=3")] = None,
    cause: Annotated[list[str] | None, typer.Option("--cause", hidden=True, help="The old name of --inject.")] = None,
    kineto: Annotated[bool, typer.Option("--kineto", help=(
        "Also write PyTorch-profiler JSON per rank to OUT/kineto/"))] = False,
    truth: Annotated[bool, typer.Option("--truth/--no-truth", help="Simulate again without each cause to measure the "
                                        "real speed-up of fixing it (len(causes) + 2 runs)")] = True,
) -> None:
    """Simulate a DP x PP (x vpp) 1F1B job as discrete events (SimPy) and write its traces and ground truth."""
    from laggard.errors import check_output
    from laggard.groundtruth.dessim import (
        SimConfig,
        parse_cause,
        simulate,
        simulate_with_truth,
        to_job,
        write_kineto,
    )
    from laggard.optable.ops import write_native
    from laggard.report.jsonout import dump_json

    check_output(out, "OUT", directory=True)
    if cause:
        import warnings

        from laggard.errors import LaggardWarning

        warnings.warn("dessim --cause is the old name of --inject", LaggardWarning, stacklevel=1)
    causes = [parse_cause(c) for c in [*(inject or []), *(cause or [])]]
    cfg = SimConfig(dp=dp, pp=pp, vpp=vpp, microbatches=microbatches, steps=steps, seed=seed)
    if truth:
        t = simulate_with_truth(cfg, causes)
        sim = t.sim
    else:
        sim = simulate(cfg, causes)
    job = to_job(sim)
    write_native(job, out)
    if truth:
        dump_json(t.to_json(), out / "truth.json")
    if kineto:
        write_kineto(sim, out / "kineto")
    msg = (f"wrote {job.num_ops:,} ops ({cfg.num_ranks} workers, {steps} steps, "
           f"{sim.mean_step_s * 1e3:.1f} ms/step) to {out}")
    if truth and causes:
        msg += "; fixing each cause: " + ", ".join(f"{c.cause.spec()} -> x{c.gain:.3f}" for c in t.causes)
    typer.echo(msg)


def register(app: typer.Typer) -> None:
    app.command("dessim")(dessim)
