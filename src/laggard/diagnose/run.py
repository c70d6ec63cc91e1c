"""The diagnosis's front door: every detector's candidates, scored jointly into findings and a
verdict (``diagnose``); ``too_little`` says when a job cannot be judged."""

from __future__ import annotations

from typing import TYPE_CHECKING

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.explain import attribute, diagnosis_of, said
from laggard.diagnose.fallback import fallback
from laggard.diagnose.hidden import hidden_candidates
from laggard.diagnose.nominate import candidates
from laggard.diagnose.onestep import one_step
from laggard.diagnose.unseen import unseen
from laggard.results.diagnosis import Diagnosis

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis


def diagnose(res: Analysis, *, threshold: float | None = None, config: DiagnoseConfig | None = None) -> Diagnosis:
    """Findings for an analyzed job, strongest first; a healthy job (slowdown below ``threshold``)
    gets none. Each finding with a what-if carries the ``laggard whatif`` command that replays it on
    the job's own files (``Finding.command``)."""
    if res.base is None:
        raise ValueError("diagnose needs the Analysis of a job (with its base)")
    from laggard.whatif.custom import whatif_command

    d = _diagnose(res, threshold=threshold, config=config)
    for f in d.findings:
        if f.whatif:
            f.command = whatif_command(res.base.job.load_args, f.whatif)
    return d


def _diagnose(res: Analysis, *, threshold: float | None, config: DiagnoseConfig | None) -> Diagnosis:
    assert res.base is not None
    # the threshold in force: ``threshold``, else the config's, else HEALTHY_THRESHOLD (both given
    # and different: an error, never one silently over the other)
    cfg = (config or DiagnoseConfig()).with_threshold(threshold)
    reason = too_little(res, cfg)
    if reason:
        # too few steps (two workers or more): what each step says on its own, where it has collectives
        read = one_step(res, cfg, reason) if res.num_workers >= cfg.min_workers else None
        return read or Diagnosis(verdict="not enough to judge", threshold=cfg.threshold, findings=[], reason=reason)
    ctx = Ctx(res)
    why = cannot_judge(ctx, cfg)
    if why:
        # a graph that holds every dependency (each transfer matched) whose pooled ideal is slower than
        # the job: judged by the fixes themselves (pooling spreads one slow link's time over its peers,
        # and where those are more often critical the ideal replays slower than the job, S < 1, though
        # fixing the slow link alone still gains)
        by_fixes = why == _ideal_slower(ctx, cfg) and not _unmatched(ctx)[0]
        seen = unseen(ctx, cfg, every_cause=True) if by_fixes else None
        if seen is not None:
            return seen
        why += "; no fix replayed on the measured job gains the healthy threshold" if by_fixes else ""
        return Diagnosis(verdict="cannot judge", threshold=cfg.threshold, findings=[], reason=why)
    total = ctx.T_meas / ctx.T_ideal if ctx.T_ideal > 0 else 1.0
    if max(res.slowdown, res.replay_fidelity, total) < cfg.threshold or ctx.gap <= 0:
        # healthy by S, unless a fix S cannot see (a pure pipeline's heavy stage, an overhead on
        # every rank) speeds the job up by the threshold (``laggard.diagnose.unseen``)
        seen = unseen(ctx, cfg)
        return seen if seen is not None else Diagnosis(verdict="healthy", threshold=cfg.threshold, findings=[])
    cands = candidates(ctx, cfg)
    d = attribute(ctx, cands, cfg)
    for _ in range(cfg.hidden_passes):
        if not d.findings or not _left_straggling(ctx, cfg, d.unexplained):
            break
        found = [c for c in cands if c.finding in d.findings]
        more = hidden_candidates(ctx, cands, found, cfg, left=d.unexplained)
        if not more and not any(c.left is not None for c in cands):  # (none new, none held to the rest)
            break
        cands = cands + more
        d = attribute(ctx, cands, cfg)
    if not d.findings:  # never silent: the largest carrier of the residual, at low confidence
        extra = fallback(ctx, cfg)
        if extra is not None:
            said(ctx, [extra])
            d = diagnosis_of(ctx, cfg, [extra.finding], t_all=ctx.T - extra.finding.score * ctx.gap)
    return d


