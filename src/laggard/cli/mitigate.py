"""``laggard fit-cost`` and ``laggard partition``: thin commands over ``laggard.mitigate``.

This is the one module of the package that reads traces (``laggard.io``) and replays what-ifs
(``laggard.whatif.core``); it imports them inside the commands so ``laggard`` starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import numpy as np

    from laggard.optable.ops import Job

TraceArg = Annotated[Path, typer.Argument(help="Trace: a native directory (job.json + *.parquet) or an NDTimeline parquet file.")]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="Trace format: auto, native, ndtimeline.")]
MetaOpt = Annotated[Path | None, typer.Option("--meta", help="NDTimeline metadata YAML; default: meta-*.yaml beside the trace.")]
StepsOpt = Annotated[str | None, typer.Option("--steps", help="Use only these steps, e.g. '10-20,25'.")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the result as JSON to this file ('-' for stdout).")]


def _load(path: Path, fmt: str, meta: Path | None, steps: str | None) -> Job:
    from laggard.io import load_job

    return load_job(path, fmt=fmt, meta=meta, steps=steps)


def _dump(obj: Any, out: Path | None) -> bool:
    """Write JSON if asked; True when it went to stdout (then nothing else is printed)."""
    if out is None:
        return False
    from laggard.report.jsonout import dump_json

    dump_json(obj, out)
    return str(out) == "-"


def _compute_ops(job: Job) -> np.ndarray:
    """Mask of the ops of kind compute (all False when the trace has none)."""
    kind_code, kinds = job.codes("kind")
    return kind_code == (kinds.index("compute") if "compute" in kinds else -2)


# ------------------------------------------------------------------ fit-cost


def token_samples(job: Job, optypes: list[str] | None = None, stage: int | None = None
                  ) -> dict[str, tuple[list[np.ndarray], np.ndarray, bool]]:
    """Samples for ``fit_cost`` from compute ops that carry token metadata, per op type and per
    microbatch (all compute ops of one (rank, step, microbatch, chunk) summed): name -> (sequence
    lengths per sample, duration in seconds, whether the lengths are real sequence lengths)."""
    import numpy as np

    from laggard.optable.ops import LaggardError, valid_mask

    t = job.table
    name_code, names = job.codes("name")
    compute = _compute_ops(job)
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
    optype: Annotated[list[str] | None, typer.Option("--optype", help="Fit only these op types (repeatable); default: every compute op type with token metadata.")] = None,
    stage: Annotated[int | None, typer.Option("--stage", help="Use only ops of this pipeline stage (stages hold different layers).")] = None,
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    steps: StepsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Fit the microbatch cost model c = a*sum(d^2) + b*sum(d) + c0 (seconds) from token metadata in a trace."""
    from laggard.mitigate.cost import fit_cost
    from laggard.optable.ops import LaggardWarning

    job = _load(path, fmt, meta, steps)
    samples = token_samples(job, optype, stage)
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

            warnings.warn(f"{name}: R^2 = {fit.r2:.4g} (< {MIN_USEFUL_R2:g}): sequence lengths explain little of how its "
                          "durations vary; do not plan a balance on this fit", LaggardWarning, stacklevel=1)
    if not fits:
        from laggard.optable.ops import LaggardError

        raise LaggardError("too few ops with token metadata to fit three coefficients")
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


def stage_compute_s(job: Job) -> np.ndarray:
    """Mean per-step compute time of each pipeline stage (ops of kind compute with a microbatch)."""
    total, count = _stage_dp_compute(job)
    return total.sum(axis=1) / count.sum(axis=1)


def stage_replicas_s(job: Job) -> np.ndarray:
    """Per-step compute time of each (stage, DP replica); NaN where a replica has none."""
    import numpy as np

    total, count = _stage_dp_compute(job)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _stage_dp_compute(job: Job) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    from laggard.optable.ops import LaggardError

    sel = _compute_ops(job) & (job.column("microbatch") >= 0)
    if not sel.any():
        raise LaggardError("the trace has no per-microbatch compute ops; cannot measure stage costs")
    pp = job.column("pp_rank")[sel].astype(np.int64)
    num_stages = int(pp.max()) + 1
    dur = job.column("dur_ns")[sel] * 1e-9
    inst = np.stack([job.column("step")[sel].astype(np.int64), job.column("dp_rank")[sel].astype(np.int64),
                     job.column("tp_rank")[sel].astype(np.int64), pp], axis=1)
    uniq, inv = np.unique(inst, axis=0, return_inverse=True)
    per_inst = np.bincount(inv.ravel(), weights=dur, minlength=len(uniq))
    num_dp = int(uniq[:, 1].max()) + 1
    cell = uniq[:, 3] * num_dp + uniq[:, 1]
    total = np.bincount(cell, weights=per_inst, minlength=num_stages * num_dp).reshape(num_stages, num_dp)
    count = np.bincount(cell, minlength=num_stages * num_dp).reshape(num_stages, num_dp)
    if (count.sum(axis=1) == 0).any():
        raise LaggardError(f"stage(s) {np.flatnonzero(count.sum(axis=1) == 0).tolist()} have no compute ops")
    return total, count


