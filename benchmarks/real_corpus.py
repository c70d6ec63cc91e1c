"""Ground truth from real processes (issue 24): a corpus of real multi-process training jobs with
injected stragglers, and the scorer that measures `laggard analyze` against it.

    python benchmarks/real_corpus.py generate out/corpus [--jobs 64] [--seed 2024]   # resumable
    python benchmarks/real_corpus.py score out/corpus                               # -> results.json
    python benchmarks/real_corpus.py plan [--jobs 64] [--seed 2024]                 # the draw, nothing run
    python benchmarks/corpus_check.py out/corpus                                    # truth vs the raw shards
    python benchmarks/corpus_impact.py out/corpus                                   # each job's clean twin

**Generate.** One seed draws every job: its layout (DDP 2-4 ranks, dp 2 x pp 2, dp 1 x pp 3, dp 1 x
pp 4), its causes (none: at least 8 of 64 clean; one; or two of different kinds), their targets
(ranks, stages, links), strengths (factors 1.15-2.0, a third in each of the buckets 1.15-1.25,
1.25-1.5, 1.5-2.0) and the job's own seed. Each job is
`examples/demo_job.py` run for real (`laggard.demo.launch.run_job`: one process per rank, gloo on
127.0.0.1), traced by laggard's Tracer and by torch.profiler in the same run, and written to
`CORPUS/jobNNN/{trace/, profiler/ (gzipped), truth.json}`. A job with a truth.json is skipped (resume); a job
that fails leaves `failed.json` and is skipped (`--retry-failed` runs it again). The generator
imports the job launcher and the injection syntax only, never laggard's analysis (it checks).

A factor is exact where the cause scales compute (slow-worker, heavy-stage: extra real work of
(factor - 1) x each compute op's own time). For time added per step (host-stall, slow-link,
launch-delay, gc-pauses) the draw aims at a factor over the layout's typical step (NOMINAL_STEP_MS),
but the machine's load moves that step 2x, so truth.json's factor is measured on the job itself:
1 + added ms per step / (the job's median wall step, from its own timers, less the time every
injected cause adds per step; for a bursty stall: a stalled step over the others); the drawn one
is kept as factor_drawn. seqlen-imbalance has no factor.

**Score.** `laggard analyze --json` (a subprocess, as a user runs it: no layout hints) on each
job's Tracer trace and profiler trace; findings against truth.json (`match`, `score_job`). Precision and
recall of named (cause, target); the rate of extra ranks (named by a
finding although no cause targets them); false alarms on clean jobs (any finding naming a rank,
stage or link); recall by factor bucket. Printed beside the simulator sweep's stored figures
(`bench_diagnose_mixed` in results.json) and written to results.json (`real_corpus`) by
`corpus_report.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def load_sibling(name: str):  # noqa: ANN201 - a module of benchmarks/ (not a package)
    import importlib.util

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


_match = load_sibling("corpus_match")  # matching findings to the truth (pure functions)
BUCKETS, JobScore, match, score_job, summarize = (_match.BUCKETS, _match.JobScore, _match.match, _match.score_job,
                                                  _match.summarize)
RESULTS = HERE / "results.json"  # where `score` writes its figures
DEFAULT_SEED, DEFAULT_JOBS, DEFAULT_STEPS = 2024, 64, 16
FAMILIES = ("ddp", "dp2xpp2", "dp1xpp3", "dp1xpp4")
KINDS = ("slow-worker", "host-stall-steady", "host-stall-bursty", "slow-link", "heavy-stage", "gc-pauses",
         "seqlen-imbalance", "launch-delay")
# slow workers twice as often: the 1.15-1.35x slow node is the straggler that costs money (issue 24)
KIND_WEIGHTS = {k: 2.0 if k == "slow-worker" else 1.0 for k in KINDS}
NEEDS_PIPELINE = {"slow-link", "heavy-stage"}
FACTOR_RANGE = (1.15, 2.0)
MICROBATCHES = 4
# wall ms per step of clean jobs of each (dp, pp) on this 2-core machine (d_model 128, 128 tokens x 4
# per microbatch, 4 microbatches, 2 blocks per rank), the base of the nominal factors
NOMINAL_STEP_MS = {(2, 1): 170.0, (3, 1): 220.0, (4, 1): 300.0, (2, 2): 330.0, (1, 3): 230.0, (1, 4): 300.0}
# the modules that analyze a trace: the generator must not load them
ANALYSIS_MODULES = ("laggard.analysis", "laggard.diagnose", "laggard.whatif", "laggard.engine", "laggard.io")


# ---------------------------------------------------------------- the draw


@dataclass(kw_only=True)
class JobPlan:
    job_id: str
    dp: int
    pp: int
    job_seed: int
    causes: list[dict] = field(default_factory=list)

    @property
    def layout(self) -> str:
        return f"ddp{self.dp}" if self.pp == 1 else f"dp{self.dp}xpp{self.pp}"


def _cause_sets(num_jobs: int, rng: np.random.Generator) -> list[tuple[str, ...]]:
    """About 15% clean (at least 1; 10 of 64), 30% pairs of different kinds, the rest single causes
    with the kinds dealt round-robin in shuffled rounds; then shuffled."""
    n_clean = max(1, round(0.15 * num_jobs))
    n_pairs = round(0.3 * num_jobs) if num_jobs >= 4 else 0
    n_single = max(num_jobs - n_clean - n_pairs, 0)
    rounds = [k for k in KINDS for _ in range(int(KIND_WEIGHTS[k]))]
    singles: list[tuple[str, ...]] = []
    while len(singles) < n_single:
        singles += [(str(k),) for k in rng.permutation(rounds)][: n_single - len(singles)]
    pairs: list[tuple[str, ...]] = []
    weights = np.array([KIND_WEIGHTS[k] for k in KINDS]) / sum(KIND_WEIGHTS.values())
    while len(pairs) < n_pairs:
        a, b = (str(k) for k in rng.choice(KINDS, size=2, replace=False, p=weights))
        if not (a.startswith("host-stall") and b.startswith("host-stall")):
            pairs.append((a, b))
    sets = [()] * n_clean + singles + pairs
    return [sets[i] for i in rng.permutation(len(sets))][:num_jobs]


def _families(sets: list[tuple[str, ...]], rng: np.random.Generator) -> list[str]:
    """Layout families in shuffled rounds of four (each family a quarter of the jobs); a job whose causes
    need a pipeline (slow-link, heavy-stage) swaps its DDP family with a job that needs none."""
    fams = [str(f) for _ in range(0, len(sets), 4) for f in rng.permutation(FAMILIES)][: len(sets)]
    needs = [bool(NEEDS_PIPELINE & set(s)) for s in sets]
    for i in range(len(sets)):
        if needs[i] and fams[i] == "ddp":
            j = next((j for j in range(len(sets)) if fams[j] != "ddp" and not needs[j]), None)
            if j is None:
                raise ValueError("no pipeline layout left for a cause that needs one")
            fams[i], fams[j] = fams[j], fams[i]
    return fams


def _factor(rng: np.random.Generator) -> float:
    """A third of the factors in each bucket (1.15-1.25, 1.25-1.5, 1.5-2.0), uniform within it: the
    curve below 1.25x gets as many causes as the rest."""
    lo, hi = BUCKETS[int(rng.integers(len(BUCKETS)))]
    return round(float(rng.uniform(lo, min(hi, FACTOR_RANGE[1]))), 3)


def draw_cause(kind: str, dp: int, pp: int, rng: np.random.Generator) -> dict:
    """One cause on a dp x pp job: its --inject spec, target, factor and how the factor is meant."""
    world, step_ms, f = dp * pp, NOMINAL_STEP_MS[(dp, pp)], _factor(rng)
    rec: dict = {"kind": kind, "factor": f, "factor_basis": "measured: 1 + added ms per step / the rest of the step"}
    if kind == "slow-worker":
        r = int(rng.integers(world))
        rec.update(spec=f"slow-worker:rank={r},factor={f}", target={"scope": "rank", "ranks": [r]},
                   factor_basis="exact: compute x factor")
    elif kind == "heavy-stage":
        s = int(rng.integers(pp))
        rec.update(spec=f"heavy-stage:stage={s},factor={f}", factor_basis="exact: the stage's compute x factor",
                   target={"scope": "stage", "stage": s, "ranks": [d * pp + s for d in range(dp)]})
    elif kind.startswith("host-stall"):
        r, every = int(rng.integers(world)), 1 if kind.endswith("steady") else int(rng.integers(3, 6))
        ms = round((f - 1) * step_ms, 1)
        rec.update(spec=f"host-stall:rank={r},ms={ms},every={every}", target={"scope": "rank", "ranks": [r]},
                   every=every, added_ms_per_step=ms,
                   factor_basis="measured, per stalled step: 1 + ms / the rest of the step")
    elif kind == "slow-link":
        d, s = int(rng.integers(dp)), int(rng.integers(pp - 1))
        src, dst = (d * pp + s, d * pp + s + 1) if rng.random() < 0.5 else (d * pp + s + 1, d * pp + s)
        delay = round((f - 1) * step_ms / MICROBATCHES, 2)  # one transfer per microbatch on the link
        rec.update(spec=f"slow-link:src={src},dst={dst},delay_ms={delay}", added_ms_per_step=MICROBATCHES * delay,
                   target={"scope": "link", "link": [src, dst], "ranks": sorted([src, dst])})
    elif kind == "gc-pauses":  # rare long pauses: a collection at 10-35% of forward passes, up to 150 ms
        prob = float(rng.uniform(0.1, 0.35))
        pause = round(min(150.0, (f - 1) * step_ms / (MICROBATCHES * prob)))
        prob = round(min(0.6, (f - 1) * step_ms / (MICROBATCHES * pause)), 3)  # more often where 150 ms is short
        f = round(1 + prob * MICROBATCHES * pause / step_ms, 3)
        rec.update(spec=f"gc-pauses:prob={prob},pause_ms={pause}", factor=f, target={"scope": "job"},
                   added_ms_per_step=round(prob * MICROBATCHES * pause, 2))
    elif kind == "seqlen-imbalance":
        rec.update(spec=f"seqlen-imbalance:sigma={round(float(rng.uniform(0.3, 0.8)), 2)}", factor=None,
                   factor_basis=None, target={"scope": "job"})
    elif kind == "launch-delay":
        ms = round((f - 1) * step_ms / (2 * MICROBATCHES + 1), 2)  # before each forward, backward, optimizer
        rec.update(spec=f"launch-delay:ms={ms}", target={"scope": "job"}, added_ms_per_step=(2 * MICROBATCHES + 1) * ms)
    else:
        raise ValueError(f"unknown cause kind {kind!r}")
    rec["cause"] = rec["spec"].split(":")[0]
    return rec


def plan_corpus(seed: int = DEFAULT_SEED, num_jobs: int = DEFAULT_JOBS) -> list[JobPlan]:
    rng = np.random.default_rng(seed)
    sets = _cause_sets(num_jobs, rng)
    plans = []
    for i, (kinds, fam) in enumerate(zip(sets, _families(sets, rng), strict=True)):
        dp, pp = (int(rng.integers(2, 5)), 1) if fam == "ddp" else (int(fam[2]), int(fam[-1]))
        causes = [draw_cause(k, dp, pp, rng) for k in kinds]
        plans.append(JobPlan(job_id=f"job{i:03d}", dp=dp, pp=pp, job_seed=int(rng.integers(2**31)), causes=causes))
    return plans


# ---------------------------------------------------------------- running the jobs


def shaped_links_available() -> bool:
    """Slow links throttled in the network (root, ip and tc: laggard.demo.netshape) rather than a sleep
    before each send, which a profiler sees as the sender's host time; LAGGARD_CORPUS_SLEEP_LINKS=1
    keeps the sleep (the corpora generated before 2026-11-28 have it)."""
    from laggard.demo.netshape import unavailable

    return os.environ.get("LAGGARD_CORPUS_SLEEP_LINKS") != "1" and unavailable() is None


def run_spec(cause: dict, shaped: bool) -> str:
    """The --inject spec a cause runs with: its drawn spec, a slow link shaped where it can be."""
    return cause["spec"] + (",shaped=1" if shaped and cause["cause"] == "slow-link" else "")


def job_config(plan: JobPlan, job_dir: Path, steps: int, profiler: str = "ops",  # noqa: ANN201 - a JobConfig
               shaped: bool = False):
    from laggard.demo.launch import JobConfig
    from laggard.groundtruth.inject import parse_injections

    return JobConfig(dp=plan.dp, pp=plan.pp, steps=steps, microbatches=MICROBATCHES, batch_size=4, seq_len=128,
                     d_model=128, num_heads=4, num_layers=2 * plan.pp if plan.pp > 1 else 2, seed=plan.job_seed,
                     injections=parse_injections([run_spec(c, shaped) for c in plan.causes]), freeze_gc=True,
                     trace_dir=str(job_dir / "trace"), profiler_dir=str(job_dir / "profiler") if profiler else None,
                     profiler_gc=profiler == "gc")


def measured_factors(causes: list[dict], traced: list[int], step_ms: np.ndarray) -> float:
    """Set each time-adding cause's factor from the job's own wall step (median over ranks, per traced
    step): 1 + its added ms per step / the base step, the median calm step (no bursty stall) less
    every steady cause's added time; the drawn factor is kept as factor_drawn. Returns the base (ms)."""
    bursty = {s for c in causes if c.get("every", 1) > 1 for s in c["steps"]}
    calm = [i for i, s in enumerate(traced) if s not in bursty] or list(range(len(traced)))
    base = float(np.median(step_ms[calm])) - sum(c.get("added_ms_per_step", 0.0) for c in causes
                                                   if c.get("every", 1) == 1)
    for c in causes:
        if "added_ms_per_step" in c and base > 0:
            c["factor_drawn"], c["factor"] = c["factor"], round(1 + c["added_ms_per_step"] / base, 3)
    return base


