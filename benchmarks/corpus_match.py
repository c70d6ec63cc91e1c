"""Matching the diagnosis's findings to a real corpus job's truth (benchmarks/real_corpus.py): which
injected causes a finding names (``match``), one job's hits, misses, extra ranks and false alarm
(``score_job``), and the corpus's figures (``summarize``). Pure functions of the truth files and the
``laggard analyze --json`` documents: no I/O, no laggard import."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

# factor buckets of the recall curve (the draw's thirds: 1.15-1.25, 1.25-1.5, 1.5-2.0)
BUCKETS = ((1.15, 1.25), (1.25, 1.5), (1.5, float("inf")))


# injected cause -> the diagnosis's cause for it; host-stall is the launch-delay finding that names
# the stalled rank's own host time ("rank R (dpD/ppS): X ms per step of host time no traced op covers")
DIAGNOSIS_CAUSE = {"slow-worker": "worker", "heavy-stage": "stage-imbalance", "heavy-last-stage": "stage-imbalance",
                   "seqlen-imbalance": "sequence-imbalance", "gc-pauses": "gc", "slow-link": "comm",
                   "launch-delay": "launch-delay", "host-stall": "launch-delay"}
JOB_WIDE = {"seqlen-imbalance", "gc-pauses", "launch-delay"}  # every rank: no target to check
# an extra rank whose own forward+backward CPU per step (the job's timers, truth.json) is this much over
# its DP peers' median was slow with no cause injected (a noisy neighbour on the VM host): the
# corpus's smallest drawn factor, so that such a rank is as slow as the weakest straggler we inject
OWN_TIMERS_SLOW_X = 1.15


def _ranks(f: dict) -> list[int]:
    return sorted({int(w["rank"]) for w in f.get("workers") or []})


def match(cause: dict, f: dict, dp: int, pp: int) -> bool:
    """Whether finding ``f`` names injected ``cause``: the diagnosis's cause and the same target. Every
    DP replica of one stage slow is a heavy stage in every op of a trace (and a heavy stage of a pure
    pipeline is one slow rank), so a worker finding naming exactly a stage's ranks and a stage finding
    on the stage of the slow ranks match each other's cause too (as in groundtruth.evaluate_mixed)."""
    c, t, fc = cause["cause"], cause["target"], f["cause"]
    if c in ("slow-worker", "heavy-stage", "heavy-last-stage"):
        stages = list(f.get("stages") or [])
        if fc == "worker":
            return _ranks(f) == t["ranks"]
        if fc != "stage-imbalance" or len(stages) != 1:
            return False
        if "stage" in t:
            return stages == [t["stage"]]
        return t["ranks"] == [d * pp + stages[0] for d in range(dp)]
    if fc != DIAGNOSIS_CAUSE[c]:
        return False
    if c in ("slow-link", "host-stall"):
        return _ranks(f) == t["ranks"]
    return True


@dataclass(kw_only=True)
class JobScore:
    job: str
    status: str  # ok | error | verdict text when not judged
    verdict: str | None = None
    hits: list[str] = field(default_factory=list)  # injected specs named
    misses: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  # findings that name no injected cause
    num_findings: int = 0
    named_ranks: list[int] = field(default_factory=list)
    extra_ranks: list[int] = field(default_factory=list)
    extra_slow_by_own_timers: list[int] = field(default_factory=list)  # of extra_ranks (slow_by_own_timers)
    false_alarm: bool = False  # a clean job with a finding that names a rank, stage or link
    rank_alarm: bool = False  # a clean job with a finding that names a rank (what on-call would drain)
    by_factor: list[tuple[float | None, bool]] = field(default_factory=list)  # (factor, named) per cause
    by_kind: list[tuple[str, bool]] = field(default_factory=list)


def _describe(f: dict) -> str:
    return f"{f['cause']}:ranks={_ranks(f)}" + (f":stages={f['stages']}" if f.get("stages") else "")


def same_rank_compute(a: dict, b: dict, dp: int) -> bool:
    """Whether injected causes ``a`` and ``b`` are one observable cause: in a pure pipeline (dp 1) a slow
    worker and a heavy stage on the same rank both make that rank compute more, and no trace can tell
    them apart (their factors multiply); the finding that names the rank names both (the draw put a
    1.30x slow rank on a 1.27x heavy stage's one rank, seed 2024's job014)."""
    compute = ("slow-worker", "heavy-stage")
    return (dp == 1 and a["cause"] in compute and b["cause"] in compute
            and a["target"].get("ranks") == b["target"].get("ranks"))


def slow_by_own_timers(truth: dict, ranks: list[int]) -> list[int]:
    """Of ``ranks``, those the job's own CPU timers show slow: forward+backward CPU per step (truth.json
    ``measured.compute_cpu_ms_by_rank``, the job's thread_time, not the analysis) at least
    ``OWN_TIMERS_SLOW_X`` times the median of the same stage's other DP replicas that no cause
    targets. A pure pipeline has no such peers (its stages differ by design) and older truth files
    lack the field: nothing confirmed there."""
    cpu = {int(r): float(v) for r, v in (truth.get("measured", {}).get("compute_cpu_ms_by_rank") or {}).items()}
    pp = truth["layout"]["pp"]
    targeted = {r for c in truth["causes"] for r in c["target"].get("ranks", [])}
    out = []
    for r in ranks:
        peers = [cpu[q] for q in cpu if q != r and q % pp == r % pp and q not in targeted and cpu[q] > 0]
        if r in cpu and peers and cpu[r] >= OWN_TIMERS_SLOW_X * statistics.median(peers):
            out.append(r)
    return out


