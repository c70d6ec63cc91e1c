"""Several causes at once: a joint attribution of the slowdown to the candidate fixes.

Why Shapley values and not greedy explain-away: causes hide each other. A slow link on DP rank 0 and
a slow worker on DP rank 2 each leave the other pipeline as slow as before, so fixing either one
alone gains ~nothing and a greedy first pick falls under the floor: both would be lost. The value
of a set of fixes (the slowdown removed when all of them are applied together) is replayed for every
subset of the candidates in one batched replay (2^n columns, n <= ``max_joint``; a candidate alone is
the replay that scored it); each candidate's
Shapley value is its average marginal gain over all orders, so the two hidden causes get half the
combined gain each, and the shares add up to the combined gain. Candidates under the floor are
dropped one at a time (the weakest first) and the values recomputed over the rest from the same
table, so a nominee that explains nothing does not dilute the others. A candidate stays when its
Shapley value or its gain removed last (fixed after all the others) reaches the floor: a cause the
others hide today is what the step pays once they are fixed. A candidate whose fix alone slows the
step by more than the floor takes no part: it removes no cause, whatever another fix's interaction
gives it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from laggard.diagnose.beyond import beyond_s, ideal_paid
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.findings import Candidate
from laggard.engine.replay import replay_steps
from laggard.errors import LaggardError
from laggard.results.diagnosis import Diagnosis, Finding
from laggard.util.shapley import shapley

_BATCH = 32  # subsets replayed per pass (weights: ops x 32 float64)


def replay_mean(ctx: Ctx, weights: list[np.ndarray], *, batched: bool = False) -> np.ndarray:
    """Mean step time of the job replayed with each of ``weights``. ``batched``: a lone column is
    replayed beside a copy of itself, so its mean is the one it gets in a batch of several (numpy
    sums one column's steps pairwise, several columns' step by step: the last bits differ)."""
    out = np.empty(len(weights))
    for i in range(0, len(weights), _BATCH):
        part = weights[i : i + _BATCH]
        w = np.stack(part * 2 if batched and len(part) == 1 else part, axis=1)
        out[i : i + _BATCH] = replay_steps(ctx.base.graph, w).mean(axis=0)[: len(part)]
    return out


def attribute(ctx: Ctx, cands: list[Candidate], cfg: DiagnoseConfig) -> Diagnosis:
    """Score every candidate alone, then share the slowdown among them jointly (see the module)."""
    gap, T = ctx.gap, ctx.T
    for c in cands:  # what an earlier attribution over other candidates found hidden (``_hidden_last``)
        if c.masked:
            c.finding.hidden, c.finding.once_fixed, c.masked = False, None, False
    alone = _score(ctx, cands)
    rep = [c for c in cands if c.weights is not None]
    # a finding that names a rank, stage or link gains ``min_named_gain`` (``named_gain_ok``); a joint
    # player may instead gain it once the others are fixed (``_named_last``)
    launch = [c for c in cands if c.weights is None and named_gain_ok(c.finding, cfg)]
    floor = share_floor(ctx, cfg)
    if cfg.single_cause:
        cands = [c for c in cands if named_gain_ok(c.finding, cfg)]
        best = sorted((c for c in cands if c.finding.score >= floor_of(ctx, cfg, c, floor)),
                      key=lambda c: (-c.finding.gain, -c.finding.score))[:1]
        for c in best:
            c.finding.share = c.finding.score
        said(ctx, best)
        f0 = best[0].finding if best else None
        return diagnosis_of(ctx, cfg, [c.finding for c in best],
                            t_all=T - (f0.score * gap if f0 is not None and not _own_model(f0) else 0.0))
    # the strongest by their own score when there are too many for 2^n replays; not one whose fix
    # alone slows the step by more than the floor: it removes no cause, it moves time onto the
    # critical path, and another fix's interaction could give it a share it did not earn (an --even
    # of a stalled host's microbatches, beside the stall's own fix)
    players = sorted((c for c in rep if c.finding.score > -floor), key=lambda c: -c.finding.score)[: cfg.max_joint]
    t = _subset_times(ctx, players, alone)
    v = (T - t) / gap
    alive = list(range(len(players)))
    floors = [floor_of(ctx, cfg, c, floor) for c in players]
    phi = shapley(v, alive)
    while alive:
        strength = _strength(v, alive, phi)
        weak = [i for i in alive if strength[i] < floors[i] or not _named_last(players, t, alive, i, cfg)]
        if not weak:
            break
        alive.remove(min(weak, key=lambda i: strength[i]))
        phi = shapley(v, alive)
    for i in alive:
        players[i].finding.share = float(min(phi[i], 1.0))
        _hidden_last(ctx, players, t, alive, i, cfg)
    kept = [players[i] for i in alive] + [c for c in launch if _kept_alone(ctx, cfg, c, floor)]
    said(ctx, kept)
    full = sum(1 << i for i in alive)
    return diagnosis_of(ctx, cfg, [c.finding for c in kept], t_all=float(t[full]))


def _score(ctx: Ctx, cands: list[Candidate]) -> dict[int, tuple[float, bool]]:
    """Each candidate's score and gain alone (replayed, or on its own job model: ``score_alone``); returns
    each replayed one's mean step time by ``id``, with whether it was replayed beside others (the
    batches of ``replay_mean``: ``_subset_times`` reuses the number only where a batch would give it)."""
    gap, T = ctx.gap, ctx.T
    rep = [c for c in cands if c.weights is not None]
    times = replay_mean(ctx, [c.weights for c in rep]).tolist() if rep else []  # type: ignore[misc]
    for c, t in zip(rep, times, strict=True):
        # a fix can beat the pooled ideal (it removes the cause from the ideal too): cap at 1
        c.finding.score = min((T - t) / gap, 1.0)
        c.finding.gain = T / t if t > 0 else float("inf")
    for c in cands:
        if c.weights is None:
            score_alone(ctx, c)
    return {id(c): (x, min(_BATCH, len(rep) - j // _BATCH * _BATCH) > 1)
            for j, (c, x) in enumerate(zip(rep, times, strict=True))}


def _last_gain(t: np.ndarray, alive: list[int], i: int) -> float:
    """Player ``i``'s speed-up fixed last: the step with every other ``alive`` player fixed over the step
    with all of them (``t``: mean step time by subset bitmask)."""
    full = sum(1 << j for j in alive)
    return float(t[full & ~(1 << i)] / t[full]) if t[full] > 0 else float("inf")


def _named_last(players: list[Candidate], t: np.ndarray, alive: list[int], i: int, cfg: DiagnoseConfig) -> bool:
    """Whether player ``i`` may stand on its gain (``named_gain_ok``), or, naming a rank, stage or link,
    gains ``min_named_gain`` once the other players are fixed: a cause the others hide (a slow link
    behind a heavy stage) gains ~nothing alone and is what the step pays once they are fixed."""
    return named_gain_ok(players[i].finding, cfg) or _last_gain(t, alive, i) >= cfg.min_named_gain


def _hidden_last(ctx: Ctx, players: list[Candidate], t: np.ndarray, alive: list[int], i: int,
                 cfg: DiagnoseConfig) -> None:
    """A kept player naming a rank, stage or link whose fix alone gains under ``min_named_gain`` is
    hidden behind the others: marked so, with its gain and share once they are fixed (``Finding.
    once_fixed``: what it says it gives; alone it would say "1.00x")."""
    f = players[i].finding
    if named_gain_ok(f, cfg):
        return
    full = sum(1 << j for j in alive)
    rest = float(t[full & ~(1 << i)])
    f.hidden = players[i].masked = True
    gap = rest - ctx.res.T_ideal_s
    f.once_fixed = {"gain": _last_gain(t, alive, i),
                    "share": min(1.0, max(0.0, (rest - float(t[full])) / gap)) if gap > 0 else 0.0}


def _kept_alone(ctx: Ctx, cfg: DiagnoseConfig, c: Candidate, floor: float) -> bool:
    """Whether a candidate scored on its own (``score_alone``) is a finding: its share reaches the floor,
    or its fix alone gains the healthy threshold where most of what it removes is time the pooled ideal
    pays too (the overhead every rank pays: no part of the slowdown S measures, and a straggling cause
    the pooled ideal cannot show, as ``laggard.diagnose.unseen`` judges it)."""
    f = c.finding
    return f.share >= floor_of(ctx, cfg, c, floor) or (c.ideal_paid_s > 0 and f.gain >= cfg.healthy_threshold)


def named_gain(f: Finding) -> float:
    """The speed-up a finding's fix shows: its own, or for a hidden finding the larger of that and its
    gain once the findings it hid behind are fixed (what it says it gives)."""
    once = (f.once_fixed or {}).get("gain") if f.hidden else None
    return max(f.gain, once) if isinstance(once, float) else f.gain


def named_gain_ok(f: Finding, cfg: DiagnoseConfig) -> bool:
    """Whether a finding may stand on its gain: one naming a rank, stage or link gains
    ``min_named_gain`` (on-call drains what is named); a job-wide one is held to ``min_gain`` by the
    share floor (``share_floor``)."""
    return not f.localized or named_gain(f) >= cfg.min_named_gain


def said(ctx: Ctx, kept: list[Candidate]) -> None:
    """What the findings of ``kept`` say besides their numbers: a transient target's steps
    (``Finding.steps``), and why a fix gains more than S (``Finding.beyond_s``)."""
    for c in kept:
        f = c.finding
        if f.transient_steps:
            f.steps = f.transient_steps
        f.beyond_s = beyond_s(ctx, c)


def _subset_times(ctx: Ctx, players: list[Candidate], alone: dict[int, tuple[float, bool]]) -> np.ndarray:
    """Mean step time with every subset of ``players`` fixed (``joint``), by the bitmask of the subset
    (``[0]``: none fixed, the job's ``T``). A player fixed alone takes the time its score was replayed
    with (``alone``: by ``id``, with whether it was replayed beside others), where its changes already
    apply in ``_ACTION_ORDER`` (``joint`` would build the same weights again) and that replay was
    batched as these are (beside others when there are several players): the same number, bit for
    bit. Only the subsets of several players (and any other single one) are replayed."""
    n = len(players)
    t = np.empty(1 << n)
    t[0] = ctx.T
    reuse = {1 << i for i, c in enumerate(players) if _in_order(c) and alone[id(c)][1] == (n > 1)}
    again = [m for m in range(1, 1 << n) if m not in reuse]
    subsets = [joint(ctx, [players[i] for i in range(n) if m >> i & 1]) for m in again]
    if again:
        t[again] = replay_mean(ctx, subsets, batched=n > 1)
    for i, c in enumerate(players):
        if 1 << i in reuse:
            t[1 << i] = alone[id(c)][0]
    return t


def _in_order(c: Candidate) -> bool:
    ranks = [_ACTION_ORDER[ch.action] for ch in c.changes]
    return ranks == sorted(ranks)


def share_floor(ctx: Ctx, cfg: DiagnoseConfig, min_gain: float | None = None) -> float:
    """The least share of the slowdown a finding must explain: ``min_share``, and what a speed-up of
    ``min_gain`` (default ``cfg.min_gain``) is of this job's gap (T - T / min_gain over the gap)."""
    if ctx.gap <= 0:
        return cfg.min_share
    return max(cfg.min_share, ctx.T * (1.0 - 1.0 / (min_gain or cfg.min_gain)) / ctx.gap)


def floor_of(ctx: Ctx, cfg: DiagnoseConfig, c: Candidate, floor: float) -> float:
    """``floor`` (``share_floor``), or a candidate's own higher one where it sets a speed-up floor of its
    own (``Candidate.min_gain``); for a straggler of the job with the found causes fixed
    (``Candidate.left``) also ``min_share`` of the rest those causes leave, where its own fix speeds
    the measured step up by the speed-up floor (fixed last, after the found causes, a healthy rank's
    compute stretched by them, on cores a host stall kept busy, gains more than alone; held to the
    rest alone, it would be named beside the stalled rank for a fix that gains nothing on the measured
    job)."""
    own = floor if c.min_gain is None or c.min_gain <= cfg.min_gain else share_floor(ctx, cfg, c.min_gain)
    if c.left is None or c.finding.gain < max(c.min_gain or cfg.min_gain, cfg.min_gain):
        return own
    return min(own, share_floor(ctx, replace(cfg, min_share=cfg.min_share * c.left), c.min_gain))


# the order in which the changes of several fixes apply: stalls out first (an --even or --scale of
# the stalled ops would keep them), then balance, then a stage's scale, then the slow workers set to
# their (balanced, rescaled) peers, then links and traced GC
_ACTION_ORDER = {"despike": 0, "even": 1, "scale": 2, "peer": 3, "fix": 4, "zero": 5}


def joint(ctx: Ctx, fixes: list[Candidate]) -> np.ndarray:
    """The measured durations with every change of ``fixes`` applied, as ``laggard whatif`` with all
    their flags would, in ``_ACTION_ORDER``: a stage fix scales its row to the other stages' level
    and a worker fix of that row then sets the worker to its rescaled peers; a balance of the
    microbatches and a worker fix compose the same way (as factors on the measured durations, two
    fixes that both set a value would multiply into nonsense)."""
    from laggard.whatif.custom import apply_changes

    changes = sorted((c for f in fixes for c in f.changes), key=lambda c: _ACTION_ORDER[c.action])
    return apply_changes(ctx.base, changes)[0]


def _strength(v: np.ndarray, alive: list[int], phi: dict[int, float]) -> dict[int, float]:
    """What keeps a candidate above the floor: the larger of its Shapley value and its gain removed
    last (what fixing it removes once every other alive candidate is fixed). A cause that others
    hide (a GC pause or a slow link beside a heavy stage and a slow worker) gains ~nothing until
    they are fixed, and Shapley gives it only a fraction of that last gain (1/n of it when only the
    last order counts); fixed last it is what the step pays for it afterwards."""
    full = sum(1 << i for i in alive)
    return {i: max(phi[i], float(v[full] - v[full & ~(1 << i)])) for i in alive}


def score_alone(ctx: Ctx, cand: Candidate) -> None:
    """A candidate whose what-if models untraced gaps anew (``gap_share``): replayed on its own job
    model; its score is the time it removes over the job's gap (wall clock - ideal), at most 1."""
    from laggard.engine.baseline import prepare
    from laggard.whatif.custom import apply_changes, gap_config

    job = ctx.base.traced if ctx.base.traced is not None else ctx.base.job
    base = prepare(job, gap_config(cand.gap_share))
    f = cand.finding
    try:
        w, _ = apply_changes(base, cand.changes)
    except LaggardError:  # no gap to model: nothing to fix
        f.score = f.share = 0.0
        return
    t0, t1 = (float(x) for x in replay_steps(base.graph, np.stack([base.measured, w], axis=1)).mean(axis=0))
    cand.removed_s, cand.step_s = t0 - t1, t0
    # the part of it the pooled ideal pays too (host ops every rank has, at their typical value) is no
    # part of the slowdown S measures, unless the ideal stands for the best fix (``Ctx.ideal_by_fix``)
    cand.ideal_paid_s = 0.0 if ctx.ideal_by_fix else min(ideal_paid(ctx, cand.changes), t0 - t1)
    f.score = max(min((t0 - t1 - cand.ideal_paid_s) / ctx.gap, 1.0), 0.0) if ctx.gap > 0 else 0.0
    f.share = max(f.score, cand.hidden_share)
    f.gain = t0 / t1 if t1 > 0 else float("inf")


def _own_model(f: Finding) -> bool:
    return f.whatif[:1] == ["--gap-share"]


def diagnosis_of(ctx: Ctx, cfg: DiagnoseConfig, findings: list[Finding], *, t_all: float) -> Diagnosis:
    gap = ctx.gap
    # the launch-delay finding on many small gaps removes its own share of the gap (score_alone)
    removed = ctx.T - t_all + sum(f.score * gap for f in findings if _own_model(f))
    combined = removed / gap if gap > 0 else 0.0
    t_fixed = ctx.T_meas - removed
    d = Diagnosis(
        verdict="straggling",
        threshold=cfg.healthy_threshold,
        findings=ranked(findings, cfg),
        combined_share=combined,
        combined_gain=ctx.T_meas / t_fixed if t_fixed > 0 else float("inf"),
        # on the share scale, where each finding's score is capped at the whole slowdown: fixes that
        # together take the step below the all-ideal one (``Finding.beyond_s``) remove more than S
        # measures, and that surplus is no interaction of the causes
        interaction=min(combined, 1.0) - sum(f.score for f in findings),
        unexplained=max(1.0 - combined, 0.0),
    )
    if not findings or d.unexplained > cfg.unexplained_floor:
        d.unexplained_by = carriers(ctx)
    return d


def carriers(ctx: Ctx, top: int = 3, top_stages: int = 1) -> list[dict[str, Any]]:
    """The attributions that carry a slowdown no finding explains: the op types, stages and workers
    with the largest slowdown when only they are measured."""
    res = ctx.res
    out: list[dict[str, Any]] = []
    for k, s in sorted(res.by_optype.items(), key=lambda kv: -kv[1])[:top]:
        out.append({"what": "op type", "name": k, "slowdown": s})
    for k, s in sorted(res.by_stage.items(), key=lambda kv: -kv[1])[:top_stages]:
        out.append({"what": "stage", "name": int(k), "slowdown": s})
    for w in res.by_worker[:top]:
        out.append({"what": "worker", "name": int(w["rank"]), "slowdown": w["slowdown"]})
    return out


def ranked(findings: list[Finding], cfg: DiagnoseConfig) -> list[Finding]:
    """Stragglers first, then costs every rank pays alike (``Finding.everywhere``: the launch overhead, a
    transfer tail every link shares); each part by the largest speed-up (what on-call acts on; ties: a
    stage before a worker, a hot row explaining its hot cells; then the larger share). A straggler
    finding has passed the noise gate (and, naming a rank, stage or link, the named-gain floor): it is
    what slows this job against its own ranks. A cost every rank pays is no straggler, and its gain and
    share count time the ideal step pays too (``Finding.beyond_s``), so they do not compare."""
    return sorted(findings, key=lambda f: (f.everywhere, -f.gain, f.cause != "stage-imbalance", -f.share))