def truth_of(plan: JobPlan, cfg, res, seed: int) -> dict:  # noqa: ANN001
    traced = list(range(cfg.warmup_steps, cfg.warmup_steps + cfg.steps))
    causes = []
    for c in plan.causes:
        c = dict(c)
        if c["cause"] == "host-stall":
            c["steps"] = [s for s in traced if s % c["every"] == 0]
        if c["cause"] == "slow-link":
            shaped = any(i.cause == "slow-link" and i.params.get("shaped") for i in cfg.injections)
            c["spec"] = run_spec(c, shaped)
            c["injected_by"] = ("the link's bandwidth throttled in the network (tc HTB, each rank in its own "
                                "network namespace)" if shaped else "the sender sleeps before each send")
        causes.append(c)
    ranks = sorted(res.ranks)
    step_ms = 1e3 * np.median(np.array([res.ranks[r]["step_s"] for r in ranks]), axis=0)
    base_ms = measured_factors(causes, traced, step_ms)
    return {
        "job": plan.job_id, "corpus_seed": seed, "job_seed": plan.job_seed, "clean": not causes,
        "layout": {"name": plan.layout, "dp": plan.dp, "pp": plan.pp, "world_size": plan.dp * plan.pp,
                   "rank": "dp_rank * pp + stage"},
        "model": {k: getattr(cfg, k) for k in ("steps", "warmup_steps", "microbatches", "batch_size", "seq_len",
                                              "d_model", "num_layers", "num_heads", "freeze_gc", "profiler_gc")},
        "traced_steps": traced,
        "causes": causes,
        # medians: the last step also writes the profiler's trace
        "measured": {"wall_s": round(res.wall_s, 2), "step_ms": [round(float(x), 2) for x in step_ms],
                     "base_step_ms": round(base_ms, 2),
                     "step_ms_by_rank": {r: round(1e3 * float(np.median(res.ranks[r]["step_s"])), 2) for r in ranks},
                     "cpu_ms_by_rank": {r: round(1e3 * float(np.median(res.ranks[r]["step_cpu_s"])), 2) for r in ranks},
                     # each rank's forward and backward passes alone, by its own CPU timers (injected burns
                     # included): a rank slow with no cause injected (a noisy neighbour) shows here
                     "compute_cpu_ms_by_rank": {
                         r: round(1e3 * float(np.median(res.ranks[r].get("compute_cpu_s") or [0.0])), 2)
                         for r in ranks}},
        "nominal_step_ms": NOMINAL_STEP_MS[(plan.dp, plan.pp)],
    }


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def _check_plan(corpus: Path, seed: int, num_jobs: int, steps: int) -> None:
    """CORPUS/plan.json: the draw, written once; resuming needs the same arguments and the same draw."""
    head = {"seed": seed, "jobs": num_jobs, "steps": steps}
    doc = {**head, "jobs_plan": [asdict(p) for p in plan_corpus(seed, num_jobs)]}
    path = corpus / "plan.json"
    if path.exists():
        old = json.loads(path.read_text())
        if {k: old.get(k) for k in head} != head:
            raise SystemExit(f"{corpus} holds a corpus of --seed {old.get('seed')} --jobs {old.get('jobs')} --steps "
                             f"{old.get('steps')}: give the same, or another directory")
        if old != json.loads(json.dumps(doc)):
            raise SystemExit(f"{corpus}: this generator draws other jobs than the ones there (its code changed): "
                             "use another directory")
        return
    corpus.mkdir(parents=True, exist_ok=True)
    _write_json(path, doc)


