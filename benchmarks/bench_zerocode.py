"""Zero-code tracing on real jobs: `laggard run` against TraceML 0.5.0 (`traceml run`), and plain torchrun.

Each job is a small standalone script in benchmarks/zerocode/ (gloo ranks on CPU, ~80-140 ms steps, 40
steps), with one rank slowed in a known way, or nothing injected; it runs unchanged under the three
launchers (it calls TraceML's API only where ``ZC_TRACEML=1``, as a plain loop needs ``traceml.init()``
and ``trace_step(model)``; Lightning and the HF Trainer are attached by `traceml run` itself):

  1 ddp-slow-forward     plain DDP loop, rank 2's forward 30 ms longer every step (sleep: a slow device)
  2 ddp-host-stall       same, rank 2 stalls 60 ms on the host before its step's compute every third step
  3 ddp-clean            same, nothing injected
  4 lightning-slow-step  Lightning Trainer.fit (ddp, CPU), rank 2's training_step 30 ms longer
  5 hf-slow-forward      HF Trainer.train() on a tiny GPT-2 from its config, rank 2's forward 30 ms longer
  6 ddp-slow-compute     plain DDP loop, 2 ranks, rank 1 does 1.5x the real matmuls (no sleep; 4 ranks on the
                         2 cores would time the CPU contention: each rank's extra work slows all alike)
  7 ddp-slow-dataloader  plain DDP loop, rank 2's DataLoader 40 ms slower a batch (collate, num_workers=0)
  8 pipeline-slow-stage  2 ranks, send/recv of activations and gradients, 4 microbatches; stage 1's forward
                         10 ms longer a microbatch
  9 fsdp2-slow-forward   FSDP2 fully_shard on gloo, rank 2's forward 30 ms longer
 10 lightning-clean      Lightning Trainer.fit, nothing injected
 11 ddp-slow-dataloader-workers  plain DDP loop, rank 2's DataLoader with 2 workers, 250 ms a batch per
                         worker: they cannot keep up and hand batches over two at a time

Scoring (per traced run): a tool is right when it names the slowed rank, and only it, with a cause of
the injected kind; on a clean job, when it names no rank.
  laggard: the first finding of `laggard analyze DIR --json` (the analysis `laggard run` prints): its
    ranks (``workers``, or the ranks of its ``stages`` where it names none) and its cause, read as
    worker / stage-imbalance -> compute, launch-delay -> host (untraced host time; its fix names a slow
    data loader first), comm, gc, sequence-imbalance as themselves, unexplained -> no cause.
  TraceML: the step-time verdict of final_summary.json (its "straggler line"): a straggler kind names
    its ``ranks`` (the culprit), COMPUTE_STRAGGLER -> compute, INPUT_STRAGGLER -> data, H2D_STRAGGLER -> h2d,
    STRAGGLER -> no cause ("No measured component clearly explained the gap"); any other verdict
    (BALANCED, COMPUTE_BOUND, RESIDUAL_HEAVY, INCOMPLETE_DATA, ...) names no straggler.
  Causes that count: compute for jobs 1, 4, 5, 6, 8, 9; host for job 2; data or host for jobs 7 and 11 (a
  DataLoader's time is host time outside the model's phases).
  Later laggard findings are not scored; the ranks they name are recorded (``others_named``).

Overhead: each script times its own steps (the same clock under every launcher: the mean step past 5
warm-up steps, i.e. their wall time over their count, per rank, written to ``$ZC_STEP_FILE.<rank>``; a
run's step time is the median over its ranks). The mean, not the median step, because a job whose
batches arrive in bunches (job 11) alternates waiting and computing steps: a per-step cost then moves
time between the two kinds while the throughput stays the loader's, and the median of such a mix jumps
between modes. The median-step figures are kept beside it (``overhead_median_step_pct``). Per job and
round: untraced (plain torchrun), TraceML, laggard and a second untraced run (the A/A control), in an
order that rotates from job to job and round to round; a tool's overhead is its step time over the
untraced one's, minus 1, and the A/A the second untraced run's the same way. The figures are the medians
over jobs and rounds. Ranks sleep as an accelerator would compute (no host CPU), so 4 ranks fit on the 2
shared cores; still, the A/A spread is a few %.

TraceML is installed by this bench into a scratch venv (out/bench-venvs/traceml), never into laggard's:
its site-packages sees laggard's venv through a .pth file placed after it, so torch, Lightning and
transformers are laggard's own (no download, torch unchanged), and pip adds what traceml-ai needs
beyond them (nvidia-ml-py); where pip would install a package laggard's venv already has (torch), the
install is --no-deps and its other requirements are installed explicitly.

    .venv/bin/python benchmarks/run.py zerocode          # ~15 min on 2 cores; figures into results.json
    .venv/bin/python benchmarks/bench_zerocode.py --quick --jobs 1,3,8   # a look, results.json untouched
"""


