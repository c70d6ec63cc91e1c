"""The real-process corpus (benchmarks/real_corpus.py, issue 24) at a reduced size for `make bench`:
LAGGARD_BENCH_CORPUS_JOBS jobs (default 8, ~2-3 minutes on two cores; 0 skips it) of the default
seed, generated into out/corpus-bench (kept: a second run only scores), analyzed and scored. The
full corpus (64 jobs) is `make corpus` + `make corpus-score`, which write the `real_corpus` entry."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NUM_JOBS = int(os.environ.get("LAGGARD_BENCH_CORPUS_JOBS", "8"))


def _corpus_module():
    spec = importlib.util.spec_from_file_location("real_corpus", HERE / "real_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["real_corpus"] = mod
    spec.loader.exec_module(mod)
    return mod


def run() -> list[dict]:
    if NUM_JOBS <= 0:
        return []
    rc = _corpus_module()
    corpus = HERE.parent / "out" / f"corpus-bench-{NUM_JOBS}"
    done = rc.generate(corpus, num_jobs=NUM_JOBS, quiet=True)
    print(f"  corpus {corpus}: ran {len(done['done'])}, kept {len(done['skipped'])}, failed {len(done['failed'])}",
          file=sys.stderr)
    out = rc.score(corpus)
    report = rc.load_sibling("corpus_report")
    sim = report.simulator_figures()
    report.print_report(out, sim)
    return report.figures(out, sim)
