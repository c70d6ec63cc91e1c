"""What each real corpus job's causes cost, measured (issue 24): its clean twin.

    python benchmarks/corpus_impact.py CORPUS          # runs the twins it lacks; resumable

A cause's drawn factor is not what it costs the job: a 1.3x heavy first stage of a pipeline whose last
stage already carries the loss, or a slow rank whose extra CPU work takes cores from the others on a
2-core host, slows the step by much less or much more than 1.3x. For each job the twin is the same job
(layout, model, seed, steps, Tracer and torch.profiler both on, as the job ran) with no cause injected;
the job and its twin run for real back to back (``run_twin``), and ``CORPUS/jobNNN/impact.json`` holds
both median wall steps and their ratio, the job's **measured impact**. Run it on a quiet machine. The clean
jobs' twins give the run-to-run noise of that ratio. Like the generator,
this never loads laggard's analysis (it checks). The scorer (real_corpus.py score) reports recall by
measured impact for jobs with one cause, beside recall by drawn factor."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# impact buckets: within the noise of two runs; a slowdown under the healthy threshold's reach; a real one
IMPACT_BUCKETS = ((0.0, 1.05), (1.05, 1.25), (1.25, float("inf")))


def _corpus_module():  # noqa: ANN202 - benchmarks/real_corpus.py (not a package)
    sys.path.insert(0, str(HERE))
    try:
        import real_corpus
    finally:
        sys.path.remove(str(HERE))
    return real_corpus


def median_step_ms(step_ms: list[float]) -> float:
    """A run's typical wall step: the median over its traced steps but the last (which also writes
    the profiler's trace)."""
    xs = step_ms[:-1] if len(step_ms) > 2 else step_ms
    return float(np.median(xs))


def _median_run_ms(plan, steps: int) -> float | None:  # noqa: ANN001 - a real_corpus.JobPlan
    """Run ``plan`` for real (traced as the corpus jobs are, into a scratch directory); its typical wall
    step (median over ranks per step, then ``median_step_ms``), or None when it failed."""
    from laggard.demo.launch import run_job

    rc = _corpus_module()
    with tempfile.TemporaryDirectory(prefix="twin-") as tmp:
        res = run_job(rc.job_config(plan, Path(tmp), steps))
    if res is None or not res.ok:
        return None
    step_ms = 1e3 * np.median(np.array([res.ranks[r]["step_s"] for r in sorted(res.ranks)]), axis=0)
    return median_step_ms(step_ms.tolist())


def run_twin(job_dir: Path, plan, steps: int, *, first_twin: bool = False) -> dict | None:  # noqa: ANN001
    """The job again and its clean twin, back to back (in the order ``first_twin`` says, alternated
    over the corpus so that a drift in the machine's load cancels): their ratio is the impact. The run
    that wrote the corpus is not the reference: a host's load moves a step 2x between hours (twins
    run an hour after the corpus, beside other work, read 0.47-1.50 on clean jobs)."""
    from dataclasses import replace

    twin = replace(plan, causes=[])
    order = [("twin", twin), ("job", plan)] if first_twin else [("job", plan), ("twin", twin)]
    ms = {name: _median_run_ms(p, steps) for name, p in order}
    if ms["job"] is None or ms["twin"] is None:
        return None
    truth = json.loads((job_dir / "truth.json").read_text())
    return {"job": plan.job_id, "job_step_ms": round(ms["job"], 2), "twin_step_ms": round(ms["twin"], 2),
            "impact": round(ms["job"] / ms["twin"], 4), "order": [n for n, _ in order],
            "corpus_run_step_ms": round(median_step_ms(truth["measured"]["step_ms"]), 2),
            "causes": [c["spec"] for c in truth["causes"]]}


def run_twins(corpus: Path, max_causes: int | None = None) -> dict[str, list[str]]:
    """Run the twin of every job that has a truth.json and no impact.json (and, with ``max_causes``,
    at most that many causes: the scorer reads the clean and single-cause jobs' impacts only)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    rc = _corpus_module()
    before = set(sys.modules)
    plan_doc = json.loads((corpus / "plan.json").read_text())
    plans = {p.job_id: p for p in rc.plan_corpus(plan_doc["seed"], plan_doc["jobs"])}
    todo = [j for j in sorted(plans)
            if (corpus / j / "truth.json").exists() and not (corpus / j / "impact.json").exists()]
    if max_causes is not None:
        todo = [j for j in todo if len(json.loads((corpus / j / "truth.json").read_text())["causes"]) <= max_causes]
    out: dict[str, list[str]] = {"done": [], "failed": []}
    with rc.stderr_to(corpus / "impact.log"):  # the ranks' stderr (profiler chatter)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
            task = bar.add_task("twins", total=len(todo))
            for job in todo:
                bar.update(task, description=f"twin of {job}")
                doc = run_twin(corpus / job, plans[job], plan_doc["steps"], first_twin=len(out["done"]) % 2 == 1)
                if doc is None:
                    out["failed"].append(job)
                else:
                    rc._write_json(corpus / job / "impact.json", doc)  # noqa: SLF001
                    out["done"].append(job)
                bar.advance(task)
    rc.check_no_analysis(before, "the twin runner")
    return out


def _bucket(x: float) -> str:
    return next(f"{lo:.2f}-{hi:.2f}" if hi < 9 else f"{lo:.2f}+" for lo, hi in IMPACT_BUCKETS if x < hi)


def recall_by_impact(corpus: Path, scores: list, truths: dict[str, dict]) -> dict:  # noqa: ANN001 - JobScores
    """Recall of the jobs with one cause, bucketed by measured impact; and the clean twins' spread
    (the noise of the ratio)."""
    buckets: dict[str, list[int]] = {}
    clean: list[float] = []
    for s in scores:
        path = corpus / s.job / "impact.json"
        if not path.exists():
            continue
        impact = json.loads(path.read_text())["impact"]
        causes = truths[s.job]["causes"]
        if not causes:
            clean.append(impact)
        elif len(causes) == 1:
            b = buckets.setdefault(_bucket(impact), [0, 0])
            b[0], b[1] = b[0] + bool(s.hits), b[1] + 1
    out = {k: {"named": h, "causes": n, "recall": h / max(n, 1)} for k, (h, n) in sorted(buckets.items())}
    return {"single_cause": out,
            "clean_twin_ratio": {"n": len(clean), "median": float(np.median(clean)) if clean else None,
                                 "max_abs_dev": float(np.max(np.abs(np.array(clean) - 1))) if clean else None}}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--max-causes", type=int, default=None,
                    help="only jobs with at most this many causes (1: the ones recall-by-impact reads)")
    a = ap.parse_args(argv)
    if not (a.corpus / "plan.json").exists():
        print(f"{a.corpus}: no corpus there (run: python benchmarks/real_corpus.py generate {a.corpus})",
              file=sys.stderr)
        return 2
    out = run_twins(a.corpus, a.max_causes)
    print(f"ran {len(out['done'])} twins, failed {len(out['failed'])}"
          + (f": {', '.join(out['failed'])}" if out["failed"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