import argparse
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from laggard.collectives.launch import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = HERE / "zerocode"
VENV_BIN = Path(sys.executable).parent  # laggard's venv (the bench runs under its python)
TRACEML_SPEC = "traceml-ai==0.5.0"
TRACEML_VENV = Path(os.environ.get("LAGGARD_BENCH_TRACEML_VENV", ROOT / "out" / "bench-venvs" / "traceml"))
WORK = ROOT / "out" / "bench-zerocode"
RUN_TIMEOUT_S = 300
MODES = ("untraced", "traceml", "laggard", "untraced-aa")

LAGGARD_CAUSE = {"worker": "compute", "data-loading": "data", "stage-imbalance": "compute", "launch-delay": "host",
                 "comm": "comm",
                 "gc": "gc", "sequence-imbalance": "sequence", "unexplained": None}
TRACEML_CAUSE = {"COMPUTE_STRAGGLER": "compute", "INPUT_STRAGGLER": "data", "H2D_STRAGGLER": "h2d",
                 "STRAGGLER": None}


@dataclass(frozen=True)
class Job:
    num: int
    name: str
    script: str
    nproc: int
    args: tuple[str, ...]
    ranks: frozenset[int] = frozenset()  # the slowed ranks (empty: a clean job)
    causes: frozenset[str] = frozenset()  # the causes that count as right

    @property
    def clean(self) -> bool:
        return not self.ranks


COMPUTE, R2 = frozenset({"compute"}), frozenset({2})
JOBS = [
    Job(1, "ddp-slow-forward", "ddp_loop.py", 4, ("--inject", "forward", "--ms", "30"), R2, COMPUTE),
    Job(2, "ddp-host-stall", "ddp_loop.py", 4, ("--inject", "host", "--ms", "60", "--every", "3"), R2,
        frozenset({"host"})),
    Job(3, "ddp-clean", "ddp_loop.py", 4, ()),
    Job(4, "lightning-slow-step", "lightning_fit.py", 4, ("--inject", "forward", "--ms", "30"), R2, COMPUTE),
    Job(5, "hf-slow-forward", "hf_trainer.py", 4, ("--inject", "forward", "--ms", "30"), R2, COMPUTE),
    # real CPU work only: 1024 rows through a 256x256 layer 6 times (9 on rank 1), ~40 ms a step (~60 on rank 1).
    # Two ranks: four on the two cores would share them, and a rank's extra work would slow every rank alike
    Job(6, "ddp-slow-compute", "ddp_loop.py", 2, ("--inject", "compute", "--rank", "1", "--batch", "1024",
                                                 "--reps", "6", "--slow-reps", "9", "--fwd-ms", "0", "--bwd-ms", "0"),
        frozenset({1}), COMPUTE),
    Job(7, "ddp-slow-dataloader", "ddp_loop.py", 4, ("--inject", "data", "--ms", "40"), R2,
        frozenset({"data", "host"})),
    Job(8, "pipeline-slow-stage", "pipeline.py", 2, ("--inject", "stage", "--ms", "10"), frozenset({1}), COMPUTE),
    Job(9, "fsdp2-slow-forward", "fsdp2.py", 4, ("--inject", "forward", "--ms", "30"), R2, COMPUTE),
    Job(10, "lightning-clean", "lightning_fit.py", 4, ()),
    # two loader workers that cannot keep up: batches arrive two at a time, so rank 2 waits every
    # other step (250 ms a batch per worker against ~70 ms steps)
    Job(11, "ddp-slow-dataloader-workers", "ddp_loop.py", 4, ("--inject", "data", "--ms", "250", "--workers", "2"),
        R2, frozenset({"data", "host"})),
]


def log(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- TraceML's scratch venv
def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def _torch_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], check=True,
                          capture_output=True, text=True).stdout.strip()


