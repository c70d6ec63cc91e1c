"""`laggard hang` accuracy on a labelled corpus cut from real dumps, beside torch's `fr_trace`.

The real dumps come from examples/flight_jobs.py, run here (8 gloo jobs, 3-4 ranks, each broken
in a known way). Every case is one of those jobs' dumps cut or perturbed (JSON, mixed formats,
file names with no common prefix, plain torch dumps with laggard's additions stripped, wrapped
buffers, a rank's dump dropped, a dump taken earlier, another job's dump, a duplicate, garbage
files); its label is the job's truth.json adjusted by what the perturbation did, never laggard's
output. torch's analyzer runs on the same directories (one worker process that imports torch
once): its exit status and whether its output names the culprit ranks. Then 1,024 ranks of dumps.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCENARIOS = ["healthy", "late", "skip", "size", "stuck", "killed", "pp", "dppp"]
PLAIN_OK = {"healthy", "late", "skip", "size", "stuck", "dppp"}  # decidable from torch's own dump alone
NUM_WRAPS = 11


def _load(trace: Path) -> dict[int, dict]:
    out = {}
    for f in sorted(trace.glob("flight-rank*.pkl")):
        d = pickle.loads(f.read_bytes())
        out[d["laggard"]["rank"]] = d
    return out


def _plain(d: dict) -> dict:
    d = dict(d)
    d.pop("laggard", None)
    d["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
    return d


def _write(case: Path, dumps: dict[int, dict], *, fmt: str = "pickle", names: str = "std", label: dict) -> None:
    case.mkdir(parents=True)
    for r, d in dumps.items():
        f = {"pickle": "pickle", "json": "json", "mixed": "json" if r % 2 else "pickle"}[fmt]
        name = f"fr_{r}" if names == "std" else [f"host{r}-trace.bin", f"dump.rank{r}", f"r{r}_x.out"][r % 3]
        if f == "json":
            (case / name).write_text(json.dumps(d, default=str))
        else:
            (case / name).write_bytes(pickle.dumps(d))
    (case.parent / f"{case.name}.label.json").write_text(json.dumps(label))


def build_corpus(jobs: Path, out: Path) -> list[tuple[Path, dict]]:
    rng = random.Random(0)
    cases: list[tuple[Path, dict]] = []

    def add(name: str, dumps: dict[int, dict], label: dict, **kw) -> Path:
        p = out / f"{len(cases):03d}-{name}"
        _write(p, dumps, label=label, **kw)
        cases.append((p, label))
        return p

    for sc in SCENARIOS:
        truth = json.loads((jobs / sc / "truth.json").read_text())
        base = _load(jobs / sc / "trace")
        if len(base) < 2:
            raise RuntimeError(f"the real job {sc!r} left {len(base)} dump(s): generation failed")
        label = {"verdict": truth["verdict"], "culprit_ranks": truth["culprit_ranks"]}
        add(f"{sc}-asis", base, label)
        add(f"{sc}-json", base, label, fmt="json")
        add(f"{sc}-mixed", base, label, fmt="mixed")
        add(f"{sc}-noprefix", base, label, names="odd")
        if sc in PLAIN_OK:
            plain = {r: _plain(d) for r, d in base.items()}
            add(f"{sc}-plain", plain, label)
            add(f"{sc}-plain-json", plain, label, fmt="json")
        for k in range(NUM_WRAPS):  # wrapped buffers: each rank keeps its newest n entries (n >= 3)
            cut = {r: {**d, "entries": d["entries"][-rng.randint(3, max(3, len(d["entries"]))):]}
                   for r, d in base.items()}
            add(f"{sc}-wrap{k}", cut, label, fmt=["pickle", "json", "mixed"][k % 3])
            if sc in PLAIN_OK and k < 3:
                add(f"{sc}-wrap{k}-plain", {r: _plain(d) for r, d in cut.items()}, label)
        culprits = set(truth["culprit_ranks"])
        for r in sorted(base):  # a rank's dump lost
            if r in culprits:
                continue
            rest = {q: d for q, d in base.items() if q != r}
            if truth["verdict"] in ("healthy", "late", "straggling"):
                lab = {"verdict": "missing-ranks", "culprit_ranks": [r]}
            elif sc == "killed":
                lab = {"verdict": "missing-ranks", "culprit_ranks": sorted(culprits | {r})}
            elif sc == "size":  # rank 2 crashed in the desync: two ranks left disagree, no majority
                lab = {"verdict": "desync", "culprit_ranks": []}
            elif sc == "pp" and r == 2 or sc == "dppp" and r == 1:
                continue  # the only rank that shows whom it waits for: no longer decidable
            else:
                lab = label
            add(f"{sc}-drop{r}", rest, lab)
        other = _load(jobs / SCENARIOS[(SCENARIOS.index(sc) + 1) % len(SCENARIOS)] / "trace")
        p = add(f"{sc}-otherjob", base, label)
        (p / "zz_other_0").write_bytes(pickle.dumps(other[min(other)]))
        p = add(f"{sc}-dup", base, label)
        r0 = min(base)
        (p / f"copy_of_{r0}.pkl").write_bytes(pickle.dumps(base[r0]))
        p = add(f"{sc}-garbage", base, label)
        (p / "empty.pkl").write_bytes(b"")
        (p / "trunc.pkl").write_bytes(pickle.dumps(base[r0])[:150])
        (p / "notes.json").write_text('{"not": "a dump"}')
        if truth["verdict"] in ("healthy", "straggling"):  # one rank dumped earlier (fewer entries, older time)
            for r in sorted(base):
                d = dict(base[r])
                d["entries"] = d["entries"][:-2]
                d["laggard"] = {**d["laggard"], "dump_unix_ns": d["entries"][-1]["time_created_ns"] + 1}
                add(f"{sc}-early{r}", {**base, r: d}, label)
    return cases


_FR_WORKER = r"""
import json, os, sys, tempfile
from torch.distributed.flight_recorder.fr_trace import main
out = []
for case in json.loads(sys.stdin.read()):
    log = tempfile.TemporaryFile()
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(log.fileno(), 1); os.dup2(log.fileno(), 2)
    try:
        main([case]); code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:
        code = 1; print(type(e).__name__, e)
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(saved[0], 1); os.dup2(saved[1], 2)
    log.seek(0)
    out.append({"case": case, "code": code, "output": log.read().decode(errors="replace")[-20000:]})