# a replica computing 1.25x its stage's other replicas is a slow worker (DiagnoseConfig.worker_ratio)
SLOW_REPLICA_RATIO = 1.25


def slow_replicas(job: Job) -> list[dict[str, Any]]:
    """Stages slow because of one DP replica (one worker), not their layers: the replica computes
    ``SLOW_REPLICA_RATIO`` x the median of its stage's other replicas."""
    import numpy as np

    rep = stage_replicas_s(job)
    out: list[dict[str, Any]] = []
    if rep.shape[1] < 2:
        return out
    ranks = {(int(s), int(d)): int(r) for s, d, r in zip(job.column("pp_rank"), job.column("dp_rank"), job.column("rank"), strict=True)} \
        if job.num_ops < 2_000_000 else {}
    for s in range(rep.shape[0]):
        row = rep[s]
        for d in np.flatnonzero(np.isfinite(row)):
            others = np.delete(row, d)
            ref = float(np.nanmedian(others)) if np.isfinite(others).any() else 0.0
            if ref > 0 and row[d] >= SLOW_REPLICA_RATIO * ref:
                out.append({"stage": s, "dp_rank": int(d), "rank": ranks.get((s, int(d))), "ratio": float(row[d] / ref)})
    return out


def _parse_counts(spec: str) -> list[int]:
    from laggard.optable.ops import LaggardError

    try:
        out = [int(x) for x in spec.replace(" ", "").split(",") if x]
    except ValueError:
        raise LaggardError(f"--layers-per-stage {spec!r}: expected comma-separated integers, e.g. 8,8,8,6") from None
    if not out or min(out) < 1:
        raise LaggardError(f"--layers-per-stage {spec!r}: every stage needs at least one layer")
    return out


def replay_scaled(job: Job, factors: np.ndarray) -> tuple[float, float]:
    """Measured and what-if mean step time (s) when each stage's per-microbatch compute is scaled."""
    import numpy as np

    from laggard.engine.baseline import prepare
    from laggard.engine.replay import replay_steps

    base = prepare(job)
    sel = _compute_ops(base.job) & (base.job.column("microbatch") >= 0)
    f = np.ones(len(base.measured))
    f[sel] = factors[base.pp_rank[sel]]
    st = replay_steps(base.graph, np.stack([base.measured, base.measured * f], axis=1))
    t_old, t_new = (float(x) for x in st.mean(axis=0))
    return t_old, t_new


