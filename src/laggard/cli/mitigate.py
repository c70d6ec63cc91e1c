"""``laggard fit-cost`` and ``laggard partition``: thin commands over ``laggard.mitigate``.

It reads traces (``laggard.io``); the partition's measurement, split and replay are
``laggard.whatif.partition`` (the analysis shows them too). Imports sit inside the commands so ``laggard``
starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from laggard.errors import LaggardError

if TYPE_CHECKING:
    import numpy as np

    from laggard.optable.ops import Job
    from laggard.whatif.partition import PartitionPlan

TraceArg = Annotated[Path, typer.Argument(help=(
    "Trace: a native directory (job.json + *.parquet) or an NDTimeline parquet file."))]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="Trace format: auto, native, ndtimeline.")]
MetaOpt = Annotated[Path | None, typer.Option("--meta", help=(
    "NDTimeline metadata YAML; default: meta-*.yaml beside the trace."))]
StepsOpt = Annotated[str | None, typer.Option("--steps", help="Use only these steps, e.g. '10-20,25'.")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the result as JSON to this file ('-' for stdout).")]


def _load(path: Path, fmt: str, meta: Path | None, steps: str | None) -> Job:
    from laggard.cli.options import load_trace

    return load_trace(path, fmt, meta, steps)


def _dump(obj: Any, out: Path | None) -> bool:
    """Write JSON if asked; True when it went to stdout (then nothing else is printed)."""
    if out is None:
        return False
    from laggard.report.jsonout import dump_json

    dump_json(obj, out)
    return str(out) == "-"


# ------------------------------------------------------------------ fit-cost


def token_samples(job: Job, optypes: list[str] | None = None, stage: int | None = None
                  ) -> dict[str, tuple[list[np.ndarray], np.ndarray, bool]]:
    """Samples for ``fit_cost`` from compute ops that carry token metadata, per op type and per
    microbatch (all compute ops of one (rank, step, microbatch, chunk) summed): name -> (sequence
    lengths per sample, duration in seconds, whether the lengths are real sequence lengths)."""
    import numpy as np

    from laggard.optable.ops import valid_mask

    t = job.table
    name_code, names = job.codes("name")
    from laggard.whatif.partition import compute_ops

    compute = compute_ops(job)
    has_lens = valid_mask(t.column("seq_lens"))
    has_tok = valid_mask(t.column("num_tokens"))
    sel = compute & (has_lens | has_tok)
    if stage is not None:
        sel &= job.column("pp_rank") == stage
    if optypes:
        unknown = [o for o in optypes if o not in names]
        if unknown:
            raise LaggardError(f"--optype {unknown[0]!r}: no such op type in the trace")
        sel &= np.isin(name_code, [names.index(o) for o in optypes])
    rows = np.flatnonzero(sel)
    if len(rows) == 0:
        where = f" on stage {stage}" if stage is not None else ""
        raise LaggardError(f"no compute op{where} carries token metadata (num_tokens / seq_lens); fit-cost needs "
                           "a trace recorded with the sequence lengths of every microbatch")
    lens_col = t.column("seq_lens").take(rows).to_pylist()
    tok_col = t.column("num_tokens").take(rows).to_pylist()
    real = has_lens[rows]
    lens = [np.asarray(x, dtype=np.int64) if r else np.asarray([tok], dtype=np.int64)
            for x, tok, r in zip(lens_col, tok_col, real, strict=True)]
    dur_s = job.column("dur_ns")[rows] * 1e-9
    out: dict[str, tuple[list[np.ndarray], np.ndarray, bool]] = {}
    nc = name_code[rows]
    for c in np.unique(nc).tolist():
        m = np.flatnonzero(nc == c)
        out[names[c]] = ([lens[i] for i in m.tolist()], dur_s[m], bool(real[m].all()))
    # per microbatch: every compute op of one microbatch on one rank together
    key = np.stack([job.column(k)[rows].astype(np.int64) for k in ("rank", "step", "microbatch", "vchunk")], axis=1)
    mb = key[:, 2] >= 0
    if mb.any() and len(out) > 1:
        uniq, inv = np.unique(key[mb], axis=0, return_inverse=True)
        inv = inv.ravel()
        first = np.full(len(uniq), -1)
        idx_mb = np.flatnonzero(mb)
        first[inv[::-1]] = idx_mb[::-1]
        tot = np.bincount(inv, weights=dur_s[mb], minlength=len(uniq))
        out["microbatch (all compute ops)"] = ([lens[i] for i in first.tolist()], tot, bool(real[mb].all()))
    return out


def fit_cost_cmd(
    path: TraceArg,
    optype: Annotated[list[str] | None, typer.Option("--optype", help=(
        "Fit only these op types (repeatable); default: every compute op type with token metadata."))] = None,
    stage: Annotated[int | None, typer.Option("--stage", help=(
        "Use only ops of this pipeline stage (stages hold different layers)."))] = None,
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    steps: StepsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Fit the microbatch cost model c = a*sum(d^2) + b*sum(d) + c0 (seconds) from token metadata in a trace."""
    from laggard.errors import LaggardWarning
    from laggard.mitigate.cost import fit_cost

    job = _load(path, fmt, meta, steps)
    try:
        samples = token_samples(job, optype, stage)
    except LaggardError as e:  # (the file the user gave: the samples' errors cannot name it)
        raise LaggardError(f"{path}: {e}") from None
    fits: dict[str, Any] = {}
    for name, (lens, dur_s, real) in samples.items():
        if len(dur_s) < (3 if real else 2):
            continue
        if not real:
            import warnings

            warnings.warn(f"{name}: ops carry num_tokens but no seq_lens; fitted b and c0 only (a = 0)",
                          LaggardWarning, stacklevel=1)
        fits[name] = fit = fit_cost(lens, dur_s, quadratic=real)
        if not fit.reliable:
            import warnings

            from laggard.mitigate.cost import MIN_USEFUL_R2

            warnings.warn(f"{name}: R^2 = {fit.r2:.4g} (< {MIN_USEFUL_R2:g}): sequence lengths explain little of how "
                          "its "
                          "durations vary; do not plan a balance on this fit", LaggardWarning, stacklevel=1)
    if not fits:
        raise LaggardError(f"{path}: too few ops with token metadata to fit three coefficients")
    result = {"unit": "s", "trace": str(path), "fits": {k: v.to_json() for k, v in fits.items()}}
    if _dump(result, json_out):
        return
    typer.echo("cost model c = a*sum(d^2) + b*sum(d) + c0 (d: sequence lengths in tokens, c in seconds)")
    width = max(len(k) for k in fits)
    typer.echo(f"{'ops':<{width}}  {'a (s/tok^2)':>12}  {'b (s/tok)':>12}  {'c0 (s)':>12}  {'R^2':>7}  {'n':>7}")
    for k, f in fits.items():
        m = f.model
        typer.echo(f"{k:<{width}}  {m.a:12.4g}  {m.b:12.4g}  {m.c0:12.4g}  {f.r2:7.4f}  {f.num_samples:7d}")


