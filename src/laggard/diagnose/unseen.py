"""Straggling the pooled ideal cannot see. The ideal of an op type is its mean over every rank that
runs it, and S compares the job with that ideal. Three kinds of slowdown keep S near 1 by
construction:

* **a pure pipeline** (one worker per stage): the mean over the stages keeps the pipeline's total
  work, and a pipeline's step is mostly that total, so a heavy stage or a slow rank barely moves S
  (its extra time is in the pooled mean too), while scaling it back alone still makes the step faster;
* **an overhead every rank pays** (launch delays, host time between ops on every rank alike): the
  ideal keeps it too, as the median of alike gaps.
* **work one rank does alone** (``extra-work``: an evaluation only rank 0 runs): extra ops of a type
  only it runs are at their own mean, so the ideal keeps them, and the peers' wait is no slowdown.

Such a job is judged by the fixes themselves: the detectors of these causes run, and each fix is
replayed on the measured job. One that speeds the step up by the healthy threshold or more makes the
job straggling with it, and the best of them stands for the ideal that S lacked (the diagnosis's
shares are of that gap). Where none does alone, the fixes that each gain ``min_gain`` are replayed
together: two stages that both set a pipeline's pace hide each other, fixing either leaves the other
to set it (each gains little alone, under the threshold, while the two fixed together gain what both
cost). The verdict says so in its note."""

from __future__ import annotations

from dataclasses import replace

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.explain import attribute, joint, named_gain_ok, replay_mean, score_alone
from laggard.diagnose.findings import Candidate
from laggard.diagnose.nominate import CAUSE_OF, candidates
from laggard.results.diagnosis import Diagnosis

# the causes whose slowdown the pooled ideal keeps (see the module)
PIPELINE_CAUSES = ("stage-imbalance", "worker", "data-loading")
OVERHEAD_CAUSES = ("launch-delay", "extra-work")


def unseen(ctx: Ctx, cfg: DiagnoseConfig, *, every_cause: bool = False) -> Diagnosis | None:
    """The diagnosis of a job S calls healthy when a fix S cannot see speeds it up by the healthy
    threshold (None when none does). ``every_cause``: every detector's fixes, for a job whose pooled
    ideal is slower than the job itself (S < ``min_judged_slowdown``, every dependency modelled)."""
    # the best fix stands for the ideal here: what the pooled ideal pays too is slowdown S cannot show
    ctx.ideal_by_fix = True
    causes = OVERHEAD_CAUSES + (PIPELINE_CAUSES if ctx.num_dp == 1 and ctx.num_pp > 1 else ())
    if every_cause:
        causes = tuple(CAUSE_OF.values())
    # only the detectors of these causes run (the others' nominees would be dropped here)
    cands = [c for c in candidates(ctx, cfg, causes) if c.finding.cause in causes]
    if not cands:
        return None
    gains = _gains(ctx, cands)
    keep = [c for c, g in zip(cands, gains, strict=True) if g >= cfg.healthy_threshold]
    best = max((g for c, g in zip(cands, gains, strict=True) if c in keep), default=0.0)
    together = not keep
    if together:
        keep, best = _together(ctx, cfg, cands)
    if not keep:
        ctx.ideal_by_fix = False
        return None
    # the best fix stands for the ideal: the job is at least that much slower than it could be
    ctx.T_ideal = min(ctx.T_ideal, ctx.T_meas / best)
    ctx.gap = ctx.T_meas - ctx.T_ideal
    d = attribute(ctx, keep, replace(cfg, hidden_passes=0))
    if not d.findings:
        ctx.ideal_by_fix = False
        return None
    if every_cause:
        why = "the pooled ideal (each op type at its mean over the ranks) is slower than this job"
    else:
        what = ("a pure pipeline's total work (each op type at its mean over the stages)"
                if any(f.cause in PIPELINE_CAUSES for f in d.findings)
                else "work one rank does alone (each op type at its mean over the ops that ran)"
                if any(f.cause == "extra-work" for f in d.findings) else "an overhead every rank pays alike")
        why = f"the pooled ideal keeps {what}"
    d.note = (f"S = {ctx.res.slowdown:.3f} cannot show this slowdown: {why}; the fixes below were replayed on "
              "the measured job, " + (f"together {best:.2f}x faster (none gains {cfg.healthy_threshold:g}x alone)"
                                      if together else f"the best {best:.2f}x faster"))
    return d


def _together(ctx: Ctx, cfg: DiagnoseConfig, cands: list[Candidate]) -> tuple[list[Candidate], float]:
    """The replayed fixes that each speed the measured step up by ``min_gain`` alone, and their gain
    applied together (``explain.joint``), where that reaches the healthy threshold; else ([], 0)."""
    fixes = [c for c in cands
             if c.weights is not None and c.finding.gain >= cfg.min_gain and named_gain_ok(c.finding, cfg)]
    if len(fixes) < 2:
        return [], 0.0
    t = float(replay_mean(ctx, [joint(ctx, fixes)])[0])
    gain = ctx.T / t if t > 0 else float("inf")
    return (fixes, gain) if gain >= cfg.healthy_threshold else ([], 0.0)


def _gains(ctx: Ctx, cands: list[Candidate]) -> list[float]:
    """Each candidate's speed-up alone on the measured job."""
    rep = [c for c in cands if c.weights is not None]
    if rep:
        for c, t in zip(rep, replay_mean(ctx, [c.weights for c in rep]).tolist(), strict=True):
            c.finding.gain = ctx.T / t if t > 0 else float("inf")
    for c in cands:
        if c.weights is None:
            score_alone(ctx, c)  # its gain does not depend on the gap (its score is 0 without one)
    return [c.finding.gain for c in cands]


__all__ = ["unseen"]
