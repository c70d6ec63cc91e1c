"""Why a fix can gain more than the job's slowdown S.

S = T / T_ideal: the replayed step with measured durations over the replay with every op at its
pooled ideal (its op type's mean over every rank; transfers and host time at their median). A fix's
gain is T / T_fixed, the same replayed step over the step with only its cause fixed, so a gain above
S means that the fixed job replays faster than the all-ideal one. Replaying the fix's changes on the
ideal durations tells the two reasons apart:

* the fix removes time the ideal pays too (host time or garbage collections every rank has, zeroed;
  a stage scaled below its ops' pooled ideal): the ideal step gets shorter as well;
* the ideal holds the cause: each op type's ideal is its mean over every rank, the slow ops
  included, so the ranks the fix leaves as measured already run below it, and a fix that sets the
  slow ops to their healthy peers' level beats it.

A fix scored on its own job model (the launch overhead on many small gaps: every untraced gap as
host time, ``explain.score_alone``) is measured on the wall-clock step, from which S's replay of the
traced ops leaves the smaller gaps out; of what it removes, host time every rank has is paid by the
ideal too.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from laggard.diagnose.context import Ctx
from laggard.diagnose.findings import Candidate
from laggard.engine.replay import replay_steps
from laggard.errors import LaggardError

# a gain within this of S is S (the replays' rounding): no line
_TOL = 1e-3


def ideal_paid(ctx: Ctx, changes: list) -> float:
    """How much ``changes`` take off the all-ideal step, in seconds: the time of the job's ideal that
    the fix removes too. 0 where they select nothing of the job's model."""
    from laggard.whatif.custom import apply_changes

    ideal = dataclasses.replace(ctx.base, measured=ctx.base.ideal)
    try:
        w, _ = apply_changes(ideal, changes)
    except LaggardError:
        return 0.0
    t = float(replay_steps(ctx.base.graph, w[:, None]).mean())
    return max(ctx.res.T_ideal_s - t, 0.0)


def beyond_s(ctx: Ctx, cand: Candidate) -> str:
    """One line on why ``cand``'s fix gains more than S (see the module); empty where it does not."""
    f, S = cand.finding, ctx.res.slowdown
    if not np.isfinite(f.gain) or f.gain <= S * (1.0 + _TOL):
        return ""
    head = f"its {f.gain:.2f}x is more than S = {S:.3f}"
    paid = ideal_paid(ctx, cand.changes)
    if cand.weights is None:
        return head + ": " + _own_model(ctx, cand, paid)
    t, t_ideal = ctx.res.T_s / f.gain, ctx.res.T_ideal_s
    if paid >= 0.5 * max(t_ideal - t, 0.0) and paid > 0:
        return (f"{head}: the fix also takes {_ms(paid)} a step off the all-ideal job S compares with: it removes time "
                "the pooled ideal pays too (each op type at its typical value on every rank)")
    return (f"{head}: fixed, the step replays in {_ms(t)}, under the {_ms(t_ideal)} of the all-ideal step S "
            "compares with: each op type's ideal is its mean over every rank, this cause's slow ops included, so "
            "the ops the fix leaves as measured already run below it")


def _own_model(ctx: Ctx, cand: Candidate, paid: float) -> str:
    """The reason for a fix scored on its own job model (every untraced gap as host time)."""
    parts = []
    if cand.step_s > ctx.res.T_s * (1.0 + 0.01):
        parts.append(f"it is measured on the wall-clock step with every untraced gap as host time "
                     f"({_ms(cand.step_s)}), which S's replay of the traced ops ({_ms(ctx.res.T_s)}) "
                     "leaves the smaller gaps out of")
    if paid > 0:
        parts.append(f"of the {_ms(cand.removed_s)} a step it removes, {_ms(min(paid, cand.removed_s))} is host time "
                     "every rank has, which the pooled ideal pays too (so S cannot count it)")
    if not parts:
        parts.append("it removes host time every rank has, which the pooled ideal keeps too")
    return "; ".join(parts)


def _ms(s: float) -> str:
    return f"{1e3 * s:.1f} ms"


__all__ = ["beyond_s", "ideal_paid"]