# ------------------------------------------------------------------ partition


def partition_cmd(
    path: TraceArg,
    stages: Annotated[int | None, typer.Option("--stages", "-p", help=(
        "Pipeline stages to split into (default: the trace's)."))] = None,
    num_layers: Annotated[int | None, typer.Option("--num-layers", help=(
        "Decoder layers of the model, split evenly in the trace (default: job metadata 'num_layers')."))] = None,
    layers_per_stage: Annotated[str | None, typer.Option("--layers-per-stage", help=(
        "Decoder layers per stage in the trace, e.g. 8,8,8,6 (instead of --num-layers)."))] = None,
    no_embedding: Annotated[bool, typer.Option("--no-embedding", help=(
        "The first stage has no embedding layer of its own."))] = False,
    no_loss: Annotated[bool, typer.Option("--no-loss", help=(
        "The last stage has no output/loss layer of its own."))] = False,
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    steps: StepsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Propose a cost-aware pipeline split (exact min-max) and predict its step time with a what-if replay."""
    from laggard.whatif.partition import plan_partition

    job = _load(path, fmt, meta, steps)
    plan = plan_partition(job, stages=stages, num_layers=num_layers, per_stage=layers_per_stage,
                          embedding=not no_embedding, loss=not no_loss, what=str(path))
    result = plan.to_json(str(path))
    if _dump(result, json_out):
        return
    _print_partition(path, plan, result["whatif"])


def _print_partition(path: Any, plan: PartitionPlan, whatif: dict[str, Any] | None) -> None:
    for w in plan.slow_workers:
        who = f"rank {w['rank']} (dp{w['dp_rank']})" if w["rank"] is not None else f"dp rank {w['dp_rank']}"
        typer.echo(f"note: stage {w['stage']} is slow because of one worker, not its layers: {who} computes "
                   f"{w['ratio']:.2f}x its stage's other replicas. Moving layers will not fix it; fix the worker "
                   f"(`laggard whatif {path} --peer rank={w['rank']},kind=compute`). Stages are sized by their "
                   "median replica below.")
    costs = plan.costs
    typer.echo(f"measured compute per step and stage (ms): {', '.join(f'{x * 1e3:.2f}' for x in plan.measured)}")
    typer.echo(f"layer costs (ms): decoder {costs[1 if plan.embedding else 0] * 1e3:.3f}"
               + (f", embedding {costs[0] * 1e3:.3f}" if plan.embedding else "")
               + (f", output+loss {costs[-1] * 1e3:.3f}" if plan.loss else ""))
    # decoder layers, as the layout string counts them (embedding and output+loss said apart)
    extra = [e for e, on in (("embedding on the first stage", plan.embedding),
                             ("output+loss on the last", plan.loss)) if on]
    typer.echo("decoder layers per stage" + (f" (plus the {' and the '.join(extra)})" if extra else "") + ":")
    current, proposed = plan.current, plan.proposed
    typer.echo(f"current:  {plan.decoder_counts(current.counts)}  layout {current.layout!r}  "
               f"bottleneck {current.max_cost * 1e3:.2f} ms")
    typer.echo(f"proposed: {plan.decoder_counts(proposed.counts)}  layout {proposed.layout!r}  "
               f"bottleneck {proposed.max_cost * 1e3:.2f} ms  (split points {proposed.split_points})")
    typer.echo(f"  --pipeline-model-parallel-layout \"{proposed.layout}\"")
    w = whatif
    if w is not None:
        typer.echo(f"predicted step time (what-if replay, each stage's compute scaled): {w['T_s'] * 1e3:.2f} ms -> "
                   f"{w['T_new_s'] * 1e3:.2f} ms, speed-up {w['speedup']:.3f}x")
    else:
        typer.echo(f"{len(proposed.counts)} stages differ from the trace's {len(current.counts)}: no replay; the "
                   f"bottleneck stage gets {plan.model_speedup:.3f}x cheaper in the cost model")


def register(app: typer.Typer) -> None:
    """Add ``fit-cost`` and ``partition`` to the ``laggard`` command."""
    app.command("fit-cost")(fit_cost_cmd)
    app.command("partition")(partition_cmd)


__all__ = ["register", "token_samples"]
