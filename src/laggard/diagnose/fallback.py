"""Never silent: a straggling job whose slowdown no detector's signature fits still gets a finding.

The largest carrier of the residual (the op type, stage or rank whose fix removes the most of the
slowdown) becomes a finding of confidence "low", with its `laggard whatif` command: it says where the
time goes and what fixing it would give, not why (no known cause's signature fitted).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, weights_of
from laggard.diagnose.findings import Candidate
from laggard.diagnose.impact import stage_impact, step_impact
from laggard.results.diagnosis import Consistency, Finding

# how many of each kind of carrier are replayed (the largest by their attribution)
_TOP = 3


def _carriers(ctx: Ctx) -> list[tuple[str, str, float, dict]]:
    """(what, selector, its attribution, finding targets) for the op types, stages and ranks that carry
    the most slowdown when only they are measured (``explain.carriers``, the residual's carriers)."""
    from laggard.diagnose.explain import carriers

    out: list[tuple[str, str, float, dict]] = []
    # a pure pipeline's rank is its stage (the same ops): named as the stage, whose work may be what is
    # heavy (the last stage's LM head), not as a node to drain on a finding that says no cause fits
    # (a healthy last stage, heavier by design, would otherwise send on-call to drain its node)
    pure = ctx.num_dp == 1 and ctx.num_pp > 1
    for c in carriers(ctx, top=_TOP, top_stages=_TOP):
        s, name = float(c["slowdown"]), c["name"]
        if s <= 1.0:
            continue
        if c["what"] == "op type":
            out.append((f"op type {name}", f"optype={name}", s, {}))
        elif c["what"] == "stage" and ctx.num_pp > 1:
            out.append((f"stage {name}", f"stage={name}", s, {"stages": [name]}))
        elif c["what"] == "worker" and len(ctx.ranks) > 1 and not pure:
            w = ctx.worker_of[name]
            out.append((f"rank {name} (dp{w['dp_rank']}/pp{w['stage']})", f"rank={name}", s,
                        {"workers": [w], "stages": [w["stage"]]}))
    return out


def _within_noise_dropped(ctx: Ctx, cfg: DiagnoseConfig, carriers: list[tuple[str, str, float, dict]]
                         ) -> tuple[list[tuple[str, str, float, dict]], dict[str, Consistency]]:
    """``carriers`` less the ranks whose own effect on the step is within the job's noise
    (``laggard.diagnose.impact``; their compute speed against their peers' where that replay is too
    large), in a pure pipeline (one rank per stage) the stages of such ranks, and the stages with DP
    replicas whose own effect is within the other stages' noise: on-call acts on what is named, and
    some rank always carries the most of a small residual, as often the noisiest as a slow one. With
    the consistency of each kept rank's (or stage's), by selector."""
    def rank_of(named: dict) -> int | None:  # the rank a carrier stands for (its finding targets)
        if named.get("workers"):
            return int(named["workers"][0]["rank"])
        if named.get("stages") and ctx.num_dp == 1:
            return next((int(r) for r in ctx.ranks if ctx.worker_of[int(r)]["stage"] == named["stages"][0]), None)
        return None

    ranks = sorted({r for *_, named in carriers if (r := rank_of(named)) is not None})
    judged = step_impact(ctx, cfg, ranks) if ranks else {}
    if ranks and not judged:  # too large a replay for the ranks' own effects: their compute instead
        judged = _by_compute(ctx, cfg, ranks)
    noisy = {r for r, c in judged.items() if c.pattern == "noise"}
    # a stage with DP replicas: its own effect on the step, against the other stages'
    stages = sorted({named["stages"][0] for *_, named in carriers if not named.get("workers") and named.get("stages")
                     and rank_of(named) is None})
    by_stage = stage_impact(ctx, cfg, stages) if stages else {}
    kept = [c for c in carriers if rank_of(c[3]) not in noisy and not _noisy_stage(c[3], by_stage, rank_of)
            and not _uneven_stage(ctx, c[3], judged, rank_of)]
    # a stage's (a pure pipeline's one rank) is said of the stage
    out = {sel: judged[r] if named.get("workers") else replace(judged[r], target=f"stage {named['stages'][0]}")
           for _, sel, _, named in kept if (r := rank_of(named)) in judged}
    out.update({sel: by_stage[named["stages"][0]] for _, sel, _, named in kept
                if rank_of(named) is None and named.get("stages") and named["stages"][0] in by_stage})
    return kept, out


def _noisy_stage(named: dict, by_stage: dict[int, Consistency], rank_of) -> bool:  # noqa: ANN001
    """Whether ``named`` is a stage (with DP replicas) whose own effect is within the job's noise."""
    return rank_of(named) is None and bool(named.get("stages")) and not named.get("workers") \
        and by_stage.get(named["stages"][0]) is not None and by_stage[named["stages"][0]].pattern == "noise"


def _uneven_stage(ctx: Ctx, named: dict, judged: dict[int, Consistency], rank_of) -> bool:  # noqa: ANN001
    """Whether ``named`` is a stage (with DP replicas) of which some judged replicas are within the
    job's noise and others are not: its slowdown is those ranks', and naming the stage would send
    on-call to its healthy replicas too (the ranks themselves are carriers of their own)."""
    if rank_of(named) is not None or named.get("workers") or not named.get("stages"):
        return False
    stage = named["stages"][0]
    patterns = {judged[r].pattern == "noise" for r in judged if ctx.worker_of[int(r)]["stage"] == stage}
    return patterns == {True, False}


def _by_compute(ctx: Ctx, cfg: DiagnoseConfig, ranks: list[int]) -> dict[int, Consistency]:
    """The ranks' compute speed against their peers' per step (``worker.consistency``), where their own
    effect on the step is too large a replay: the same gate, on what the worker detector reads."""
    from laggard.diagnose.worker import consistency

    load = {int(r): float(x) for r, x in zip(ctx.ranks, ctx.worker_loads(), strict=True)}
    return consistency(ctx, cfg, load, ranks)


def _narrowest(carriers: list[tuple[str, str, float, dict]], shares: np.ndarray, gains: np.ndarray,
               cfg: DiagnoseConfig) -> int:
    """The carrier to name: the narrowest within ``row_tie`` of the largest share (a rank before its
    stage, a stage before an op type) whose fix gains ``min_gain``, what any finding must, and a rank
    ``fallback_rank_gain``; when no rank or stage does, the op type that carries the most (on a busy
    host's noise some rank is always a little slower than the rest, and a fix that gains a fraction of
    a percent is no reason to drain its node)."""
    narrow = {"rank": 0, "stage": 1, "optype": 2}
    kind = [narrow[c[1].split("=", 1)[0]] for c in carriers]
    # a rank, ``fallback_rank_gain``; a stage, ``min_named_gain`` (what a finding naming one must gain)
    floor = np.select([np.array(kind) == narrow["rank"], np.array(kind) == narrow["stage"]],
                      [max(cfg.fallback_rank_gain, cfg.min_named_gain), max(cfg.min_named_gain, cfg.min_gain)],
                      cfg.min_gain)
    close = np.flatnonzero((shares >= shares.max() - cfg.row_tie) & (gains >= floor))
    if not len(close):
        close = np.flatnonzero(np.array(kind) == narrow["optype"])
    if not len(close):
        close = np.array([int(np.argmax(shares))])
    return int(min(close, key=lambda i: (kind[i], -shares[i])))


def fallback(ctx: Ctx, cfg: DiagnoseConfig) -> Candidate | None:
    """The carrier whose fix (its ops at their ideal durations) removes the most of the slowdown, as a
    low-confidence candidate; None when nothing carries any (every attribution at or below 1). The
    narrowest target within ``row_tie`` of the best is named (a rank before its stage, a stage before
    an op type): on-call acts on what is named, and a whole stage for one slow rank drains healthy ones."""
    from laggard.diagnose.explain import replay_mean
    from laggard.whatif.custom import parse_changes

    carriers, judged = _within_noise_dropped(ctx, cfg, _carriers(ctx))
    if not carriers or ctx.gap <= 0:
        return None
    changes = [parse_changes([sel], [], []) for _, sel, _, _ in carriers]
    weights = [weights_of(ctx, ch) for ch in changes]
    t = replay_mean(ctx, weights)
    shares = np.minimum((ctx.T - t) / ctx.gap, 1.0)
    gains = np.divide(ctx.T, t, out=np.full(len(t), np.inf), where=t > 0)
    best = _narrowest(carriers, shares, gains, cfg)
    what, sel, attribution, named = carriers[best]
    share = float(shares[best])
    kind = sel.split("=", 1)[0]
    measure = {"optype": "S_t", "stage": "S_stage", "rank": "S_w"}[kind]
    f = Finding(
        cause="unexplained",
        confidence="low",
        evidence=(f"no known cause's signature fits this slowdown; {what} carries the most of it: with only it "
                  f"measured the job runs {attribution:.3f}x its ideal ({measure}), and at its ideal durations "
                  f"{100 * share:.0f}% of the slowdown goes"),
        fix=(f"look at {what}: compare its ops across ranks and steps in the Perfetto trace and profile it; "
             f"the what-if below measures the gain, not the cause"),
        **named,
        targets=[judged[sel]] if sel in judged else [],
    )
    cand = Candidate(finding=f, changes=changes[best], weights=weights[best])
    f.score = f.share = max(share, 0.0)
    f.gain = float(gains[best])
    return cand


__all__ = ["fallback"]