def _left_straggling(ctx: Ctx, cfg: DiagnoseConfig, unexplained: float) -> bool:
    """Whether the findings leave enough unexplained to look for causes they hide: a rest that alone
    would make the job straggle once they are fixed (its time over the ideal step at the threshold: a
    dominant cause can leave a second one that is a small share of the slowdown yet alone makes the
    job straggle once the first is fixed). A larger share of a small slowdown is not enough: once the
    found causes are fixed such a job is healthy, and what is left is mostly the ranks' noise: another
    pass, a full run of the detectors that costs much on a large job, would search it only to name
    nothing."""
    return ctx.T_ideal > 0 and 1.0 + unexplained * ctx.gap / ctx.T_ideal >= cfg.healthy_threshold


def cannot_judge(ctx: Ctx, cfg: DiagnoseConfig) -> str:
    """Why the replay cannot judge this job's slowdown (empty when it can): its dependencies are not
    modelled, so S and every attribution would be wrong, whichever way."""
    alone, num_p2p, ranks = _unmatched(ctx)
    if alone > cfg.max_unmatched_p2p * num_p2p:
        return (f"{alone} of {num_p2p} point-to-point transfers have no partner on another rank "
                f"(ranks {', '.join(map(str, ranks[:8]))}{' ...' if len(ranks) > 8 else ''}), so the "
                "pipeline's dependencies are missing from the replay; give the layout (--layout dp=D,pp=P) or "
                "trace with the Tracer, which records peers")
    return _ideal_slower(ctx, cfg) or _replay_slower(ctx, cfg)


def _unmatched(ctx: Ctx) -> tuple[int, int, list[int]]:
    """(point-to-point transfers with no partner on another rank, all of them, the ranks of the former)."""
    import numpy as np

    base = ctx.base
    p2p = ctx.kind_is("p2p_send", "p2p_recv") & (base.measured > 0)
    if not p2p.any():
        return 0, 0, []
    g = base.graph
    sizes = np.diff(g.group_ptr)
    members = np.where(g.op_group >= 0, sizes[np.maximum(g.op_group, 0)], 0)
    alone = p2p & (members < 2)
    return int(alone.sum()), int(p2p.sum()), np.unique(ctx.rank[alone]).tolist()


def _ideal_slower(ctx: Ctx, cfg: DiagnoseConfig) -> str:
    if ctx.res.slowdown >= cfg.min_judged_slowdown:
        return ""
    return (f"the replay with ideal durations is slower than with the measured ones (S = {ctx.res.slowdown:.3f} < "
            f"{cfg.min_judged_slowdown:g}): the graph lacks dependencies the job has (e.g. a layout read as "
            "independent ranks), or the pooled ideal (each op type at its mean over the ranks) is slower than this "
            "job, so its slowdown cannot be judged")


def _replay_slower(ctx: Ctx, cfg: DiagnoseConfig) -> str:
    if ctx.res.replay_fidelity >= cfg.min_judged_fidelity:
        return ""
    return (f"the replay of the measured job takes longer than the job did (replay fidelity "
            f"{ctx.res.replay_fidelity:.3f} < {cfg.min_judged_fidelity:g}): it waits where the job did not, so its "
            "what-ifs cannot be trusted")


def too_little(res: Analysis, cfg: DiagnoseConfig) -> str:
    """Why the job cannot be judged (empty when it can): straggling needs workers to compare and
    steps to compare them over."""
    if res.num_workers < cfg.min_workers:
        return (f"{res.num_workers} worker: straggling is one worker waiting for another, so a job needs at least "
                f"{cfg.min_workers} to judge")
    if len(res.steps) < cfg.min_steps:
        return f"{len(res.steps)} step(s) after warm-up: at least {cfg.min_steps} are needed to judge"
    return ""


__all__ = ["candidates", "cannot_judge", "diagnose", "too_little"]
