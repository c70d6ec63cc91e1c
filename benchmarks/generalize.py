"""Does the diagnosis generalize (issue 60)? A corpus of real programs from several families, each with
injected stragglers and clean twins, split into a tuning half and an evaluation half, and its scorer.

    python benchmarks/generalize.py plan --half tuning --seed 60                # the draw, nothing run
    python benchmarks/generalize.py generate out/generalize --half tuning --seed 60   # resumable
    python benchmarks/generalize.py score out/generalize --half tuning --label new
    python benchmarks/generalize.py score out/generalize --half tuning --label old --laggard-src ../old
    python benchmarks/generalize.py report out/generalize [--record]

**Families.** Each is a standalone training script in benchmarks/families/ (gloo ranks on the CPU; see
common.py for the emulated device and the injections) that never imports laggard's analysis, run the
way its kind of user runs it: ``laggard run`` (zero-code capture), or plain torchrun with laggard's
Tracer or torch.profiler inside (``--capture``). ``FAMILIES`` lists them with their half: the tuning
half is what the diagnosis may be tuned on; the evaluation half is only scored once its rules (this
file's matching, the programs, the plan) are frozen, so its figures say how the tuned diagnosis does
on programs it was not tuned on.

**Plan.** One seed per half draws, per family, ``--per-family`` injected jobs and for each its clean
twin (the same program, seed and flags, ``--inject none``). Kinds: device (twice as likely), transient
(slow from a drawn step to the end, or for the first half), host, data, stage (pipelines only), cpu
(real CPU work, not emulated: "harder", as the extra work on two shared cores slows the neighbours
too). The draw is balanced: the weighted kinds are shuffled copies taken in order, the factors go a
third to each bucket (1.1-1.25, 1.25-1.5, 1.5-2.0; uniform within it), host and data delays are
0.15-1.0x the family's step. The target rank is drawn (data: among the ranks that read data; stage:
a drawn stage, all of its ranks).

**Generate.** Every job runs for real, one at a time (4 ranks on 2 cores), into
``OUT/<half>/<job>/``: ``trace/``, ``output.log`` and ``truth.json`` (the draw, the exact command, the
wall time). A job with a truth.json is skipped; one that fails leaves ``failed.json`` and is skipped
until ``--retry-failed``.

**Score.** ``laggard analyze TRACE --json`` as a subprocess per job (``--laggard-src``: the same command
from another source tree, e.g. a ``git worktree`` of an older commit), each finding's named ranks (its
workers, else its stages' ranks through ``by_worker``) matched against truth.json (``counts``,
``score_job``), the figures per half and family (``figures``); ``OUT/<half>/scores-<label>.json``.
What each figure means is in benchmarks/README.md ("generalize").
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from laggard.collectives.launch import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = HERE / "families"
VENV_BIN = ROOT / ".venv" / "bin" if (ROOT / ".venv" / "bin").is_dir() else Path(sys.executable).parent
RESULTS = HERE / "results.json"
RUN_TIMEOUT_S = 300
ANALYZE_TIMEOUT_S = 600
HALVES = ("tuning", "evaluation")

# --------------------------------------------------------------------------- the families
@dataclass(frozen=True)
class Family:
    name: str
    script: str
    nproc: int
    capture: str  # auto: `laggard run`; tracer / profiler: plain torchrun, the program records (--capture)
    step_ms: float  # a healthy rank's step (the program's --step-ms default): host and data delays scale with it
    half: str
    pp: int = 1  # pipeline stages; rank = dp x pp + stage. 1: no pipeline (no stage injection)
    steps: int = 24
    data_ranks: tuple[int, ...] | None = None  # the ranks that read data (None: every rank)
    what: str = ""

    def stage_ranks(self, stage: int) -> list[int]:
        return [r for r in range(self.nproc) if r % self.pp == stage]

    def kinds(self) -> list[str]:
        """The injections this family takes, device twice (twice as likely)."""
        return ["device", "device", "transient", "host", "data", *(["stage"] if self.pp > 1 else []), "cpu"]


FAMILIES = [
    Family("ddp_mlp", "ddp_mlp.py", 4, "auto", 40.0, "tuning",
           what="DDP, 3-layer MLP, DataLoader, SGD"),
    Family("pp_blocking", "pp_blocking.py", 4, "auto", 100.0, "tuning", pp=4, data_ranks=(0, 3),
           what="pure 4-stage GPipe pipeline, blocking send/recv, 4 microbatches"),
    Family("tracer_dppp", "tracer_dppp.py", 4, "tracer", 200.0, "tuning", pp=2,
           what="dp 2 x pp 2, send/recv, DP all-reduce per stage, laggard's Tracer"),
    Family("fsdp_short", "fsdp_short.py", 2, "auto", 12.0, "tuning",
           what="FSDP2 fully_shard, ~12 ms steps"),
    Family("tp_dp", "tp_dp.py", 4, "auto", 60.0, "evaluation",
           what="tp 2 x dp 2, Megatron-style column/row-parallel MLP"),
    Family("pp_async_profiler", "pp_async_profiler.py", 4, "profiler", 150.0, "evaluation", pp=2,
           what="dp 2 x pp 2, isend/irecv, torch.profiler"),
    Family("ddp_long_profiler", "ddp_long_profiler.py", 4, "profiler", 1000.0, "evaluation", steps=14,
           what="DDP, ~1 s steps, torch.profiler"),
    Family("hf_trainer", "hf_trainer.py", 4, "auto", 250.0, "evaluation",
           what="Hugging Face Trainer.train()"),
    Family("lightning_cnn", "lightning_cnn.py", 4, "auto", 120.0, "evaluation",
           what="PyTorch Lightning Trainer.fit(), conv net with BatchNorm"),
]
FAMILY = {f.name: f for f in FAMILIES}

# --------------------------------------------------------------------------- the plan
BUCKETS = ((1.1, 1.25), (1.25, 1.5), (1.5, 2.0))
FACTOR_KINDS = ("device", "transient", "stage", "cpu")
DEVICE_EMULATED = ("device", "transient", "stage")  # the slow time is the emulated device's own, exact
HARDER = ("cpu",)
DELAY_SHARE = (0.15, 1.0)  # host and data delays, x the family's step
HOST_EVERY = (1, 2, 3)


def bucket_of(factor: float | None) -> str | None:
    if factor is None:
        return None
    for lo, hi in BUCKETS:
        if lo <= factor < hi or (hi == BUCKETS[-1][1] and factor == hi):
            return f"{lo:.2f}-{hi:.2f}"
    return f"{factor:.2f}"


@dataclass
class JobSpec:
    job: str
    family: str
    half: str
    kind: str  # the injection; "none" for a clean twin
    seed: int
    steps: int
    args: list[str]  # the program's flags
    targets: list[int] = field(default_factory=list)  # the slowed ranks (empty: clean)
    stage: int | None = None  # the slowed stage (kind stage)
    factor: float | None = None
    bucket: str | None = None
    ms: float | None = None  # host / data delay
    every: int | None = None  # host: a stall every this many steps
    slowed_steps: list[int] | None = None  # transient: the slow steps
    transient: str | None = None  # "to-end" | "first-half"
    harder: bool = False
    twin_of: str | None = None  # a clean twin: the injected job it mirrors
    twin: str | None = None  # an injected job: its clean twin

    @property
    def clean(self) -> bool:
        return self.kind == "none"


def plan_family(fam: Family, seed: int, k: int) -> list[JobSpec]:
    """``k`` injected jobs of one family and their clean twins (one seed per family: adding a family or
    changing ``k`` of another leaves this one's draw alone)."""
    rng = random.Random(f"generalize:{seed}:{fam.half}:{fam.name}")
    kinds: list[str] = []
    while len(kinds) < k:
        copy = fam.kinds()
        rng.shuffle(copy)
        kinds += copy
    kinds = kinds[:k]
    n_factor = sum(kd in FACTOR_KINDS for kd in kinds)
    off = rng.randrange(len(BUCKETS))
    buckets = [BUCKETS[(i + off) % len(BUCKETS)] for i in range(n_factor)]
    rng.shuffle(buckets)
    steps = fam.steps
    out: list[JobSpec] = []
    for i, kind in enumerate(kinds):
        job_seed = rng.randrange(1, 10**6)
        name = f"{fam.name}-{i:02d}-{kind}"
        spec = JobSpec(job=name, family=fam.name, half=fam.half, kind=kind, seed=job_seed, steps=steps, args=[],
                       harder=kind in HARDER, twin=f"{fam.name}-{i:02d}-clean")
        flags: list[str] = []
        if kind in FACTOR_KINDS:
            lo, hi = buckets.pop()
            spec.factor = round(rng.uniform(lo, hi), 3)
            spec.bucket = bucket_of(spec.factor)
            flags += ["--factor", f"{spec.factor}"]
        if kind == "stage":
            spec.stage = rng.randrange(fam.pp)
            spec.targets = fam.stage_ranks(spec.stage)
            flags += ["--stage", str(spec.stage)]
        else:
            pool = fam.data_ranks if kind == "data" and fam.data_ranks else range(fam.nproc)
            spec.targets = [rng.choice(list(pool))]
            flags += ["--rank", str(spec.targets[0])]
        if kind in ("host", "data"):
            spec.ms = round(rng.uniform(*DELAY_SHARE) * fam.step_ms, 1)
            flags += ["--ms", f"{spec.ms}"]
        if kind == "host":
            spec.every = rng.choice(HOST_EVERY)
            flags += ["--every", str(spec.every)]
        if kind == "transient":
            spec.transient = rng.choice(("to-end", "first-half"))
            a, b = (rng.randint(steps // 4, steps // 2), steps) if spec.transient == "to-end" else (0, steps // 2)
            spec.slowed_steps = list(range(a, b))
            flags += ["--from-step", str(a), "--to-step", str(b)]
        common = ["--steps", str(steps), "--seed", str(job_seed)]
        spec.args = [*common, "--inject", kind, *flags]
        twin = JobSpec(job=spec.twin, family=fam.name, half=fam.half, kind="none", seed=job_seed, steps=steps,
                       args=[*common, "--inject", "none", *flags], twin_of=name)
        out += [spec, twin]  # a job beside its twin: the same load on the machine, minutes apart at most
    return out


def plan(half: str, seed: int, k: int, only: list[str] | None = None) -> list[JobSpec]:
    fams = [f for f in FAMILIES if f.half == half and (not only or f.name in only)]
    return [j for f in fams for j in plan_family(f, seed, k)]


def command(spec: JobSpec, trace: Path, port: int) -> list[str]:
    fam = FAMILY[spec.family]
    script = str(SCRIPTS / fam.script)
    if fam.capture == "auto":
        return [str(VENV_BIN / "laggard"), "run", "--nproc-per-node", str(fam.nproc), "--master-port", str(port),
                "--out", str(trace), "--no-analyze", script, *spec.args]
    return [str(VENV_BIN / "torchrun"), "--nproc-per-node", str(fam.nproc), "--master-port", str(port), script,
            *spec.args, "--capture", fam.capture, "--out", str(trace)]


# --------------------------------------------------------------------------- generate
def _tail(path: Path, n: int = 800) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln]
    return (lines[-1] if lines else text[-n:]).strip()[-n:]


def run_job(spec: JobSpec, d: Path) -> dict:
    """Run one job into ``d`` (trace/, output.log); its truth, or raise RuntimeError with the reason."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    cmd = command(spec, d / "trace", free_port())  # held in TIME_WAIT until the launcher's store binds it
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FAMILY_STEP_TIMES": "1"}
    t0 = time.perf_counter()
    with open(d / "output.log", "w") as out:
        out.write(" ".join(cmd) + "\n")
        out.flush()
        try:
            rc = subprocess.run(cmd, cwd=d, env=env, stdout=out, stderr=subprocess.STDOUT,
                                timeout=RUN_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"timed out after {RUN_TIMEOUT_S} s") from None
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"exit {rc}: {_tail(d / 'output.log')}")
    trace = d / "trace"
    if not trace.is_dir() or not any(trace.iterdir()):
        raise RuntimeError("no trace written")
    fam = FAMILY[spec.family]
    return {**asdict(spec), "nproc": fam.nproc, "pp": fam.pp, "capture": fam.capture, "script": fam.script,
            "stage_ranks": {str(s): fam.stage_ranks(s) for s in range(fam.pp)},
            "command": cmd, "wall_s": round(wall, 1), "step_times_ms": _step_times(d / "output.log"),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}


_STEP_TIMES = re.compile(r"\[step-times\] rank (\d+): median ([0-9.]+) ms")


def _step_times(log: Path) -> dict[str, float]:
    """Each rank's median step time, as the program printed it (FAMILY_STEP_TIMES=1). The ranks share
    one pipe, so two ranks' lines can land on one line of the log: each is read wherever it is."""
    if not log.is_file():
        return {}
    out = {r: float(ms) for r, ms in _STEP_TIMES.findall(log.read_text(errors="replace"))}
    return dict(sorted(out.items()))


def _printed(truth: dict, root: Path) -> dict[str, float]:
    """A job's step times: from its log where it is kept (read again, so a corrected reader applies to
    jobs already run), else as recorded at the run."""
    return _step_times(root / str(truth.get("job") or "") / "output.log") or truth.get("step_times_ms") or {}


def generate(out: Path, half: str, seed: int, k: int, *, retry_failed: bool = False,
             only: list[str] | None = None) -> dict:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    root = out.resolve() / half  # the jobs run in their own directories
    root.mkdir(parents=True, exist_ok=True)
    jobs = plan(half, seed, k, only)
    doc = {"half": half, "seed": seed, "per_family": k, "jobs": [asdict(j) for j in plan(half, seed, k)]}
    plan_file = root / "plan.json"
    if plan_file.exists():
        old = json.loads(plan_file.read_text())
        if (old.get("seed"), old.get("per_family")) != (seed, k):
            raise SystemExit(f"{root} holds the plan of seed {old.get('seed')}, {old.get('per_family')} per family: "
                             f"another directory for seed {seed}, {k} per family")
    plan_file.write_text(json.dumps(doc, indent=1) + "\n")
    console = Console(stderr=True)
    done = failed = skipped = 0
    t0 = time.perf_counter()
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn())
    with Progress(*cols, console=console) as bar:
        task = bar.add_task(half, total=len(jobs))
        for spec in jobs:
            d = root / spec.job
            if (d / "truth.json").exists() or ((d / "failed.json").exists() and not retry_failed):
                skipped += 1
                bar.advance(task)
                continue
            bar.update(task, description=f"{half}: {spec.job}")
            (d / "failed.json").unlink(missing_ok=True)
            try:
                truth = run_job(spec, d)
            except RuntimeError as e:
                d.mkdir(parents=True, exist_ok=True)
                (d / "failed.json").write_text(json.dumps({"job": spec.job, "error": str(e),
                                                           "args": spec.args}, indent=1) + "\n")
                console.print(f"[red]{spec.job} failed[/red]: {e}")
                failed += 1
            else:
                (d / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
                done += 1
                console.print(f"{spec.job}: {truth['wall_s']:.0f} s, steps {truth['step_times_ms']} ms")
            bar.advance(task)
    secs = time.perf_counter() - t0
    info = {"half": half, "seed": seed, "jobs": len(jobs), "ran": done, "failed": failed, "skipped": skipped,
            "seconds": round(secs, 1)}
    runs = root / "generate-runs.json"
    hist = json.loads(runs.read_text()) if runs.exists() else []
    runs.write_text(json.dumps([*hist, info], indent=1) + "\n")
    console.print(f"{half}: ran {done}, failed {failed}, skipped {skipped} of {len(jobs)} in {secs / 60:.1f} min")
    return info


# --------------------------------------------------------------------------- matching and scoring (pure)
# the diagnosis's causes that count for each injected kind
COUNTING = {
    "device": ("worker", "stage-imbalance"),
    "transient": ("worker", "stage-imbalance"),
    "cpu": ("worker", "stage-imbalance"),
    "stage": ("stage-imbalance", "worker"),
    "host": ("launch-delay", "host"),
    "data": ("data-loading", "launch-delay"),
}


def rank_of_stage(doc: dict) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for w in doc.get("by_worker") or []:
        out.setdefault(int(w["stage"]), []).append(int(w["rank"]))
    return out


def named_ranks(f: dict, stages: dict[int, list[int]]) -> list[int]:
    """The ranks a finding names: its workers, else its stages' ranks (as bench_zerocode.laggard_verdict)."""
    if f.get("workers"):
        return sorted({int(w["rank"]) for w in f["workers"]})
    return sorted({r for s in f.get("stages") or [] for r in stages.get(int(s), [])})


def counts(truth: dict, f: dict, stages: dict[int, list[int]]) -> bool:
    """Whether finding ``f`` names the injected cause of ``truth``: a cause that counts for its kind,
    naming exactly its target ranks (a stage's ranks for stage; for the device kinds the one slowed
    rank, which in a pure pipeline is also its stage, so a stage finding there counts)."""
    kind = truth["kind"]
    if kind == "none" or f.get("cause") not in COUNTING.get(kind, ()):
        return False
    return set(named_ranks(f, stages)) == set(truth["targets"])


def _noise_only(f: dict) -> bool:
    """A finding whose every named target is, by laggard's own words, within the job's noise."""
    ts = f.get("targets") or []
    return bool(ts) and all(t.get("pattern") == "noise" for t in ts)


def score_job(truth: dict, result: dict) -> dict:
    """One job's row: what laggard said (``result``: {"doc": analysis JSON} or {"error": text}) and
    whether it is right. Injected: right when the first finding names the target with a cause that
    counts; ``hit`` when any finding does. Clean: right when no finding names a rank."""
    clean = truth["kind"] == "none"
    row = {"job": truth["job"], "family": truth["family"], "half": truth["half"], "kind": truth["kind"],
           "targets": list(truth.get("targets") or []), "factor": truth.get("factor"), "bucket": truth.get("bucket"),
           "harder": bool(truth.get("harder")), "twin_of": truth.get("twin_of"), "clean": clean}
    if result.get("error") is not None or result.get("doc") is None:
        return {**row, "status": "error", "error": str(result.get("error")), "verdict": None, "first": None,
                "findings": [], "named": [], "named_targets": [], "hit": False, "first_right": False,
                "noise_only": False, "right": False, "why": f"laggard analyze failed: {result.get('error')}"}
    doc = result["doc"]
    st = rank_of_stage(doc)
    fs = doc.get("findings") or []
    per = [{"cause": f.get("cause"), "ranks": named_ranks(f, st), "gain": f.get("gain"),
            "confidence": f.get("confidence"), "noise": _noise_only(f), "counts": counts(truth, f, st)} for f in fs]
    named = sorted({r for p in per for r in p["ranks"]})
    targets = set(row["targets"])
    first = per[0] if per else None
    hit = any(p["counts"] for p in per)
    first_right = bool(first and first["counts"])
    noise_only = clean and all(not p["ranks"] or p["noise"] for p in per)
    if clean:
        right = not named
        why = "no finding names a rank" if right else \
            "names " + "; ".join(f"{p['cause']} {p['ranks']}" for p in per if p["ranks"])
    else:
        right = first_right
        want = f"{'/'.join(COUNTING[truth['kind']])} naming {sorted(targets)}"
        if first is None:
            why = f"no finding (wanted {want})"
        elif first_right:
            why = f"first finding {first['cause']} {first['ranks']}"
        else:
            why = (f"first finding {first['cause']} {first['ranks']}, wanted {want}"
                   + ("; a later finding has it" if hit else ""))
    return {**row, "status": "ok", "verdict": doc.get("verdict"), "slowdown": doc.get("slowdown"),
            "first": first, "findings": per, "named": named, "named_targets": sorted(set(named) & targets),
            "hit": hit, "first_right": first_right, "noise_only": noise_only, "right": right, "why": why,
            "sw_worst": sw_worst(doc)}


def sw_worst(doc: dict) -> list[int]:
    """The ranks whose S_w is the largest (several where they tie): the basic metric's own answer,
    beside the findings'."""
    sw = {int(w["rank"]): float(w["slowdown"]) for w in doc.get("by_worker") or [] if w.get("slowdown") is not None}
    top = max(sw.values(), default=None)
    return sorted(r for r, v in sw.items() if v >= top - 1e-9) if top is not None else []


def realized(truth: dict, root: Path) -> float | None:
    """How much slower the injected job ran than its clean twin: the slowest rank's median step over
    the twin's (what each program printed); None for a twin, or where either printed none. The truth
    of an injection is the slowed op's factor; this says what it did to the job on this machine (where
    the ranks are CPU bound, a slow device's longer sleep hands its core to the others)."""
    twin = root / str(truth.get("twin") or "") / "truth.json"
    if truth["kind"] == "none" or not twin.is_file():
        return None
    a, b = _printed(truth, root), _printed(json.loads(twin.read_text()), root)
    return max(a.values()) / max(b.values()) if a and b and max(b.values()) > 0 else None


def _share(num: int, den: int) -> float | None:
    return num / den if den else None


def figures(rows: list[dict]) -> dict:
    """The figures of a set of scored jobs (a half, or one family of it); see benchmarks/README.md."""
    inj = [r for r in rows if not r["clean"]]
    cln = [r for r in rows if r["clean"]]
    named = sum(len(r["named"]) for r in rows)
    named_right = sum(len(r["named_targets"]) for r in rows)

    def recall(sel: list[dict]) -> dict:
        return {"hit": sum(r["hit"] for r in sel), "jobs": len(sel), "recall": _share(sum(r["hit"] for r in sel),
                                                                                       len(sel))}

    by_bucket = {f"{lo:.2f}-{hi:.2f}": recall([r for r in inj if r["bucket"] == f"{lo:.2f}-{hi:.2f}"])
                 for lo, hi in BUCKETS}
    by_kind = {k: recall([r for r in inj if r["kind"] == k]) for k in sorted({r["kind"] for r in inj})}
    dev125 = [r for r in inj if r["kind"] in DEVICE_EMULATED and (r["factor"] or 0) >= 1.25]
    one = [r for r in inj if len(r["targets"]) == 1 and r["status"] == "ok"]
    return {
        "jobs": len(rows), "injected": len(inj), "clean": len(cln),
        "errors": sum(r["status"] != "ok" for r in rows),
        "precision_named_ranks": _share(named_right, named), "named_ranks": named, "named_target_ranks": named_right,
        "recall": _share(sum(r["hit"] for r in inj), len(inj)),
        "recall_not_harder": recall([r for r in inj if not r["harder"]])["recall"],
        "recall_harder": recall([r for r in inj if r["harder"]])["recall"],
        "recall_by_bucket": by_bucket,
        "recall_device_ge_1_25": recall(dev125)["recall"], "device_ge_1_25_jobs": len(dev125),
        "recall_by_kind": by_kind,
        "first_right": _share(sum(r["first_right"] for r in inj), len(inj)),
        "first_right_not_harder": _share(sum(r["first_right"] for r in inj if not r["harder"]),
                                         sum(not r["harder"] for r in inj)),
        "clean_no_rank": _share(sum(not r["named"] and r["status"] == "ok" for r in cln), len(cln)),
        "clean_healthy_or_noise": _share(sum(r["status"] == "ok" and (r["verdict"] == "healthy" or r["noise_only"])
                                             for r in cln), len(cln)),
        "clean_verdicts": dict(Counter(str(r["verdict"]) for r in cln)),
        # one-target injected jobs whose worst S_w, alone (no tie), is the target: the basic metric
        "sw_worst_is_target": _share(sum(r.get("sw_worst") == r["targets"] for r in one), len(one)),
        # injected jobs that ran under 1.03x their twin's step: causes the job barely felt
        "realized_under_1_03": sum((r.get("realized") or 0.0) < 1.03 for r in inj if r.get("realized") is not None),
        "verdicts": dict(Counter(str(r["verdict"]) for r in rows)),
    }


def summarize(rows: list[dict]) -> dict:
    fams = sorted({r["family"] for r in rows}, key=lambda n: [f.name for f in FAMILIES].index(n)
                  if n in FAMILY else 99)
    return {"overall": figures(rows), "by_family": {f: figures([r for r in rows if r["family"] == f]) for f in fams}}


# --------------------------------------------------------------------------- score: laggard analyze per job
def laggard_command(src: Path | None) -> tuple[list[str], dict[str, str], dict]:
    """The `laggard` command (and its environment) for this checkout, or for source tree ``src``: that
    tree's own [project.scripts] entry run with its sources first on the path. A tree without the
    compiled modules gets ours where its C source is the same; otherwise it runs their Python twins."""
    env = {**os.environ, "LAGGARD_NO_CACHE": "1"}
    if src is None:
        return [str(VENV_BIN / "laggard")], env, {"src": str(ROOT), "commit": _commit(ROOT), "dirty": _dirty(ROOT)}
    src = src.resolve()
    pkg_root = src / "src" if (src / "src" / "laggard").is_dir() else src
    if not (pkg_root / "laggard").is_dir():
        raise SystemExit(f"{src}: no laggard package (src/laggard or laggard) there")
    project = src / "pyproject.toml"
    entry = "laggard.cli:entry"
    if project.exists():
        entry = tomllib.loads(project.read_text()).get("project", {}).get("scripts", {}).get("laggard", entry)
    mod, func = entry.split(":")
    notes = []
    ours = ROOT / "src" / "laggard"
    for so in sorted(ours.rglob("*.so")):
        rel = so.relative_to(ours)
        there = pkg_root / "laggard" / rel
        c_src = so.parent / (so.name.split(".")[0] + ".c")
        c_there = there.parent / c_src.name
        if there.exists() or any(there.parent.glob(so.name.split(".")[0] + ".*.so")):
            continue
        if c_src.exists() and c_there.exists() and filecmp.cmp(c_src, c_there, shallow=False):
            shutil.copy2(so, there)
            notes.append(f"copied {rel} (same C source)")
        else:
            notes.append(f"{rel}: not built there and its C source differs: the Python twin runs")
            env["LAGGARD_REPLAY_PURE_PYTHON" if "engine" in str(rel) else "LAGGARD_TRACER_PURE_PYTHON"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(pkg_root), *filter(None, [os.environ.get("PYTHONPATH")])])
    code = f"import sys; sys.argv[0] = 'laggard'; from {mod} import {func}; sys.exit({func}())"
    cmd = [str(VENV_BIN / "python"), "-c", code]
    probe = subprocess.run([str(VENV_BIN / "python"), "-c", "import laggard; print(laggard.__file__)"], env=env,
                           capture_output=True, text=True)
    where = probe.stdout.strip()
    if not where.startswith(str(pkg_root)):
        raise SystemExit(f"--laggard-src {src}: laggard still imports from {where or probe.stderr.strip()[-300:]}")
    return cmd, env, {"src": str(src), "commit": _commit(src), "dirty": _dirty(src), "entry": entry, "notes": notes}


def _commit(path: Path) -> str | None:
    r = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or None


def _dirty(path: Path) -> bool | None:
    """Whether the tree's sources differ from its commit (the analysis scored is then not the commit's)."""
    r = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--", "src"], capture_output=True, text=True)
    return bool(r.stdout.strip()) if r.returncode == 0 else None


def analyze(job_dir: Path, label: str, cmd: list[str], env: dict[str, str]) -> dict:
    out = job_dir / f"analysis-{label}.json"
    log = job_dir / f"analyze-{label}.log"
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run([*cmd, "analyze", str(job_dir / "trace"), "--json", str(out)], stdout=f,
                                stderr=subprocess.STDOUT, env=env, timeout=ANALYZE_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {ANALYZE_TIMEOUT_S} s"}
    secs = time.perf_counter() - t0
    if rc != 0 or not out.exists():
        return {"error": f"exit {rc}: {_tail(log)}", "seconds": secs}
    return {"doc": json.loads(out.read_text()), "seconds": secs}


def score(out: Path, half: str, label: str, src: Path | None) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    root = out.resolve() / half
    truths = sorted(root.glob("*/truth.json"))
    if not truths:
        raise SystemExit(f"{root}: no job with a truth.json (generate first)")
    cmd, env, where = laggard_command(src)
    console = Console(stderr=True)
    rows = []
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        task = bar.add_task(f"score {half} ({label})", total=len(truths))
        for tf in truths:
            truth = json.loads(tf.read_text())
            res = analyze(tf.parent, label, cmd, env)
            row = score_job(truth, res)
            row["realized"] = realized(truth, root)
            row["analyze_s"] = round(res.get("seconds") or 0.0, 2)
            rows.append(row)
            bar.advance(task)
    failed = sorted(p.parent.name for p in root.glob("*/failed.json"))
    doc = {"half": half, "label": label, "laggard": where, "scored": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "seconds": round(time.perf_counter() - t0, 1), "not_generated": failed,
           "figures": summarize(rows), "jobs": rows}
    (root / f"scores-{label}.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    print_scores(doc)
    return doc


# --------------------------------------------------------------------------- tables
# the reported figures, each once: its key in ``figures``, its column in the per-family table
# (None: the report only), its row in the report and in results.json
FIGURES = (
    ("precision_named_ranks", "prec", "named-rank precision"),
    ("recall", "recall", "recall (every injected job)"),
    ("recall_not_harder", None, "recall, device-emulated/host/data"),
    ("recall_device_ge_1_25", "dev>=1.25", "recall, device-emulated >= 1.25x"),
    ("recall_harder", "cpu", "recall, cpu (harder)"),
    ("first_right", "1st ok", "first finding right"),
    ("first_right_not_harder", "1st no cpu", "first right, device-emulated/host/data"),
    ("clean_no_rank", "clean 0", "clean twins naming no rank"),
    ("clean_healthy_or_noise", "clean h/n", "clean twins healthy / noise only"),
    ("sw_worst_is_target", None, "worst S_w alone is the target (1 target)"),
)
COLUMNS = tuple((key, col) for key, col, _ in FIGURES if col is not None)
REPORT_ROWS = tuple((key, row) for key, _, row in FIGURES)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def print_scores(doc: dict, file=sys.stdout) -> None:  # noqa: ANN001
    figs = doc["figures"]
    dirty = " + uncommitted changes" if doc["laggard"].get("dirty") else ""
    print(f"\n{doc['half']} ({doc['label']}): laggard from {doc['laggard']['src']} @ "
          f"{str(doc['laggard']['commit'])[:10]}{dirty}", file=file)
    head = f"{'family':<20} {'jobs':>4} {'err':>3} " + " ".join(f"{h:>9}" for _, h in COLUMNS)
    print(head, file=file)
    for name, f in [*figs["by_family"].items(), ("ALL", figs["overall"])]:
        print(f"{name:<20} {f['jobs']:>4} {f['errors']:>3} " + " ".join(f"{_pct(f[k]):>9}" for k, _ in COLUMNS),
              file=file)
    o = figs["overall"]
    print("recall by factor bucket: "
          + ", ".join(f"{b} {v['hit']}/{v['jobs']}" for b, v in o["recall_by_bucket"].items())
          + "; by kind: " + ", ".join(f"{k} {v['hit']}/{v['jobs']}" for k, v in o["recall_by_kind"].items()), file=file)
    print(f"named ranks {o['named_target_ranks']}/{o['named_ranks']} targets; clean verdicts {o['clean_verdicts']}",
          file=file)
    for r in doc["jobs"]:
        if not r["right"]:
            print(f"  {r['job']:<28} {r['verdict'] or r['status']}: {r['why']}"[:200], file=file)
    if doc.get("not_generated"):
        print(f"not generated (failed.json): {doc['not_generated']}", file=file)


def collect(out: Path) -> dict[str, dict[str, dict]]:
    """{label: {half: scores doc}} for every scores-<label>.json under OUT."""
    found: dict[str, dict[str, dict]] = {}
    for half in HALVES:
        for p in sorted((out / half).glob("scores-*.json")):
            doc = json.loads(p.read_text())
            found.setdefault(doc["label"], {})[half] = doc
    return found


def report(out: Path, record: bool) -> None:
    found = collect(out)
    if not found:
        raise SystemExit(f"{out}: no scores-<label>.json (score first)")
    cols = [(label, half) for label in sorted(found) for half in HALVES if half in found[label]]
    print(f"{'figure':<36} " + " ".join(f"{h + '/' + lb:>20}" for lb, h in cols))
    for key, title in REPORT_ROWS:
        print(f"{title:<36} " + " ".join(f"{_pct(found[lb][h]['figures']['overall'].get(key)):>20}" for lb, h in cols))
    for b, _ in found[cols[0][0]][cols[0][1]]["figures"]["overall"]["recall_by_bucket"].items():
        print(f"{'recall, factor ' + b:<36} " + " ".join(
            f"{_pct(found[lb][h]['figures']['overall']['recall_by_bucket'][b]['recall']):>20}" for lb, h in cols))
    print(f"{'jobs (errors)':<36} " + " ".join(
        f"{str(o['jobs']) + ' (' + str(o['errors']) + ')':>20}"
        for o in (found[lb][h]['figures']['overall'] for lb, h in cols)))
    fams = sorted({f for lb, h in cols for f in found[lb][h]["figures"]["by_family"]})
    print("\nper family (precision / recall / first right / clean naming no rank):")
    for fam in fams:
        cells = []
        for lb, h in cols:
            f = found[lb][h]["figures"]["by_family"].get(fam)
            cells.append("-" if f is None else "/".join(_pct(f[k]) for k in ("precision_named_ranks", "recall",
                                                                            "first_right", "clean_no_rank")))
        print(f"  {fam:<34} " + " ".join(f"{c:>20}" for c in cells))
    if record:
        write_results(found)


def write_results(found: dict[str, dict[str, dict]], path: Path = RESULTS) -> None:
    """The halves' figures per label into results.json, key "generalize" (as corpus_report.write_results)."""
    figs = []
    for label, halves in sorted(found.items()):
        for half, doc in halves.items():
            o = doc["figures"]["overall"]
            for key, title in REPORT_ROWS:
                if o.get(key) is None:
                    continue
                figs.append({"name": f"generalize {half} ({label}): {title}", "value": o[key], "unit": "share",
                             "detail": {"half": half, "label": label, "laggard": doc["laggard"], "jobs": o["jobs"],
                                        "errors": o["errors"], "scored": doc["scored"],
                                        **({"by_bucket": o["recall_by_bucket"], "by_kind": o["recall_by_kind"]}
                                           if key == "recall" else {}),
                                        **({"verdicts": o["clean_verdicts"]} if key.startswith("clean") else {}),
                                        "by_family": {f: v[key] for f, v in doc["figures"]["by_family"].items()}}})
    doc = json.loads(path.read_text()) if path.exists() else {"benchmarks": {}}
    secs = sum(d.get("seconds", 0.0) for h in found.values() for d in h.values())
    doc.setdefault("benchmarks", {})["generalize"] = {"seconds": round(secs, 2), "figures": figs}
    path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    print(f"wrote {len(figs)} figures to {path} (key generalize)")


# --------------------------------------------------------------------------- the command line
def print_plan(jobs: list[JobSpec]) -> None:
    for j in jobs:
        what = (f"x{j.factor}" if j.factor else "") + (f" {j.ms} ms" if j.ms else "") + \
               (f" every {j.every}" if j.every else "") + (f" steps {j.slowed_steps[0]}-{j.slowed_steps[-1]}"
                                                           if j.slowed_steps else "")
        tgt = f"stage {j.stage} {j.targets}" if j.stage is not None else str(j.targets)
        print(f"{j.job:<30} {j.kind:<10} {'' if j.clean else tgt:<14} {'' if j.clean else what:<28} "
              f"{'twin of ' + j.twin_of if j.twin_of else ''}")
    print(f"{len(jobs)} jobs ({sum(not j.clean for j in jobs)} injected, {sum(j.clean for j in jobs)} clean twins)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="issue 60's generalization corpus (see the module docstring)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def halfargs(p: argparse.ArgumentParser) -> None:
        p.add_argument("--half", choices=HALVES, required=True)
        p.add_argument("--seed", type=int, default=60)
        p.add_argument("--per-family", type=int, default=6, help="injected jobs per family (each has a clean twin)")
        p.add_argument("--only", default="", help="comma-separated family names (default: every family of the half)")

    p = sub.add_parser("plan", help="print the draw (nothing runs)")
    halfargs(p)
    p.add_argument("--json", help="also write the plan here")
    p = sub.add_parser("generate", help="run the half's jobs (resumable)")
    p.add_argument("out", type=Path)
    halfargs(p)
    p.add_argument("--retry-failed", action="store_true", help="run again the jobs that left a failed.json")
    p = sub.add_parser("score", help="laggard analyze on every job, scored against truth.json")
    p.add_argument("out", type=Path)
    p.add_argument("--half", choices=HALVES, required=True)
    p.add_argument("--label", default="new", help="names this scoring (scores-LABEL.json), e.g. old / new")
    p.add_argument("--laggard-src", type=Path, help="the analysis from this source tree (e.g. a git worktree)")
    p = sub.add_parser("report", help="every label's figures, the halves side by side")
    p.add_argument("out", type=Path)
    p.add_argument("--record", action="store_true", help="write them to benchmarks/results.json (key generalize)")
    a = ap.parse_args(argv)
    only = [x for x in getattr(a, "only", "").split(",") if x]
    if only and (bad := [x for x in only if x not in FAMILY]):
        raise SystemExit(f"unknown families {bad}; there are {sorted(FAMILY)}")
    if a.cmd == "plan":
        jobs = plan(a.half, a.seed, a.per_family, only)
        print_plan(jobs)
        if a.json:
            Path(a.json).write_text(json.dumps([asdict(j) for j in jobs], indent=1) + "\n")
    elif a.cmd == "generate":
        generate(a.out, a.half, a.seed, a.per_family, retry_failed=a.retry_failed, only=only)
    elif a.cmd == "score":
        score(a.out, a.half, a.label, a.laggard_src)
    else:
        report(a.out, a.record)


if __name__ == "__main__":
    main()