def score_job(truth: dict, result: dict) -> JobScore:
    """One job's findings against its truth (rank-specific causes matched first)."""
    s = JobScore(job=truth["job"], status="ok" if result["ok"] else "error")
    doc = result.get("doc") or {}
    findings = list(doc.get("findings") or [])
    s.verdict, s.num_findings = doc.get("verdict"), len(findings)
    causes = sorted(truth["causes"], key=lambda c: c["cause"] in JOB_WIDE)
    dp, pp = truth["layout"]["dp"], truth["layout"]["pp"]
    used: dict[int, dict] = {}
    for c in causes:
        hit = next((i for i, f in enumerate(findings) if i not in used and match(c, f, dp, pp)), None)
        if hit is None:
            hit = next((i for i, u in used.items()
                        if same_rank_compute(u, c, dp) and match(c, findings[i], dp, pp)), None)
        (s.hits if hit is not None else s.misses).append(c["spec"])
        s.by_factor.append((c.get("factor"), hit is not None))
        s.by_kind.append((c["kind"], hit is not None))
        if hit is not None:
            used[hit] = c
    targeted = {r for c in truth["causes"] for r in c["target"].get("ranks", [])}
    named, extra = set(), set()
    for i, f in enumerate(findings):
        if i not in used:
            s.wrong.append(_describe(f))
        rs = set(_ranks(f))
        named |= rs
        if not (i in used and used[i]["cause"] in JOB_WIDE):
            extra |= rs - targeted
    s.named_ranks, s.extra_ranks = sorted(named), sorted(extra)
    s.extra_slow_by_own_timers = slow_by_own_timers(truth, s.extra_ranks)
    s.false_alarm = truth["clean"] and any(_ranks(f) or f.get("stages") for f in findings)
    s.rank_alarm = truth["clean"] and any(_ranks(f) for f in findings)
    if not result["ok"]:
        s.status = "error: " + result["error"]
    return s


def _bucket(f: float | None) -> str:
    if f is None:
        return "no factor"
    return next(f"{lo:.2f}-{hi:.2f}" if hi < 9 else f"{lo:.2f}+" for lo, hi in BUCKETS if f < hi)


def summarize(scores: list[JobScore], truths: dict[str, dict]) -> dict:
    hits = sum(len(s.hits) for s in scores)
    causes = hits + sum(len(s.misses) for s in scores)
    wrong = sum(len(s.wrong) for s in scores)
    named = sum(len(s.named_ranks) for s in scores)
    extra = sum(len(s.extra_ranks) for s in scores)
    own = sum(len(s.extra_slow_by_own_timers) for s in scores)
    clean = [s for s in scores if truths[s.job]["clean"]]
    buckets: dict[str, list[int]] = {}
    for f, ok in (x for s in scores for x in s.by_factor):
        b = buckets.setdefault(_bucket(f), [0, 0])
        b[0], b[1] = b[0] + ok, b[1] + 1
    kinds: dict[str, list[int]] = {}
    for k, ok in (x for s in scores for x in s.by_kind):
        b = kinds.setdefault(k, [0, 0])
        b[0], b[1] = b[0] + ok, b[1] + 1
    strong = [ok for s in scores for f, ok in s.by_factor if f is None or f >= 1.25]
    return {
        "num_jobs": len(scores), "num_causes": causes, "num_findings": hits + wrong,
        "precision": hits / max(hits + wrong, 1), "recall": hits / max(causes, 1),
        "recall_factor_ge_1.25": sum(strong) / max(len(strong), 1),
        "recall_by_factor": {k: {"named": h, "causes": n, "recall": h / max(n, 1)}
                             for k, (h, n) in sorted(buckets.items())},
        "recall_by_kind": {k: {"named": h, "causes": n, "recall": h / max(n, 1)}
                           for k, (h, n) in sorted(kinds.items())},
        "named_ranks": named, "extra_ranks": extra, "extra_rank_rate": extra / max(named, 1),
        "rank_precision": 1 - extra / max(named, 1),
        # the same, counting right the extra ranks the job's own timers show slow (no cause injected)
        "extra_ranks_slow_by_own_timers": own, "rank_precision_own_timers": 1 - (extra - own) / max(named, 1),
        "jobs_with_extra_ranks": sum(bool(s.extra_ranks) for s in scores) / max(len(scores), 1),
        "clean_jobs": len(clean),  # the rates are nan without clean jobs
        "clean_false_alarm_rate": sum(s.false_alarm for s in clean) / len(clean) if clean else float("nan"),
        "clean_rank_alarm_rate": sum(s.rank_alarm for s in clean) / len(clean) if clean else float("nan"),
        "clean_healthy_rate": sum(s.verdict == "healthy" for s in clean) / len(clean) if clean else float("nan"),
        "errors": sum(s.status != "ok" for s in scores),
        "verdicts": {v: sum(str(s.verdict) == v for s in scores) for v in sorted({str(s.verdict) for s in scores})},
    }
