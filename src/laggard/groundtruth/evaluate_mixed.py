"""Does the diagnosis find every cause when several act at once? Ground truth from the independent
simulator (``laggard.groundtruth.dessim``), not from our replay.

A job of the sweep carries 0-4 causes of the six kinds at random strengths at and above the
detection floors (``FLOORS``), on 8 to 1,024 workers (most jobs small, a few large: the sweep runs on
two cores). A named cause counts when the cause and its target are right: the exact set of slow
workers, the heavy stage, the slow link's two ranks. Each cause's predicted gain is compared with the
simulator's speed-up of running the job again without it.

**Detection floor** (what counts as missed). A cause is drawn at a strength at or above its floor
(``FLOORS``), but what it does to the job depends on the rest: a launch delay is mostly hidden by
the launch queue (the host runs ahead of the device), a slow link next to a heavy stage waits on
that stage anyway. The simulator measures each cause's real effect (``CauseTruth.effect_share``: the
larger of removing it last and adding it alone, as a share of the job's slowdown over its clean
run). A cause is *required* when the job is slowed by at least the diagnosis's health threshold
(5%) and its effect is at least the diagnosis's reporting floor (``min_share``, 5% of the slowdown):
a required cause not named is a miss. A cause under the floor is *optional*: named (right target)
it is a hit, not named it is not counted either way. Findings that match no injected cause are
false positives whatever the floor.

**A slow worker on every DP replica of one stage** (the "one stage" layout when it draws as many
workers as there are DP ranks) is matched by a stage finding of that stage: every op of the trace
is then what a heavy stage gives (each replica of the stage computes the factor more, its peers on
the stage are all slow alike), so no detector can tell the two apart from the trace, and the
what-if of either fix is the same. One finding still matches one cause: with a heavy stage on the
same stage as well, one of the two is missed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from laggard.groundtruth.dessim import (
    DIAGNOSIS_CAUSE,
    Cause,
    CauseTruth,
    SimConfig,
    SimTruth,
    parse_cause,
    simulate_with_truth,
    to_job,
)

if TYPE_CHECKING:
    from laggard.results.diagnosis import Diagnosis

# the factor floor of slow workers and heavy stages: the sweep's default is the real range (the
# stragglers that cost money are 1.1-1.35x; NVRx flags ranks at ~1.33x); 1.5 was the floor before
FACTOR_FLOOR = 1.15
FLOORS = {
    "slow-worker": f"factor >= {FACTOR_FLOOR}, 1-8 workers (scattered, one stage or one DP rank)",
    "heavy-stage": f"factor >= {FACTOR_FLOOR} on any stage",
    "seq-imbalance": "sigma >= 0.4",
    "gc": "prob >= 0.05, pause_ms >= 30 (forward pass ~10 ms)",
    "slow-link": "delay_ms >= 5 (transfers ~0.4 ms)",
    "launch-delay": "ms >= 2 per compute launch (computes ~10-20 ms)",
}
KIND_ORDER = list(DIAGNOSIS_CAUSE)
# The noise of real jobs (benchmarks/calibrate_noise.py on the clean jobs of the real-process corpus):
# a lognormal jitter and a heavy tail of stretched compute ops. The simulator's own default (3%
# lognormal, no tail) is the "simulator" noise the sweep used before.
NOISE = {
    "simulator": {"jitter": 0.03, "tail_prob": 0.0, "tail_alpha": 2.5, "tail_scale": 1.0},
    "real": {"jitter": 0.29, "tail_prob": 0.0036, "tail_alpha": 3.2, "tail_scale": 2.23},
}
CALIBRATION = ("benchmarks/calibrate_noise.py on the 10 clean jobs of the real corpus (seed 2026, generated on a "
               "quiet machine: 2-4 ranks on 2 shared cores, gloo, DDP and pipelines, Tracer traces; 5,328 compute "
               "ops): jitter 0.29, tail 0.36% of ops stretched >= 2.23x their duration (Pareto 3.2), step-to-step "
               "CV of a rank's compute 20.8%")


@dataclass(kw_only=True, slots=True)
class MixScenario:
    cfg: SimConfig
    causes: list[Cause]


def mixed_scenarios(num: int, *, seed: int = 0, clean_every: int = 8, large_share: float = 0.04,
                    max_workers: int = 1024, max_causes: int = 4, factor_floor: float = FACTOR_FLOOR,
                    noise: str = "simulator") -> list[MixScenario]:
    """``num`` jobs drawn from ``seed``; slow workers and heavy stages from ``factor_floor`` up;
    ``noise``: a key of ``NOISE`` (the simulator's jitter, or the real jobs' measured one)."""
    rng = np.random.default_rng(seed)
    noise_cfg = NOISE[noise]
    out = []
    for i in range(num):
        if rng.random() < large_share:
            pp = int(rng.choice([4, 8]))
            workers = int(np.exp(rng.uniform(np.log(128), np.log(max_workers))))
        else:
            pp = int(rng.choice([2, 4]))
            workers = int(rng.choice([8, 16, 32]))
        dp = max(2, workers // pp)
        cfg = SimConfig(dp=dp, pp=pp, microbatches=8, steps=3, seed=int(rng.integers(1 << 30)), **noise_cfg)
        num_causes = 0 if i % clean_every == 0 else int(rng.integers(1, max_causes + 1))
        kinds = list(rng.choice(KIND_ORDER, size=num_causes, replace=False))
        out.append(MixScenario(cfg=cfg, causes=[_draw(str(k), cfg, rng, factor_floor) for k in kinds]))
    return out


def _draw(kind: str, cfg: SimConfig, rng: np.random.Generator, floor: float = FACTOR_FLOOR) -> Cause:
    n = cfg.dp * cfg.pp
    if kind == "slow-worker":
        k = int(rng.integers(1, min(8, max(1, n // 4)) + 1))
        layout = rng.integers(3)
        if layout == 1 and k <= cfg.dp:  # one stage
            s = int(rng.integers(cfg.pp))
            ranks = [int(d) * cfg.pp + s for d in rng.choice(cfg.dp, size=k, replace=False)]
        elif layout == 2 and k <= cfg.pp:  # one DP rank
            d = int(rng.integers(cfg.dp))
            ranks = [d * cfg.pp + int(s) for s in rng.choice(cfg.pp, size=k, replace=False)]
        else:
            ranks = [int(r) for r in rng.choice(n, size=k, replace=False)]
        return parse_cause(f"slow-worker:rank={'+'.join(map(str, sorted(ranks)))},factor={rng.uniform(floor, 2.5):.2f}")
    if kind == "heavy-stage":
        return parse_cause(f"heavy-stage:stage={int(rng.integers(cfg.pp))},factor={rng.uniform(floor, 2.5):.2f}")
    if kind == "seq-imbalance":
        return parse_cause(f"seqlen-imbalance:sigma={rng.uniform(0.4, 0.8):.2f}")
    if kind == "gc":
        return parse_cause(f"gc-pauses:prob={rng.uniform(0.05, 0.1):.3f},pause_ms={rng.uniform(30, 80):.0f}")
    if kind == "slow-link":
        src = int(rng.integers(cfg.dp)) * cfg.pp + int(rng.integers(cfg.pp - 1))
        return parse_cause(f"slow-link:src={src},dst={src + 1},delay_ms={rng.uniform(5, 20):.1f}")
    return parse_cause(f"launch-delay:ms={rng.uniform(2, 5):.2f}")


@dataclass(kw_only=True, slots=True)
class JobScore:
    true_pos: int = 0  # findings that name an injected cause (required or not): precision
    found: int = 0  # required causes named: recall
    false_pos: int = 0
    false_neg: int = 0
    healthy: bool = False
    gain_errors: list[float] = field(default_factory=list)  # |predicted / simulated - 1| per named cause
    missed: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    below_floor: list[str] = field(default_factory=list)  # optional causes (named or not)
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [hits, misses, below the floor]


def _matches(c: Cause, f, cfg: SimConfig) -> bool:  # noqa: ANN001 (a Finding)
    ranks = sorted(w["rank"] for w in f.workers)
    if c.kind == "slow-worker" and f.cause == "stage-imbalance" and len(f.stages) == 1:
        # every DP replica of one stage slow is a heavy stage in every op of the trace (see the module)
        return sorted(c.ranks) == [d * cfg.pp + f.stages[0] for d in range(cfg.dp)]
    if DIAGNOSIS_CAUSE[c.kind] != f.cause:
        return False
    if c.kind == "slow-worker":
        return ranks == sorted(c.ranks)
    if c.kind == "heavy-stage":
        return f.stages == [int(c["stage"])]
    if c.kind == "slow-link":
        return ranks == sorted([int(c["src"]), int(c["dst"])])
    return True


def required(truth: SimTruth, ct: CauseTruth) -> bool:
    """Whether the diagnosis must name this cause (see the module's detection floor)."""
    from laggard.diagnose import DiagnoseConfig

    floor = DiagnoseConfig()
    return truth.slowdown >= floor.healthy_threshold and ct.effect_share >= floor.min_share


def score_job(truth: SimTruth, d: Diagnosis) -> JobScore:
    """Named causes against the simulator's truth (cause and target must both be right)."""
    s = JobScore(healthy=d.verdict == "healthy")
    used: set[int] = set()
    for ct in truth.causes:
        need = required(truth, ct)
        tally = s.by_kind.setdefault(ct.cause.kind, [0, 0, 0])
        if not need:
            tally[2] += 1
            s.below_floor.append(ct.cause.spec())
        hit = next((i for i, f in enumerate(d.findings)
                    if i not in used and _matches(ct.cause, f, truth.sim.cfg)), None)
        if hit is None:
            if need:
                s.false_neg += 1
                tally[1] += 1
                s.missed.append(ct.cause.spec())
            continue
        used.add(hit)
        s.true_pos += 1
        if need:
            s.found += 1
            tally[0] += 1
        s.gain_errors.append(abs(d.findings[hit].gain / ct.gain - 1.0))
    for i, f in enumerate(d.findings):
        if i not in used:
            s.false_pos += 1
            s.wrong.append(f"{f.cause}:{[w['rank'] for w in f.workers][:8]}:{f.stages}")
    return s


@dataclass(kw_only=True, slots=True)
class MixOutcome:
    scenario: MixScenario
    full: JobScore
    single: JobScore
    num_workers: int


def run_mixed(sc: MixScenario) -> MixOutcome:
    """Simulate with truth, analyze once, diagnose jointly and with the single-cause baseline."""
    from laggard.analysis.pipeline import analyze
    from laggard.diagnose import DiagnoseConfig, diagnose

    truth = simulate_with_truth(sc.cfg, sc.causes, alone_below=DiagnoseConfig().min_share)
    res = analyze(to_job(truth.sim), diagnose=False)
    full = score_job(truth, diagnose(res))
    single = score_job(truth, diagnose(res, config=DiagnoseConfig(single_cause=True)))
    return MixOutcome(scenario=sc, full=full, single=single, num_workers=sc.cfg.num_ranks)


def summary(outcomes: list[MixOutcome], which: str = "full") -> dict[str, float]:
    scores = [getattr(o, which) for o in outcomes]
    tp = sum(s.true_pos for s in scores)
    found = sum(s.found for s in scores)
    fp = sum(s.false_pos for s in scores)
    fn = sum(s.false_neg for s in scores)
    clean = [s for o, s in zip(outcomes, scores, strict=True) if not o.scenario.causes]
    errs = [e for s in scores for e in s.gain_errors]
    return {
        "precision": tp / max(tp + fp, 1),
        "recall": found / max(found + fn, 1),
        "clean_healthy": sum(s.healthy for s in clean) / max(len(clean), 1),
        "gain_err_median": float(np.median(errs)) if errs else float("nan"),
        "gain_err_p90": float(np.percentile(errs, 90)) if errs else float("nan"),
        "num_causes": found + fn,  # required ones
        "num_jobs": len(outcomes),
        "below_floor": sum(len(s.below_floor) for s in scores),
    }


def by_kind(outcomes: list[MixOutcome], which: str = "full") -> dict[str, dict[str, float]]:
    """Per cause kind: named (hits), missed, under the floor, recall over the required ones."""
    out: dict[str, list[int]] = {}
    for o in outcomes:
        for k, (h, m, b) in getattr(o, which).by_kind.items():
            t = out.setdefault(k, [0, 0, 0])
            t[0], t[1], t[2] = t[0] + h, t[1] + m, t[2] + b
    return {k: {"named": h, "missed": m, "below_floor": b, "recall": h / max(h + m, 1)}
            for k, (h, m, b) in sorted(out.items())}