print(json.dumps(out))
"""


def _fr_names(output: str, culprits: list[int]) -> bool:
    if not culprits:
        return "Not all ranks joining" not in output and "mismatch" not in output.lower()
    return ("{" + ", ".join(str(r) for r in sorted(culprits)) + "}") in output


def _laggard(case: Path) -> dict | None:
    import warnings

    from laggard.hang import analyze_hang

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            rep = analyze_hang([case])
        except ValueError:
            return None
    return {"verdict": rep.verdict, "culprit_ranks": rep.culprit_ranks}


def _scale(base: dict[int, dict], out: Path, num_ranks: int) -> Path:
    """num_ranks dumps from the 'skip' job: every rank a copy of rank 0's, rank 1 its own (behind)."""
    out.mkdir(parents=True)
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(num_ranks)))}}
    for r in range(num_ranks):
        d = dict(base[1 if r == 1 else 0])
        d["pg_config"] = cfg
        d["laggard"] = {**d["laggard"], "rank": r, "world_size": num_ranks}
        (out / f"fr_{r}").write_bytes(pickle.dumps(d))
    return out


def run() -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-hang-"))
    try:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "examples" / "flight_jobs.py"), str(tmp / "jobs"), *SCENARIOS],
                       env=env, check=True, timeout=600)
        gen_s = time.perf_counter() - t0
        cases = build_corpus(tmp / "jobs", tmp / "corpus")
        print(f"bench_hang: {len(cases)} cases from {len(SCENARIOS)} real jobs ({gen_s:.0f} s)", file=sys.stderr)
        ok = 0
        wrong: list[str] = []
        for case, label in cases:
            got = _laggard(case)
            if got == label:
                ok += 1
            else:
                wrong.append(f"{case.name}: {got} != {label}")
        fr = subprocess.run([sys.executable, "-c", _FR_WORKER], input=json.dumps([str(c) for c, _ in cases]),
                            capture_output=True, text=True, env=env, timeout=1800)
        fr_res = json.loads(fr.stdout.strip().splitlines()[-1]) if fr.returncode == 0 else []
        fr_exit0 = sum(r["code"] == 0 for r in fr_res)
        fr_named = sum(r["code"] == 0 and _fr_names(r["output"], lab["culprit_ranks"])
                       for r, (_, lab) in zip(fr_res, cases, strict=False))
        # 1,024 ranks
        big = _scale(_load(tmp / "jobs" / "skip" / "trace"), tmp / "big", 1024)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "laggard.cli.base", "hang", str(big),
                            "--json", str(tmp / "big.json")],
                           env=env, capture_output=True, text=True, timeout=600)
        lag_s = time.perf_counter() - t0
        big_ok = p.returncode == 0 and json.loads((tmp / "big.json").read_text())["culprit_ranks"] == [1]
        t0 = time.perf_counter()
        q = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(big)],
                           env=env, capture_output=True, text=True, timeout=600)
        fr_s = time.perf_counter() - t0
        n = len(cases)
        return [
            {"name": "hang_accuracy", "value": ok / n, "unit": "fraction", "target": "1.0", "ok": ok == n,
             "baseline": "torch fr_trace names the culprit ranks (exit 0)", "baseline_value": fr_named / n,
             "detail": {"num_cases": n, "laggard_correct": ok, "laggard_wrong": wrong[:20],
                        "fr_trace_exit0": fr_exit0, "fr_trace_names_culprits": fr_named,
                        "fr_trace_worker_rc": fr.returncode, "real_jobs_s": round(gen_s, 1)}},
            {"name": "hang_1024_ranks_s", "value": lag_s, "unit": "s", "baseline": "torch fr_trace, same dumps",
             "baseline_value": fr_s,
             "detail": {"laggard_rc": p.returncode, "laggard_culprit_right": big_ok, "fr_trace_rc": q.returncode,
                        "fr_trace_names_culprit": q.returncode == 0 and _fr_names(q.stdout + q.stderr, [1]),
                        "entries_per_dump": len(_load(tmp / "jobs" / "skip" / "trace")[0]["entries"])}},
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