def ensure_traceml() -> dict[str, object]:
    """TraceML in its scratch venv (created once, reused after); what was installed and how."""
    py, tml = TRACEML_VENV / "bin" / "python", TRACEML_VENV / "bin" / "traceml"
    ours = _torch_version(Path(sys.executable))
    stamp = TRACEML_VENV / ".installed.json"
    if tml.exists() and stamp.exists():
        info = json.loads(stamp.read_text())
        if info.get("spec") == TRACEML_SPEC and _torch_version(py) == ours:
            return info
    log(f"installing {TRACEML_SPEC} into {TRACEML_VENV} ...")
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRACEML_VENV)], check=True)
    # after the scratch venv's own site-packages: what pip installs there wins, laggard's venv fills the rest
    (_site_packages(py) / "zz_laggard_venv.pth").write_text(f"{_site_packages(Path(sys.executable))}\n")
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "-q"]
    report = TRACEML_VENV / "pip-report.json"
    subprocess.run([*pip, "install", "--dry-run", "--ignore-installed", "--report", str(report), TRACEML_SPEC],
                   check=True, capture_output=True)
    plan = json.loads(report.read_text())["install"]
    wanted = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in plan}
    have = subprocess.run([str(py), "-m", "pip", "list", "--format", "json"], check=True, capture_output=True,
                          text=True).stdout
    installed = {p["name"].lower() for p in json.loads(have)}
    if "torch" in wanted and wanted["torch"].split("+")[0] != ours.split("+")[0]:
        deps = [f"{n}=={v}" for n, v in wanted.items() if n not in installed and n not in ("torch", "traceml-ai")]
        subprocess.run([*pip, "install", "--no-deps", TRACEML_SPEC], check=True)
        if deps:
            subprocess.run([*pip, "install", "--no-deps", *deps], check=True)
        how = f"--no-deps (pip wanted torch {wanted['torch']}), then {deps}"
    else:
        subprocess.run([*pip, "install", TRACEML_SPEC], check=True)
        how = "pip install (no torch requirement: torch comes from laggard's venv)"
    if _torch_version(py) != ours:
        raise RuntimeError(f"the TraceML venv's torch is {_torch_version(py)}, not laggard's {ours}")
    after = subprocess.run([str(py), "-m", "pip", "list", "--format", "json", "--path", str(_site_packages(py))],
                           check=True, capture_output=True, text=True).stdout
    info = {"spec": TRACEML_SPEC, "venv": str(TRACEML_VENV), "torch": ours, "how": how,
            "added": sorted(f"{p['name']}=={p['version']}" for p in json.loads(after)
                            if p["name"] not in ("pip", "setuptools"))}  # a fresh venv's own
    stamp.write_text(json.dumps(info, indent=2) + "\n")
    return info


# --------------------------------------------------------------------------- one run
@dataclass
class Run:
    job: int
    mode: str
    round: int
    rc: int | None = None
    wall_s: float = 0.0
    step_s: float | None = None  # the mean step (throughput), median over ranks
    median_step_s: float | None = None  # the median step, median over ranks (a second reading)
    error: str | None = None
    verdict: dict[str, object] = field(default_factory=dict)


def _command(job: Job, mode: str, d: Path, steps: int) -> tuple[list[str], dict[str, str]]:
    script = str(SCRIPTS / job.script)
    args = [*job.args, "--steps", str(steps)]
    env = {**os.environ, "ZC_STEP_FILE": str(d / "step"), "PYTHONUNBUFFERED": "1"}
    env.pop("ZC_TRACEML", None)
    port = str(free_port())
    if mode.startswith("untraced"):
        return [str(VENV_BIN / "torchrun"), "--nproc-per-node", str(job.nproc), "--master-port", port, script,
                *args], env
    if mode == "traceml":
        env["ZC_TRACEML"] = "1"
        return [str(TRACEML_VENV / "bin" / "traceml"), "run", script, "--nproc-per-node", str(job.nproc),
                "--master-port", port, "--aggregator-port", str(free_port()), "--logs-dir", str(d / "traceml"),
                "--run-name", "run", "--args", *args], env
    # the analysis it would print comes from `laggard analyze --json` below, on the same trace
    return [str(VENV_BIN / "laggard"), "run", "--nproc-per-node", str(job.nproc), "--master-port", port,
            "--out", str(d / "trace"), "--no-analyze", script, *args], env


