"""Hidden stragglers: a weaker cause behind a stronger one.

A 1.25x worker on the same stage as a 1.6x one sits within the first pass's noise: the stage's
reference and the job's slowdown are both set by the stronger cause. When what the findings leave
unexplained would alone make the job straggle once they are fixed (``run._left_straggling``), the
detectors run again on the job with the found causes fixed (their what-if changes applied, the steps
replayed), and what they nominate there that the first pass did not joins the joint attribution on
the measured job. A cause found this way is marked ``hidden``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, weights_of
from laggard.diagnose.explain import joint, replay_mean
from laggard.diagnose.findings import Candidate
from laggard.diagnose.launch import own_ranks
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


def hidden_candidates(ctx: Ctx, cands: list[Candidate], found: list[Candidate], cfg: DiagnoseConfig,
                      left: float = 1.0) -> list[Candidate]:
    """What the detectors nominate on the job with ``found`` fixed that ``cands`` do not already hold,
    with weights on the measured job (their changes are selectors, valid on both), left off the
    ranks where the fixes already change what they select (``_beside``); ``left``: the share of the
    slowdown ``found`` leaves unexplained (``Candidate.left``)."""
    fixes = [c for c in found if c.weights is not None]
    if not fixes:
        return []
    fixed = Ctx(fixed_analysis(ctx, fixes), fixed=True)
    fixed_causes = {_target(c)[:3] for c in fixes}  # (cause, ranks, stages): fixed, whatever its flags
    again = [c for c in candidates(fixed, cfg, stalled=set(own_ranks(fixes))) if _target(c)[:3] not in fixed_causes]
    straggler = _stragglers(fixed, cfg, again)
    seen = {_target(c): c for c in cands}
    touched = joint(ctx, fixes) != ctx.w
    out = []
    for c in again:
        key = _target(c)
        # a straggler of the fixed job (its fix gains the threshold there) may be held to the rest the
        # found causes leave (``explain.floor_of``); any other to the whole slowdown, as in the first pass
        relax = left if id(c) in straggler else None
        if relax is None and left <= cfg.unexplained_floor:
            continue  # (a small share of the slowdown, though enough to make the fixed job straggle: stragglers only)
        if key in seen:
            # nominated by the first pass too, but under its floor there
            if seen[key] not in found and relax is not None:
                seen[key].left, seen[key].finding.hidden = relax, True
            continue
        seen[key] = c
        c = _beside(ctx, c, touched, cfg.hidden_overlap_share)
        if c is None or seen.get(_target(c), c) is not c:
            continue  # (nothing left, or left off the fixed ranks it is a first-pass candidate again)
        c.finding.hidden = True
        c.left = relax
        # its share once the found causes are fixed is what its what-if removes on the measured job:
        # the fixed job keeps the measured job's gap statistics, which still hold the fixed causes
        c.hidden_share = 0.0
        if c.weights is not None:
            c.weights = weights_of(ctx, c.changes)
        out.append(c)
    _once_fixed(fixed, [c for c in cands + out if c.finding.hidden and c.finding.once_fixed is None])
    return out


def _once_fixed(fixed: Ctx, hidden: list[Candidate]) -> None:
    """Each hidden candidate's speed-up and share of the slowdown on the job with the found causes
    fixed (``Finding.once_fixed``), each fixed alone there: its share of the measured slowdown is mostly
    theirs (a slow link behind a large GC slowdown: a small share of the measured slowdown, yet much of
    what is left once GC is fixed)."""
    rep = [c for c in hidden if c.weights is not None]
    if not rep or fixed.gap <= 0:
        return
    t = replay_mean(fixed, [weights_of(fixed, c.changes) for c in rep])
    for c, x in zip(rep, t.tolist(), strict=True):
        if x > 0:
            c.finding.once_fixed = {"gain": fixed.T / x, "share": min(1.0, max(0.0, (fixed.T - x) / fixed.gap))}


def _stragglers(fixed: Ctx, cfg: DiagnoseConfig, cands: list[Candidate]) -> set[int]:
    """The ``id`` of each of ``cands`` (nominated on the job with the found causes fixed) whose fix gains
    the healthy threshold on that job: a straggler once the stronger causes are gone."""
    rep = [c for c in cands if c.weights is not None]
    if not rep:
        return set()
    t = replay_mean(fixed, [c.weights for c in rep])
    return {id(c) for c, x in zip(rep, t.tolist(), strict=True) if x > 0 and fixed.T / x >= cfg.healthy_threshold}


def _beside(ctx: Ctx, c: Candidate, touched: np.ndarray, max_share: float) -> Candidate | None:
    """``c``, or, when more than ``max_share`` of what its what-if removes on the measured job comes
    from ops the found fixes already change, ``c`` with each change left off the ranks of those ops
    (``rank!=R`` added to its selector); None when nothing is left. A hidden cause's what-if must not
    fix the found causes again: the overlap every rank pays, nominated once a one-rank stall is fixed,
    would otherwise zero that stall too and take its gain, naming healthy ranks for what the stall
    cost."""
    from laggard.errors import LaggardError
    from laggard.whatif.custom import Change, apply_changes, select_ops

    try:
        removed = np.maximum(ctx.w - apply_changes(ctx.base, c.changes)[0], 0.0)
    except LaggardError:
        return None
    if removed[touched].sum() <= max_share * removed.sum():
        return c
    changes = []
    for ch in c.changes:
        ranks = np.unique(ctx.rank[select_ops(ctx.base, ch.selector) & touched]).tolist()
        if not ranks:
            changes.append(ch)
            continue
        selector = ",".join([ch.selector] + [f"rank!={r}" for r in ranks])
        try:
            select_ops(ctx.base, selector)
        except LaggardError:  # all it selects is fixed already
            return None
        changes.append(Change(action=ch.action, selector=selector, factor=ch.factor))
    return dataclasses.replace(c, changes=changes)


__all__ = ["fixed_analysis", "hidden_candidates"]