def gzip_profiler(job_dir: Path) -> None:
    """profiler/rank*.json -> rank*.json.gz (what `laggard analyze` reads as well): 30 MB -> 3 MB a rank."""
    import gzip

    for path in sorted((job_dir / "profiler").glob("rank*.json")):
        with open(path, "rb") as src, gzip.open(path.with_name(path.name + ".gz"), "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        path.unlink()


def run_one(plan: JobPlan, job_dir: Path, steps: int, seed: int, on_step,  # noqa: ANN001
            profiler: str = "ops") -> dict | None:
    """Run one job; its truth (written), or None when it failed (failed.json written)."""
    from laggard.demo.launch import run_job

    for sub in ("trace", "profiler"):
        shutil.rmtree(job_dir / sub, ignore_errors=True)
    job_dir.mkdir(parents=True, exist_ok=True)
    cfg = job_config(plan, job_dir, steps, profiler, shaped=shaped_links_available())
    t0 = time.perf_counter()
    try:
        res = run_job(cfg, on_progress=on_step)
    except Exception as e:  # noqa: BLE001 - a job that cannot start is recorded like one that fails
        res, err = None, f"{type(e).__name__}: {e}"
    if res is None or not res.ok:
        fail = {"job": plan.job_id, "specs": [c["spec"] for c in plan.causes], "layout": plan.layout,
                "wall_s": round(time.perf_counter() - t0, 1),
                "failures": err if res is None else {str(r): m for r, m in res.failures.items()}}
        _write_json(job_dir / "failed.json", fail)
        return None
    gzip_profiler(job_dir)
    truth = truth_of(plan, cfg, res, seed)
    _write_json(job_dir / "truth.json", truth)
    (job_dir / "failed.json").unlink(missing_ok=True)
    return truth


def generate(corpus: Path, *, seed: int = DEFAULT_SEED, num_jobs: int = DEFAULT_JOBS, steps: int = DEFAULT_STEPS,
             retry_failed: bool = False, quiet: bool = False, only: set[str] | None = None, parallel: int = 1,
             profiler: str = "ops") -> dict:
    """Run every job of the draw that CORPUS does not hold yet; {'done', 'skipped', 'failed'} job ids.
    ``only``: these job ids of the draw alone; ``parallel`` > 1: that many jobs at once (a machine with a
    core per rank of each: on 2 cores jobs at once would load each other). ``profiler``: "ops" (torch.profiler
    beside the Tracer), "gc" (also Python's collections: the stacks and record_python_gc_info) or "" (none)."""
    before = set(sys.modules)  # (a caller may have loaded the analysis itself: make bench)
    _check_plan(corpus, seed, num_jobs, steps)
    plans = [p for p in plan_corpus(seed, num_jobs) if only is None or p.job_id in only]
    if parallel > 1:
        out = _generate_parallel(corpus, plans, steps, seed, retry_failed, parallel, profiler)
    else:
        out = _generate_serial(corpus, plans, steps, seed, retry_failed, quiet, profiler)
    check_no_analysis(before, "the generator")
    return out


def _todo(job_dir: Path, retry_failed: bool) -> bool:
    return not ((job_dir / "truth.json").exists() or ((job_dir / "failed.json").exists() and not retry_failed))


def _generate_parallel(corpus: Path, plans: list[JobPlan], steps: int, seed: int, retry_failed: bool,
                       parallel: int, profiler: str) -> dict:
    out: dict[str, list[str]] = {"done": [], "skipped": [], "failed": []}
    todo = [p for p in plans if _todo(corpus / p.job_id, retry_failed)]
    out["skipped"] = [p.job_id for p in plans if p not in todo]
    with stderr_to(corpus / "generate.log"), ThreadPoolExecutor(parallel) as pool:
        truths = pool.map(lambda p: run_one(p, corpus / p.job_id, steps, seed, None, profiler), todo)
        for plan, truth in zip(todo, truths, strict=True):
            out["done" if truth else "failed"].append(plan.job_id)
    return out


def _generate_serial(corpus: Path, plans: list[JobPlan], steps: int, seed: int, retry_failed: bool, quiet: bool,
                     profiler: str) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out: dict[str, list[str]] = {"done": [], "skipped": [], "failed": []}
    console = Console(file=sys.stdout, quiet=quiet)
    with stderr_to(corpus / "generate.log"):  # the ranks' stderr (profiler chatter)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            jobs = bar.add_task("corpus", total=len(plans))
            steps_task = bar.add_task("  steps", total=steps)
            for plan in plans:
                job_dir = corpus / plan.job_id
                if not _todo(job_dir, retry_failed):
                    out["skipped"].append(plan.job_id)
                    bar.advance(jobs)
                    continue
                specs = " + ".join(c["spec"] for c in plan.causes) or "clean"
                bar.update(jobs, description=f"{plan.job_id} {plan.layout} {specs}"[:90])
                bar.reset(steps_task, total=steps)
                truth = run_one(plan, job_dir, steps, seed, lambda k, n, loss: bar.update(steps_task, completed=k),
                                profiler)
                out["done" if truth else "failed"].append(plan.job_id)
                bar.advance(jobs)
    return out


@contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 appended to ``path`` (the ranks' processes inherit it) for the block."""
    with open(path, "a") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def check_no_analysis(before: set[str], who: str) -> None:
    """Raise when laggard's analysis was loaded since ``before`` (``sys.modules`` then)."""
    loaded = sorted(m for m in set(sys.modules) - before if m.startswith(ANALYSIS_MODULES))
    if loaded:
        raise RuntimeError(f"{who} loaded laggard's analysis code: {', '.join(loaded)}")


# ---------------------------------------------------------------- scoring


def _laggard_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("laggard")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from laggard.cli import entry; entry()"]


def analyze_job(job_dir: Path, which: str, *, cached: bool, timeout_s: float = 600.0) -> dict:
    """`laggard analyze` on the job's Tracer trace ('tracer') or profiler trace ('profiler'):
    {'ok', 'doc' (the --json document) | 'error', 'seconds'}; kept in job_dir/analysis/."""
    src = job_dir / ("trace" if which == "tracer" else "profiler")
    dest = job_dir / "analysis" / f"{which}.json"
    if cached and dest.exists():
        return {"ok": True, "doc": json.loads(dest.read_text()), "seconds": None}
    dest.parent.mkdir(exist_ok=True)
    dest.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run([*_laggard_cmd(), "--no-cache", "analyze", str(src), "--json", str(dest), "-q"],
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout_s:.0f} s", "seconds": timeout_s}
    secs = round(time.perf_counter() - t0, 2)
    (dest.parent / f"{which}.stderr").write_text(p.stderr)
    if p.returncode != 0 or not dest.exists():
        last = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        return {"ok": False, "error": last[:300], "seconds": secs}
    return {"ok": True, "doc": json.loads(dest.read_text()), "seconds": secs}


def score(corpus: Path, *, cached: bool = False, procs: int = 1) -> dict:
    """Analyze every generated job (Tracer and profiler trace) and score it: {'tracer': summary,
    'profiler': summary, 'jobs': per-job scores}; also written to CORPUS/score.json."""
    truths = {p.parent.name: json.loads(p.read_text()) for p in sorted(corpus.glob("job*/truth.json"))}
    failed = sorted(p.parent.name for p in corpus.glob("job*/failed.json"))
    if not truths:
        raise SystemExit(f"{corpus}: no generated jobs (run: python benchmarks/real_corpus.py generate {corpus})")
    tasks = [(job, which) for job in truths for which in ("tracer", "profiler")]
    with ThreadPoolExecutor(max(procs, 1)) as ex:
        results = dict(zip(tasks, ex.map(lambda t: analyze_job(corpus / t[0], t[1], cached=cached), tasks),
                           strict=True))
    out: dict = {"corpus": str(corpus), "failed_jobs": failed, "jobs": {}}
    for which in ("tracer", "profiler"):
        scores = [score_job(truths[job], results[(job, which)]) for job in truths]
        out[which] = summarize(scores, truths)
        # measured impact (benchmarks/corpus_impact.py: each job against its clean twin), where run
        out[which]["recall_by_impact"] = load_sibling("corpus_impact").recall_by_impact(corpus, scores, truths)
        for s in scores:
            out["jobs"].setdefault(s.job, {})[which] = {**asdict(s), "seconds": results[(s.job, which)]["seconds"]}
    _write_json(corpus / "score.json", out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    for mode in ("plan", "generate", "score"):
        sp = sub.add_parser(mode)
        if mode != "plan":
            sp.add_argument("corpus", type=Path)
        if mode != "score":
            sp.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
            sp.add_argument("--seed", type=int, default=DEFAULT_SEED)
            sp.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="traced steps per job")
    gen = sub.choices["generate"]
    gen.add_argument("--retry-failed", action="store_true")
    gen.add_argument("--only", default="", help="comma-separated job ids of the draw to run (default: all)")
    gen.add_argument("--parallel", type=int, default=1, help="jobs at once (a core per rank of each)")
    gen.add_argument("--no-profiler", action="store_true", help="the Tracer's trace only (no torch.profiler)")
    gen.add_argument("--profiler-gc", action="store_true",
                     help="torch.profiler records Python's garbage collections too (with the Python stacks)")
    sc = sub.choices["score"]
    sc.add_argument("--cached", action="store_true", help="reuse the analyses in CORPUS/job*/analysis/")
    sc.add_argument("--procs", type=int, default=1, help="analyses run at once")
    sc.add_argument("--results", default=str(RESULTS), help="results.json to add the figures to ('': none)")
    sc.add_argument("--key", default="real_corpus", help="the figures' name in results.json (another corpus: "
                    "another key, e.g. real_corpus_16c)")
    a = ap.parse_args(argv)
    if a.mode == "plan":
        for p in plan_corpus(a.seed, a.jobs):
            print(f"{p.job_id} {p.layout:8} "
                  + (" + ".join(f"{c['spec']} (x{c['factor']})" for c in p.causes) or "clean"))
        return 0
    if a.mode == "generate":
        out = generate(a.corpus, seed=a.seed, num_jobs=a.jobs, steps=a.steps, retry_failed=a.retry_failed,
                       only=set(a.only.split(",")) if a.only else None, parallel=a.parallel,
                       profiler="" if a.no_profiler else "gc" if a.profiler_gc else "ops")
        print(f"ran {len(out['done'])}, skipped {len(out['skipped'])} (already there), failed {len(out['failed'])}"
              + (f": {', '.join(out['failed'])} (see their failed.json)" if out["failed"] else ""))
        return 0
    report = load_sibling("corpus_report")
    t0 = time.perf_counter()
    out = score(a.corpus, cached=a.cached, procs=a.procs)
    truths = {p.parent.name: json.loads(p.read_text()) for p in sorted(a.corpus.glob("job*/truth.json"))}
    sim = report.simulator_figures()
    report.print_report(out, sim)
    print("jobs with a miss, an unmatched finding or an extra rank:")
    report.print_problems(out, truths)
    if out["failed_jobs"]:
        print(f"jobs that failed to run (not scored): {', '.join(out['failed_jobs'])}")
    if a.results:
        report.write_results(report.figures(out, sim), time.perf_counter() - t0, Path(a.results), key=a.key)
        print(f"wrote {a.corpus / 'score.json'} and the figures to {a.results} ({a.key})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