def run_one(job: Job, mode: str, rnd: int, work: Path, steps: int) -> Run:
    d = work / f"job{job.num:02d}-{mode}-r{rnd}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    cmd, env = _command(job, mode, d, steps)
    r = Run(job=job.num, mode=mode, round=rnd)
    t0 = time.perf_counter()
    with open(d / "output.log", "w") as out:
        out.write(" ".join(cmd) + "\n")
        out.flush()
        try:
            r.rc = subprocess.run(cmd, cwd=d, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=RUN_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            r.rc, r.error = -1, f"timed out after {RUN_TIMEOUT_S} s"
    r.wall_s = time.perf_counter() - t0
    means, medians = [], []
    for rank in range(job.nproc):
        with contextlib.suppress(OSError, ValueError, KeyError):
            got = json.loads((d / f"step.{rank}").read_text())
            means.append(got["mean_s"])
            medians.append(got["median_s"])
    r.step_s = statistics.median(means) if means else None
    r.median_step_s = statistics.median(medians) if medians else None
    if r.rc != 0 and r.error is None:
        r.error = f"exit {r.rc}: " + _tail(d / "output.log")
    if mode == "traceml":
        r.verdict = traceml_verdict(d / "traceml" / "run" / "final_summary.json")
    elif mode == "laggard" and (d / "trace").is_dir():
        r.verdict = laggard_verdict(d)
    if r.verdict.get("error") and r.error is None:
        r.error = str(r.verdict["error"])
    return r


def _tail(path: Path, n: int = 600) -> str:
    text = path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln]
    return (lines[-1] if lines else text[-n:]).strip()[-n:]


