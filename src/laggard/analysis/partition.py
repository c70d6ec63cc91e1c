"""A stage-imbalance finding's fix, carried out: the `laggard partition` command for the trace and,
where the layer count is known, the speed-up of its whole-layer split (``Finding.gain_layers``).

The diagnosis scores a stage imbalance as a continuous rebalance (the stage's compute scaled to its
peers'): a bound, since layers move whole. Where the trace's metadata (or ``AnalysisConfig.num_layers``)
says how many layers the stages hold, the partition planner (``laggard.whatif.partition``) gives the
gain the command itself prints; the finding keeps its bound beside it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from laggard.errors import LaggardError, LaggardWarning

if TYPE_CHECKING:
    from laggard.optable.ops import Job
    from laggard.results.diagnosis import Finding

BOUND = "the bound of a continuous split"


def check_num_layers(job: Job, num_layers: int | None) -> None:
    """An explicit layer count fewer than the trace's stages is an error before any work."""
    stages = int(job.meta.pp_size or 1)
    if num_layers is not None and num_layers < stages:
        raise LaggardError(f"--num-layers must be >= the trace's {stages} stages, got {num_layers}")


def partition_command(job: Job, num_layers: int | None = None) -> str:
    """`laggard partition` for this trace: with the layer count given (it wins over the trace's), else
    none where the trace records it, else ``--num-layers N`` (unknown)."""
    from laggard.whatif.custom import whatif_command
    from laggard.whatif.partition import layers_known

    if num_layers is not None:
        flags = ["--num-layers", str(num_layers)]
    else:
        flags = [] if layers_known(job) else ["--num-layers", "N"]
    return whatif_command(job.load_args, flags, command="partition")


def partition_hint(job: Job, num_layers: int | None = None) -> str:
    """The fix's command in words, for a finding whose gain stays the continuous bound."""
    from laggard.whatif.partition import layers_known

    known = layers_known(job) or num_layers is not None
    return (f"`{partition_command(job, num_layers)}` proposes the split"
            + ("" if known else " (N: the model's decoder layers, which the trace does not record: e.g. "
                                 "`len(model.layers)`, or `num_hidden_layers` in a Hugging Face config)")
            + f"; this finding's gain is {BOUND}: moving whole layers gains less, and the "
            "command predicts its split's own speed-up")


def layers_plan(job: Job, num_layers: int | None) -> dict[str, Any] | None:
    """The whole-layer split `laggard partition` proposes for the trace, as data (None: the layer
    count is unknown). A layer count from the metadata the planner cannot use is a warning, not an
    error (the finding keeps its bound); one given explicitly that does not fit is an error."""
    from laggard.whatif.partition import layers_known, plan_partition

    if num_layers is None and not layers_known(job):
        return None
    try:
        plan = plan_partition(job, num_layers=num_layers)
    except LaggardError as e:
        if num_layers is not None:
            raise
        warnings.warn(f"the stage finding's gain stays {BOUND}: the partition planner could not use the "
                      f"trace's layer count ({e})", LaggardWarning, stacklevel=3)
        return None
    if plan.speedup is None:
        return None
    return {"current": plan.decoder_counts(plan.current.counts), "proposed": plan.decoder_counts(plan.proposed.counts),
            "layout": plan.proposed.layout, "T_s": plan.t_s, "T_new_s": plan.t_new_s, "speedup": plan.speedup,
            "command": partition_command(job, num_layers)}


def fill_partition(job: Job, findings: list[Finding], num_layers: int | None) -> None:
    """Each partition finding's fix command and, where the layers are known, its whole-layer gain."""
    todo = [f for f in findings if f.fix_tool == "partition"]
    plan = layers_plan(job, num_layers) if todo else None
    for f in todo:
        if plan is None:
            f.fix_command = partition_hint(job, num_layers)
            continue
        f.gain_layers = float(plan["speedup"])
        f.layers_plan = plan
        now, new = (", ".join(map(str, plan[k])) for k in ("current", "proposed"))
        f.fix_command = (f"`{plan['command']}` proposes moving whole layers: decoder layers per stage {now} now, "
                         f"{new} proposed (--pipeline-model-parallel-layout \"{plan['layout']}\"), "
                         f"{f.gain_layers:.2f}x faster; {f.gain:.2f}x is {BOUND}")


__all__ = ["BOUND", "check_num_layers", "fill_partition", "layers_plan", "partition_command", "partition_hint"]