def partition_cmd(
    path: TraceArg,
    stages: Annotated[int | None, typer.Option("--stages", "-p", help="Pipeline stages to split into (default: the trace's).")] = None,
    num_layers: Annotated[int | None, typer.Option("--num-layers", help="Decoder layers of the model, split evenly in the trace (default: job metadata 'num_layers').")] = None,
    layers_per_stage: Annotated[str | None, typer.Option("--layers-per-stage", help="Decoder layers per stage in the trace, e.g. 8,8,8,6 (instead of --num-layers).")] = None,
    no_embedding: Annotated[bool, typer.Option("--no-embedding", help="The first stage has no embedding layer of its own.")] = False,
    no_loss: Annotated[bool, typer.Option("--no-loss", help="The last stage has no output/loss layer of its own.")] = False,
    fmt: FormatOpt = "auto",
    meta: MetaOpt = None,
    steps: StepsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Propose a cost-aware pipeline split (exact min-max) and predict its step time with a what-if replay."""
    import numpy as np

    from laggard.mitigate.partition import describe_split, layer_costs_from_stages, split_stages

    job = _load(path, fmt, meta, steps)
    measured = stage_compute_s(job)
    slow = slow_replicas(job)
    if slow:  # a slow worker is not its layers: size each stage by its typical replica
        measured = np.nanmedian(stage_replicas_s(job), axis=1)
    p_old = len(measured)
    per_stage = _layers_per_stage(job, path, p_old, num_layers, layers_per_stage)
    p_new = p_old if stages is None else stages
    costs, kinds = layer_costs_from_stages(measured, per_stage, embedding=not no_embedding, loss=not no_loss)
    old_counts = list(per_stage)
    if not no_embedding:
        old_counts[0] += 1
    if not no_loss:
        old_counts[-1] += 1
    current = describe_split(costs, old_counts, layer_kinds=kinds)
    proposed = split_stages(costs, p_new, layer_kinds=kinds)
    model_speedup = current.max_cost / proposed.max_cost if proposed.max_cost > 0 else float("inf")
    result: dict[str, Any] = {
        "trace": str(path), "measured_stage_compute_s": measured.tolist(), "layer_costs_s": costs.tolist(),
        "layer_kinds": kinds, "current": current.to_json(), "proposed": proposed.to_json(),
        "model_bottleneck_speedup": model_speedup, "whatif": None, "slow_workers": slow,
    }
    if p_new == p_old:
        factors = np.divide(proposed.stage_costs, current.stage_costs, out=np.ones(p_old),
                            where=current.stage_costs > 0)
        t_old, t_new = replay_scaled(job, factors)
        result["whatif"] = {"stage_compute_factors": factors.tolist(), "T_s": t_old, "T_new_s": t_new,
                            "speedup": t_old / t_new if t_new > 0 else None,
                            "changes": [f"scale stage={s} compute x{f:.4g}" for s, f in enumerate(factors)]}
    if _dump(result, json_out):
        return
    _print_partition(path, slow=slow, measured=measured, costs=costs, current=current, proposed=proposed,
                     whatif=result["whatif"], model_speedup=model_speedup, no_embedding=no_embedding, no_loss=no_loss,
                     p_old=p_old, p_new=p_new)


def _layers_per_stage(job: Any, path: Any, p_old: int, num_layers: int | None, layers_per_stage: str | None) -> list[int]:
    """The decoder layers each stage of the trace holds: given, from the job's metadata, or an even
    split of the model's layers; asks for exactly what it lacks."""
    from laggard.mitigate.partition import even_counts
    from laggard.optable.ops import LaggardError

    if layers_per_stage is None and num_layers is None and job.meta.extra.get("layers_per_stage"):
        layers_per_stage = ",".join(str(x) for x in job.meta.extra["layers_per_stage"])
    if layers_per_stage is not None:
        per_stage = _parse_counts(layers_per_stage)
        if len(per_stage) != p_old:
            raise LaggardError(f"--layers-per-stage gives {len(per_stage)} stages; the trace has {p_old}")
        return per_stage
    n = num_layers if num_layers is not None else job.meta.extra.get("num_layers")
    if n is None:
        raise LaggardError(f"{path}: the trace does not record how many layers the model has (job metadata "
                           "num_layers or layers_per_stage): give --num-layers N (the model's decoder layers) "
                           "or --layers-per-stage A,B,... (the layers each stage holds now)")
    if not isinstance(n, int) or n < p_old:
        raise LaggardError(f"--num-layers must be an integer >= the trace's {p_old} stages, got {n!r}")
    return even_counts(n, p_old)


def _print_partition(path: Any, *, slow: list[dict[str, Any]], measured: Any, costs: Any, current: Any, proposed: Any,
                     whatif: dict[str, Any] | None, model_speedup: float, no_embedding: bool, no_loss: bool,
                     p_old: int, p_new: int) -> None:
    for w in slow:
        who = f"rank {w['rank']} (dp{w['dp_rank']})" if w["rank"] is not None else f"dp rank {w['dp_rank']}"
        typer.echo(f"note: stage {w['stage']} is slow because of one worker, not its layers: {who} computes "
                   f"{w['ratio']:.2f}x its stage's other replicas. Moving layers will not fix it; fix the worker "
                   f"(`laggard whatif {path} --peer rank={w['rank']},kind=compute`). Stages are sized by their "
                   "median replica below.")
    typer.echo(f"measured compute per step and stage (ms): {', '.join(f'{x * 1e3:.2f}' for x in measured)}")
    typer.echo(f"layer costs (ms): decoder {costs[1 if not no_embedding else 0] * 1e3:.3f}"
               + (f", embedding {costs[0] * 1e3:.3f}" if not no_embedding else "")
               + (f", output+loss {costs[-1] * 1e3:.3f}" if not no_loss else ""))
    # decoder layers, as the layout string counts them (embedding and output+loss said apart)
    extra = [e for e, on in (("embedding on the first stage", not no_embedding),
                             ("output+loss on the last", not no_loss)) if on]
    typer.echo("decoder layers per stage" + (f" (plus the {' and the '.join(extra)})" if extra else "") + ":")

    def decoder(counts: list[int]) -> list[int]:
        out = list(counts)
        out[0] -= 0 if no_embedding else 1
        out[-1] -= 0 if no_loss else 1
        return out

    typer.echo(f"current:  {decoder(current.counts)}  layout {current.layout!r}  "
               f"bottleneck {current.max_cost * 1e3:.2f} ms")
    typer.echo(f"proposed: {decoder(proposed.counts)}  layout {proposed.layout!r}  "
               f"bottleneck {proposed.max_cost * 1e3:.2f} ms  (split points {proposed.split_points})")
    typer.echo(f"  --pipeline-model-parallel-layout \"{proposed.layout}\"")
    w = whatif
    if w is not None:
        typer.echo(f"predicted step time (what-if replay, each stage's compute scaled): {w['T_s'] * 1e3:.2f} ms -> "
                   f"{w['T_new_s'] * 1e3:.2f} ms, speed-up {w['speedup']:.3f}x")
    else:
        typer.echo(f"{p_new} stages differ from the trace's {p_old}: no replay; the bottleneck stage gets "
                   f"{model_speedup:.3f}x cheaper in the cost model")


def register(app: typer.Typer) -> None:
    """Add ``fit-cost`` and ``partition`` to the ``laggard`` command."""
    app.command("fit-cost")(fit_cost_cmd)
    app.command("partition")(partition_cmd)


__all__ = ["register", "stage_compute_s", "token_samples"]