# --------------------------------------------------------------------------- verdicts
def traceml_verdict(path: Path) -> dict[str, object]:
    """TraceML's step-time verdict: kind, the straggler it names (straggler kinds only), the cause."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"error": f"no final_summary.json ({e})"}
    diag = d.get("step_time", {}).get("diagnosis", {}) or {}
    kind = str(diag.get("kind"))
    straggler = kind in TRACEML_CAUSE
    ranks = sorted(int(x) for x in diag.get("ranks") or []) if straggler else []
    primary = d.get("primary_diagnosis", {}) or {}
    return {"kind": kind, "ranks": ranks, "cause": TRACEML_CAUSE.get(kind), "phase": diag.get("phase"),
            "listed_ranks": diag.get("ranks"), "text": f"{diag.get('status')}: {diag.get('summary')}",
            "primary": f"{primary.get('status')}: {primary.get('summary')}"}


def laggard_verdict(d: Path) -> dict[str, object]:
    """laggard's first finding from `laggard analyze --json`: cause, ranks, evidence; later findings' ranks."""
    out = d / "analysis.json"
    with open(d / "analyze.log", "w") as log_f:
        rc = subprocess.run([str(VENV_BIN / "laggard"), "analyze", str(d / "trace"), "--json", str(out)],
                            stdout=log_f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S).returncode
    if rc != 0:
        return {"error": f"laggard analyze exit {rc}: " + _tail(d / "analyze.log")}
    a = json.loads(out.read_text())
    rank_of_stage: dict[int, list[int]] = {}
    for w in a.get("by_worker", []):
        rank_of_stage.setdefault(int(w["stage"]), []).append(int(w["rank"]))

    def ranks_of(f: dict) -> list[int]:
        if f.get("workers"):
            return sorted({int(w["rank"]) for w in f["workers"]})
        return sorted({r for s in f.get("stages") or [] for r in rank_of_stage.get(int(s), [])})

    findings = a.get("findings") or []
    first = findings[0] if findings else None
    others = sorted({r for f in findings[1:] for r in ranks_of(f)})
    s_w = {str(w["rank"]): round(float(w["slowdown"]), 3) for w in a.get("by_worker", [])[:4]}
    if first is None:
        return {"kind": "no finding", "ranks": [], "cause": None, "verdict": a.get("verdict"),
                "slowdown": a.get("slowdown"), "S_w": s_w, "others_named": others, "text": "no finding"}
    cause = first["cause"]
    return {"kind": cause, "ranks": ranks_of(first), "cause": LAGGARD_CAUSE.get(cause, cause),
            "confidence": first.get("confidence"), "verdict": a.get("verdict"), "slowdown": a.get("slowdown"),
            "S_w": s_w, "others_named": others, "text": f"{first['cause']}: {str(first.get('evidence'))[:300]}"}


def is_right(job: Job, v: dict[str, object]) -> bool:
    if not v or v.get("error"):
        return False
    if job.clean:
        return not v.get("ranks")
    return set(v.get("ranks") or []) == set(job.ranks) and v.get("cause") in job.causes


# --------------------------------------------------------------------------- the bench
def _orders(jobs: list[Job], rounds: int) -> list[tuple[Job, int, tuple[str, ...]]]:
    """(job, round, modes in order): the order rotates with every job and round, so no mode always runs
    first (the one that pays for a cold page cache) or right after the same other one."""
    out = []
    for rnd, (i, job) in itertools.product(range(rounds), enumerate(jobs)):
        k = (i + rnd) % len(MODES)
        out.append((job, rnd, MODES[k:] + MODES[:k]))
    return out


def bench(jobs: list[Job], rounds: int, steps: int, work: Path) -> dict[str, object]:
    info = ensure_traceml()
    work.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    t0 = time.perf_counter()
    for job, rnd, modes in _orders(jobs, rounds):
        for mode in modes:
            r = run_one(job, mode, rnd, work, steps)
            runs.append(r)
            step = f"{1e3 * r.step_s:.1f} ms" if r.step_s else "-"
            said = ""
            if mode in ("traceml", "laggard"):
                said = f" -> {'RIGHT' if is_right(job, r.verdict) else 'wrong'}: {r.verdict.get('text', r.error)}"[:160]
            log(f"job {job.num} {job.name} {mode} r{rnd}: {r.wall_s:.0f} s, step {step}{said}"
                + (f" [{r.error[:200]}]" if r.error else ""))
    return {"runs": runs, "traceml_install": info, "seconds": time.perf_counter() - t0}


def _overheads(runs: list[Run], key: str = "step_s") -> dict[int, dict[str, list[float]]]:
    """Per job, per mode: step time (``key``: the mean step, or ``median_step_s``) over the same round's
    untraced run, minus 1, in %."""
    base = {(r.job, r.round): getattr(r, key) for r in runs if r.mode == "untraced" and getattr(r, key)}
    out: dict[int, dict[str, list[float]]] = {}
    for r in runs:
        b, x = base.get((r.job, r.round)), getattr(r, key)
        if r.mode != "untraced" and b and x:
            out.setdefault(r.job, {}).setdefault(r.mode, []).append(100 * (x / b - 1))
    return out


def summarize(jobs: list[Job], res: dict[str, object]) -> list[dict]:
    runs: list[Run] = res["runs"]  # type: ignore[assignment]
    ov, ov_med = _overheads(runs), _overheads(runs, "median_step_s")
    table, right = [], {"traceml": 0, "laggard": 0}
    for job in jobs:
        row: dict[str, object] = {"job": job.num, "name": job.name, "slowed_ranks": sorted(job.ranks),
                                  "causes": sorted(job.causes)}
        for tool in ("traceml", "laggard"):
            mine = [r for r in runs if r.job == job.num and r.mode == tool]
            ok = bool(mine) and all(is_right(job, r.verdict) for r in mine)
            right[tool] += ok
            row[tool] = {"right": ok, "rounds_right": sum(is_right(job, r.verdict) for r in mine),
                         "ranks_right": [set(r.verdict.get("ranks") or []) == set(job.ranks) for r in mine],
                         "said": [r.verdict for r in mine], "errors": [r.error for r in mine if r.error],
                         "overhead_pct": _med(ov.get(job.num, {}).get(tool)),
                         "overhead_median_step_pct": _med(ov_med.get(job.num, {}).get(tool))}
        row["aa_pct"] = _med(ov.get(job.num, {}).get("untraced-aa"))
        row["untraced_step_ms"] = _med([1e3 * r.step_s for r in runs
                                        if r.job == job.num and r.mode == "untraced" and r.step_s])
        table.append(row)
    pooled = {m: [x for j in ov.values() for x in j.get(m, [])] for m in ("traceml", "laggard", "untraced-aa")}
    lag_ov, tml_ov, aa = (_med(pooled[m]) for m in ("laggard", "traceml", "untraced-aa"))
    pooled_med = {m: [x for j in ov_med.values() for x in j.get(m, [])] for m in ("traceml", "laggard", "untraced-aa")}
    tml_right = {row["job"] for row in table if row["traceml"]["right"]}  # type: ignore[index]
    lag_right = {row["job"] for row in table if row["laggard"]["right"]}  # type: ignore[index]
    pipeline = [row for row in table if row["name"].startswith("pipeline")]
    lag_pipe = all(row["laggard"]["right"] for row in pipeline)  # type: ignore[index]
    ok_named = tml_right <= lag_right and lag_pipe
    detail = {"jobs": table, "traceml_install": res["traceml_install"], "bench_seconds": round(res["seconds"], 1),
              "rounds": max((r.round for r in runs), default=0) + 1,
              "jobs_traceml_right_laggard_wrong": sorted(tml_right - lag_right),
              "jobs_laggard_right_traceml_wrong": sorted(lag_right - tml_right),
              "scoring": "see benchmarks/bench_zerocode.py's docstring"}
    figs = [
        {"name": "zero-code: jobs laggard run names right (slowed rank and cause, nothing else)",
         "value": float(right["laggard"]), "unit": f"of {len(jobs)} jobs",
         "baseline": "TraceML 0.5.0 (traceml run) on the same jobs, same run",
         "baseline_value": float(right["traceml"]),
         "target": "right on every job TraceML is right on, and on the pipeline", "ok": ok_named, "detail": detail},
    ]
    if lag_ov is not None and tml_ov is not None:
        figs.append({
            "name": "zero-code: laggard run step-time overhead (median over jobs, vs untraced torchrun)",
            "value": lag_ov, "unit": "%", "baseline": "TraceML 0.5.0's overhead, same jobs and rounds",
            "baseline_value": tml_ov, "target": "<= TraceML's", "ok": lag_ov <= tml_ov,
            "detail": {"a_a_control_pct": aa,
                       "a_a_abs_max_pct": max((abs(x) for x in pooled["untraced-aa"]), default=None),
                       "laggard_pct": pooled["laggard"], "traceml_pct": pooled["traceml"],
                       "a_a_pct": pooled["untraced-aa"],
                       "by_median_step_pct": {m: _med(v) for m, v in pooled_med.items()},
                       "note": "each script's own mean step time (past 5 warm-up steps: their wall time over "
                               "their count), median over ranks; one untraced run per job and round is the base; "
                               "A/A: a second untraced run. by_median_step_pct: the same from the median step"}})
        figs.append({
            "name": "zero-code: A/A control (untraced vs untraced, median over jobs)", "value": aa, "unit": "%",
            "baseline": "0 % (the same command twice)", "baseline_value": 0.0})
    return figs


def _med(xs: list[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


def print_table(figs: list[dict], file=sys.stderr) -> None:  # noqa: ANN001
    rows = figs[0]["detail"]["jobs"]
    print(f"{'job':<24} {'TraceML':<9} {'laggard':<9} {'TraceML ovh':>11} {'laggard ovh':>11} {'A/A':>7}  untraced",
          file=file)
    for row in rows:
        t, lg = row["traceml"], row["laggard"]
        pct = lambda x: "-" if x is None else f"{x:+.1f}%"  # noqa: E731
        print(f"{row['job']:>2} {row['name']:<21} {'right' if t['right'] else 'WRONG':<9} "
              f"{'right' if lg['right'] else 'WRONG':<9} {pct(t['overhead_pct']):>11} {pct(lg['overhead_pct']):>11} "
              f"{pct(row['aa_pct']):>7}  {row['untraced_step_ms'] or 0:.0f} ms", file=file)
        for tool, v in (("TraceML", t), ("laggard", lg)):
            for said in v["said"]:
                print(f"     {tool}: {str(said.get('text') or said.get('error'))[:150]}", file=file)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="laggard run vs TraceML 0.5.0 on real jobs (see the module docstring)")
    ap.add_argument("--quick", action="store_true", help="25 steps a run (default 40)")
    ap.add_argument("--jobs", default="", help="comma-separated job numbers (default: all)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the four runs per job (default 1)")
    ap.add_argument("--work", default=str(WORK), help="where the runs' logs and traces go")
    return ap.parse_args(argv)


def run(argv: list[str] | None = None) -> list[dict]:
    """`make bench`'s entry (settings from LAGGARD_BENCH_ZEROCODE_ARGS, e.g. "--quick --jobs 1,8")."""
    if argv is None:
        argv = os.environ.get("LAGGARD_BENCH_ZEROCODE_ARGS", "").split()
    args = _parse(argv)
    wanted = {int(x) for x in args.jobs.split(",") if x.strip()}
    jobs = [j for j in JOBS if not wanted or j.num in wanted]
    res = bench(jobs, args.rounds, 25 if args.quick else 40, Path(args.work))
    figs = summarize(jobs, res)
    print_table(figs)
    return figs


if __name__ == "__main__":
    out = run(sys.argv[1:])
    WORK.mkdir(parents=True, exist_ok=True)  # --work puts the runs elsewhere; the summary stays here
    Path(WORK / "last.json").write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(f"wrote {WORK / 'last.json'}")
