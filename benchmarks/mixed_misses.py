"""Replay the jobs of the mixture sweep (bench_diagnose_mixed) that the diagnosis gets wrong.

The full sweep simulates every job's truth (2-10 SimPy runs each, ~7 minutes on two cores); this
driver caches each job's simulated truth on disk, so that iterating on a detector re-runs only the
analysis and the diagnosis of the jobs it names::

    python benchmarks/mixed_misses.py --jobs 200              # every job; lists the wrong ones
    python benchmarks/mixed_misses.py --failed                # only those listed last time
    python benchmarks/mixed_misses.py --only gc --verbose     # jobs with a GC cause, with findings
    python benchmarks/mixed_misses.py --idx 17,42 --verbose   # these jobs
    python benchmarks/mixed_misses.py --seed 7 --jobs 100     # another draw of the sweep

A job is wrong when a required cause is missed, a finding matches no cause, or a named cause's
predicted gain is over 10% off the simulator's. Not a benchmark (no figures): a tool to read misses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from laggard.groundtruth.evaluate_mixed import (
    MixOutcome,
    MixScenario,
    by_kind,
    mixed_scenarios,
    required,
    score_job,
    summary,
)

CACHE = Path(os.environ.get("LAGGARD_MIX_CACHE", "/tmp/laggard-mix-cache"))


def _truth(seed: int, idx: int, sc: MixScenario):
    from laggard.diagnose import DiagnoseConfig
    from laggard.groundtruth.dessim import simulate_with_truth

    key = hashlib.sha1(repr((sc.cfg, [c.spec() for c in sc.causes])).encode()).hexdigest()[:12]
    path = CACHE / f"s{seed}-{idx}-{key}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    truth = simulate_with_truth(sc.cfg, sc.causes, alone_below=DiagnoseConfig().min_share)
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(truth))
    tmp.replace(path)
    return truth


def one(args: tuple[int, int, MixScenario, bool]) -> tuple[int, MixOutcome, str]:
    """Diagnose one job (its truth from the cache); returns (index, outcome, a report when wrong)."""
    from laggard.analysis.pipeline import analyze
    from laggard.diagnose import DiagnoseConfig, diagnose
    from laggard.groundtruth.dessim import to_job

    seed, idx, sc, verbose = args
    truth = _truth(seed, idx, sc)
    res = analyze(to_job(truth.sim), diagnose=False)
    d = diagnose(res)
    full = score_job(truth, d)
    single = score_job(truth, diagnose(res, config=DiagnoseConfig(single_cause=True)))
    out = MixOutcome(scenario=sc, full=full, single=single, num_workers=sc.cfg.num_ranks)
    bad_gain = [e for e in full.gain_errors if e > 0.10]
    if not (full.missed or full.wrong or bad_gain or verbose):
        return idx, out, ""
    lines = [f"job {idx}: dp{sc.cfg.dp} x pp{sc.cfg.pp} seed={sc.cfg.seed} slowdown {truth.slowdown:.3f} "
             f"(meas/ideal {res.T_s / res.T_ideal_s:.3f}); missed {full.missed} wrong {full.wrong} "
             f"gain errs {[round(e, 3) for e in full.gain_errors]}"]
    for ct in truth.causes:
        lines.append(f"   truth {ct.cause.spec():55s} gain {ct.gain:.3f} effect {ct.effect_share:.2f} "
                     f"alone {ct.alone_gain:.3f} req={required(truth, ct)}")
    for f in d.findings:
        lines.append(f"   found {f.cause:18s} ranks {[w['rank'] for w in f.workers][:10]} stages {f.stages} "
                     f"score {f.score:.2f} share {f.share:.2f} gain {f.gain:.3f}")
    lines.append(f"   combined {d.combined_share:.2f} unexplained {d.unexplained:.2f}")
    if verbose:
        lines += _candidates(res)
    return idx, out, "\n".join(lines)


def _candidates(res) -> list[str]:  # noqa: ANN001 (an Analysis)
    """Every detector's nominees with their own score (before the joint attribution)."""
    from laggard.diagnose import DiagnoseConfig, candidates
    from laggard.diagnose.context import Ctx
    from laggard.diagnose.explain import attribute

    ctx = Ctx(res)
    cands = candidates(ctx, DiagnoseConfig())
    attribute(ctx, cands, DiagnoseConfig())
    return [f"   cand  {c.finding.cause:18s} ranks {[w['rank'] for w in c.finding.workers][:10]} "
            f"stages {c.finding.stages} score {c.finding.score:.2f} gain {c.finding.gain:.3f} "
            f"{' '.join(' '.join(ch.args()) for ch in c.changes)[:160]}" for c in cands]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--max-causes", type=int, default=4)
    ap.add_argument("--only", help="jobs with a cause of this kind (slow-worker, gc, slow-link, ...)")
    ap.add_argument("--idx", help="comma-separated job indices")
    ap.add_argument("--failed", action="store_true", help="the jobs that were wrong in the last run")
    ap.add_argument("--verbose", action="store_true", help="print every job with its candidates")
    ap.add_argument("--procs", type=int, default=2)
    args = ap.parse_args()
    scs = mixed_scenarios(args.jobs, seed=args.seed, max_causes=args.max_causes)
    idx = list(range(len(scs)))
    failed_path = CACHE / f"failed-s{args.seed}-{args.jobs}.json"
    if args.idx:
        idx = [int(x) for x in args.idx.split(",")]
    elif args.failed:
        idx = json.loads(failed_path.read_text())
    if args.only:
        idx = [i for i in idx if any(c.kind == args.only for c in scs[i].causes)]
    work = sorted(((args.seed, i, scs[i], args.verbose) for i in idx), key=lambda a: -a[2].cfg.num_ranks)
    with ProcessPoolExecutor(args.procs) as ex:
        results = sorted(ex.map(one, work, chunksize=1), key=lambda r: r[0])
    for _, _, text in results:
        if text:
            print(text)
    outs = [o for _, o, _ in results]
    wrong = [i for i, o, _ in results if _is_wrong(o)]
    if not args.idx and not args.failed and not args.only:
        CACHE.mkdir(parents=True, exist_ok=True)
        failed_path.write_text(json.dumps(wrong))
    s = summary(outs)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()}))
    print(json.dumps({k: f"{v['named']}/{v['named'] + v['missed']}" for k, v in by_kind(outs).items()}))
    print(f"wrong jobs: {wrong}", file=sys.stderr)
    return 0


def _is_wrong(o: MixOutcome) -> bool:
    f = o.full
    return bool(f.missed or f.wrong or any(e > 0.10 for e in f.gain_errors))


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
