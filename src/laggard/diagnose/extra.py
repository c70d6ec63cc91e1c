"""``extra-work``: work one rank does that its peers do not (``if rank == 0: evaluate()``, an uneven
validation split, a metric's extra forward on one rank).

The pooled ideal cannot see it: an op type's ideal is its mean over the ops that ran, so extra ops
of a type only one rank runs (its no-grad forwards) are at their own ideal, and S reads the peers'
wait at the next collective as no slowdown. The signature is a count, not a speed: per (rank, step)
and compute op type, more ops than every stage peer ran in that step (a slow rank runs as many
ops as its peers, only longer: ``worker``'s). The rank's seconds of such ops over its peers' median
in that step, as a ratio of the ideal step (1 + excess / ideal step), is judged against the other
ranks' like ratio by the noise gate, bursts allowed (an evaluation every N steps is one). The
what-if scales the rank's ops of those types to its peers' total (to none where they run none);
the fix is to share the work out or move it off the training loop."""

from __future__ import annotations

import numpy as np

from laggard.diagnose import noise
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, step_peer_median, weights_of
from laggard.diagnose.findings import Candidate
from laggard.results.diagnosis import Finding
from laggard.whatif.custom import Change


def detect(ctx: Ctx, cfg: DiagnoseConfig) -> list[Candidate]:
    if len(ctx.ranks) < 2 or not len(ctx.w):
        return []
    # a stage's ranks run one program; different stages run different ones (a pipeline stage's forward
    # is cut where it receives, so stages differ in op counts by design), so a rank alone in its
    # stage has no peer to do less than
    groups = ctx.rank_stage
    compute = ctx.kind_is("compute") & ~ctx.gc
    steps = ctx.step_numbers()
    extra: dict[int, np.ndarray] = {}  # op type -> (rank, step) seconds over the peers', where it ran more ops
    for t in np.unique(ctx.name[compute]).tolist():
        ops = compute & (ctx.name == t)
        count = np.nan_to_num(ctx.per_rank_step(ops, np.ones(len(ctx.w))))
        secs = np.nan_to_num(ctx.per_rank_step(ops))
        more = count > _peer_max(count, groups)
        if not more.any():
            continue
        extra[int(t)] = np.where(more, np.maximum(secs - step_peer_median(secs, groups), 0.0), 0.0)
    if not extra:
        return []
    total = sum(extra.values())
    steps = steps[: total.shape[1]]
    per_step = total.sum(axis=1) / max(total.shape[1], 1)
    hot = np.flatnonzero(per_step >= cfg.extra_min_share * ctx.T_ideal)
    if not len(hot):
        return []
    ratio = 1.0 + total / max(ctx.T_ideal, 1e-12)
    out: list[Candidate] = []
    for i in hot[np.argsort(-per_step[hot])][: cfg.extra_max_ranks].tolist():
        pool = np.arange(len(ctx.ranks)) != i
        judged = noise.judge(f"rank {int(ctx.ranks[i])}", "extra", ratio[i], total[i], steps,
                             noise.noise_for(ratio, i, cfg, pool), cfg)
        if not noise.stands_out(judged):
            continue
        out.append(_candidate(ctx, i, {t: e[i] for t, e in extra.items() if e[i].sum() > 0}, judged))
    return out


def _peer_max(per: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per (rank, step): the most any other rank of its group has in that step (inf where it has no
    other: a rank alone in its group has nobody to do less than)."""
    out = np.full(per.shape, np.inf)
    for g in np.unique(groups).tolist():
        rows = np.flatnonzero(groups == g)
        if len(rows) < 2:
            continue
        for j in rows.tolist():
            out[j] = per[rows[rows != j]].max(axis=0)
    return out


def _candidate(ctx: Ctx, i: int, by_type: dict[int, np.ndarray], judged) -> Candidate:  # noqa: ANN001
    r = int(ctx.ranks[i])
    w = ctx.worker_of[r]
    mine = ctx.rank == r
    changes: list[Change] = []
    parts: list[str] = []
    for t, ex in sorted(by_type.items(), key=lambda kv: -kv[1].sum()):
        name = str(ctx.names[t])
        own = float(ctx.w[mine & (ctx.name == t)].sum())
        kept = max(own - float(ex.sum()), 0.0) / own if own > 0 else 0.0
        selector = f"rank={r},optype={name}"
        changes.append(Change(action="zero", selector=selector) if kept <= 0.0
                       else Change(action="scale", selector=selector, factor=round(kept, 4)))
        parts.append(f"{name} ({1e3 * float(ex.sum()) / max(len(ex), 1):.1f} ms per step on average)")
    where = f"rank {r} (dp{w['dp_rank']}/pp{w['stage']})"
    of_stage = " of its stage" if ctx.num_dp > 1 and ctx.num_pp > 1 else ""
    every = f" every {judged.period} steps" if judged.period else ""
    finding = Finding(
        cause="extra-work",
        workers=[w],
        stages=[w["stage"]],
        steps=[int(s) for s in judged.slow_steps[:12]],
        evidence=(f"{where} runs ops its peers{of_stage} do not run{every}: {', '.join(parts[:3])} more than "
                  "they do, which they wait for at the next collective; the pooled ideal keeps that work, so S "
                  "does not show it"),
        fix=(f"share the work rank {r} does alone out over the ranks (an even split of the evaluation set, "
             "every rank evaluating its part), or move it off the training loop (a separate process, "
             "asynchronously, less often)"),
        targets=[judged],
    )
    return Candidate(finding=finding, changes=changes, weights=weights_of(ctx, changes))


__all__ = ["detect"]
