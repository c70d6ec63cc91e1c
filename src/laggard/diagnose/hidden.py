"""Hidden stragglers: a weaker cause behind a stronger one.

A 1.25x worker on the same stage as a 1.6x one sits within the first pass's noise: the stage's
reference and the job's slowdown are both set by the stronger cause. When the findings leave more
than ``unexplained_floor`` of the slowdown unexplained, the detectors run again on the job with the
found causes fixed (their what-if changes applied, the steps replayed), and what they nominate there
that the first pass did not joins the joint attribution on the measured job. A cause found this way
is marked ``hidden``.
"""

from __future__ import annotations

import dataclasses

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, weights_of
from laggard.diagnose.explain import joint
from laggard.diagnose.findings import Candidate
from laggard.diagnose.nominate import candidates
from laggard.results.analysis import Analysis


def fixed_analysis(ctx: Ctx, fixes: list[Candidate]) -> Analysis:
    """The what-if analysis of the job with ``fixes`` applied: their durations replace the measured
    ones, and the replayed steps stand for its measured and wall-clock steps."""
    from laggard.engine.replay import replay_steps
    from laggard.whatif.core import _analyze

    w = joint(ctx, fixes)
    steps_s = replay_steps(ctx.base.graph, w[:, None])[:, 0]
    base = dataclasses.replace(ctx.base, measured=w, measured_step_s=steps_s, wall_step_s=steps_s)
    res = _analyze(base)
    res.extras.update(ctx.res.extras)
    return res


def _target(c: Candidate) -> tuple:
    f = c.finding
    return (f.cause, tuple(sorted(w["rank"] for w in f.workers)), tuple(sorted(f.stages)), tuple(f.whatif))


def hidden_candidates(ctx: Ctx, cands: list[Candidate], found: list[Candidate], cfg: DiagnoseConfig) -> list[Candidate]:
    """What the detectors nominate on the job with ``found`` fixed that ``cands`` do not already hold,
    with weights on the measured job (their changes are selectors, valid on both)."""
    fixes = [c for c in found if c.weights is not None]
    if not fixes:
        return []
    again = candidates(Ctx(fixed_analysis(ctx, fixes)), cfg)
    seen = {_target(c) for c in cands}
    fixed_causes = {_target(c)[:3] for c in fixes}  # (cause, ranks, stages): fixed, whatever its flags
    out = []
    for c in again:
        key = _target(c)
        if key in seen or key[:3] in fixed_causes:
            continue
        seen.add(key)
        c.finding.hidden = True
        if c.weights is not None:
            c.weights = weights_of(ctx, c.changes)
        out.append(c)
    return out


__all__ = ["fixed_analysis", "hidden_candidates"]
