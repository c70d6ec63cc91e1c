"""The diagnosis's front door: every detector's candidates, scored jointly into findings and a
verdict (``diagnose``); ``too_little`` says when a job cannot be judged."""

from __future__ import annotations

from typing import TYPE_CHECKING

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.explain import attribute, diagnosis_of
from laggard.diagnose.fallback import fallback
from laggard.diagnose.hidden import hidden_candidates
from laggard.diagnose.nominate import candidates
from laggard.diagnose.unseen import unseen
from laggard.results.diagnosis import Diagnosis

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis


def diagnose(res: Analysis, *, threshold: float | None = None, config: DiagnoseConfig | None = None) -> Diagnosis:
    """Findings for an analysed job, strongest first; a healthy job (slowdown below ``threshold``)
    gets none."""
    if res.base is None:
        raise ValueError("diagnose needs the Analysis of a job (with its base)")
    # the threshold in force: ``threshold``, else the config's, else HEALTHY_THRESHOLD (both given
    # and different: an error, never one silently over the other)
    cfg = (config or DiagnoseConfig()).with_threshold(threshold)
    reason = too_little(res, cfg)
    if reason:
        return Diagnosis(verdict="not enough to judge", threshold=cfg.threshold, findings=[], reason=reason)
    ctx = Ctx(res)
    why = cannot_judge(ctx, cfg)
    if why:
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
        if not d.findings or d.unexplained <= cfg.unexplained_floor:
            break
        found = [c for c in cands if c.finding in d.findings]
        more = hidden_candidates(ctx, cands, found, cfg)
        if not more:
            break
        cands = cands + more
        d = attribute(ctx, cands, cfg)
    if not d.findings:  # never silent: the largest carrier of the residual, at low confidence
        extra = fallback(ctx, cfg)
        if extra is not None:
            d = diagnosis_of(ctx, cfg, [extra.finding], t_all=ctx.T - extra.finding.score * ctx.gap)
    return d


def cannot_judge(ctx: Ctx, cfg: DiagnoseConfig) -> str:
    """Why the replay cannot judge this job's slowdown (empty when it can): its dependencies are not
    modelled, so S and every attribution would be wrong, whichever way."""
    import numpy as np

    base, res = ctx.base, ctx.res
    p2p = ctx.kind_is("p2p_send", "p2p_recv") & (base.measured > 0)
    if p2p.any():
        g = base.graph
        sizes = np.diff(g.group_ptr)
        members = np.where(g.op_group >= 0, sizes[np.maximum(g.op_group, 0)], 0)
        alone = p2p & (members < 2)
        if alone.sum() > cfg.max_unmatched_p2p * p2p.sum():
            ranks = np.unique(ctx.rank[alone])
            return (f"{int(alone.sum())} of {int(p2p.sum())} point-to-point transfers have no partner on another rank "
                    f"(ranks {', '.join(map(str, ranks[:8].tolist()))}{' ...' if len(ranks) > 8 else ''}), so the "
                    "pipeline's dependencies are missing from the replay; give the layout (--layout dp=D,pp=P) or "
                    "trace with the Tracer, which records peers")
    if res.slowdown < cfg.min_judged_slowdown:
        return (f"the replay with ideal durations is slower than with the measured ones (S = {res.slowdown:.3f} < "
                f"{cfg.min_judged_slowdown:g}): the graph lacks dependencies the job has (e.g. a layout read as "
                "independent ranks), so its slowdown cannot be judged")
    if res.replay_fidelity < cfg.min_judged_fidelity:
        return (f"the replay of the measured job takes longer than the job did (replay fidelity "
                f"{res.replay_fidelity:.3f} < {cfg.min_judged_fidelity:g}): it waits where the job did not, so its "
                "what-ifs cannot be trusted")
    return ""


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
