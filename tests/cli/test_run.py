"""`laggard run`: real 2-rank gloo jobs launched through torch's launcher, traced with no change to the
script; exit codes, the trace kept after a failure, and a killed rank named as missing."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

LAGGARD = Path(sys.executable).with_name("laggard")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")

# A small DDP loop that knows nothing of laggard; --mode makes it fail in one of the ways tested. It takes
# --out too, to show that what follows SCRIPT is the script's.
SCRIPT = '''\
import argparse, os, signal, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--mode", default="ok")
p.add_argument("--out", default="")
a = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(a.steps):
    if step == 5 and a.mode == "exit":
        sys.exit(3)
    if step == 5 and rank == 1 and a.mode == "raise":
        raise RuntimeError("boom on purpose")
    if step == 5 and rank == 1 and a.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    opt.zero_grad()
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
    time.sleep(0.01)
dist.destroy_process_group()
print(f"rank {rank} finished, out={a.out}")
'''


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text(SCRIPT)
    return p


def _run(cwd: Path, *args: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAGGARD_") or k.startswith("LAGGARD_CACHE")}
    return subprocess.run([str(LAGGARD), "run", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def _shard_ranks(trace: Path) -> set[int]:
    return {int(m.group(1)) for p in trace.iterdir() if (m := re.match(r"ops-rank(\d+)-\d+\.parquet$", p.name))}


@needs_torch
def test_run_traces_every_rank_and_prints_the_analysis(tmp_path, script, capsys):
    p = _run(tmp_path, "--nproc-per-node", "2", script.name, "--out", "not-laggards")
    assert p.returncode == 0, p.stderr
    assert "rank 0 finished, out=not-laggards" in p.stdout and "rank 1 finished" in p.stdout
    (trace,) = (tmp_path / "laggard-run").glob("train-*")  # the default place, under the current directory
    assert (trace / "job.json").is_file()
    assert _shard_ranks(trace) == {0, 1}
    assert not (tmp_path / "not-laggards").exists()
    assert f"laggard: the trace is in {trace}" in p.stdout
    headline = [line for line in p.stdout.splitlines() if line.startswith("straggler slowdown S = ")]
    assert len(headline) == 1
    assert run_cli("analyze", trace) == 0  # what `laggard analyze DIR` prints, the same
    assert headline[0] in capsys.readouterr().out


@needs_torch
def test_a_script_that_exits_3_exits_3_and_keeps_its_trace(tmp_path, script):
    out = tmp_path / "t"
    p = _run(tmp_path, "--nproc-per-node=2", "--out", out, "--no-analyze", script, "--mode", "exit")
    assert p.returncode == 3, p.stderr
    assert re.search(rf"laggard: the script exited with code 3 on rank [01]; the trace so far is in {out}$",
                     p.stderr, re.M), p.stderr
    assert (out / "job.json").is_file() and _shard_ranks(out) == {0, 1}
    assert "straggler slowdown" not in p.stdout  # --no-analyze


@needs_torch
def test_a_script_that_raises_exits_1_with_its_traceback(tmp_path, script):
    out = tmp_path / "t"
    p = _run(tmp_path, "--nproc_per_node", "2", "--out", out, "-q", script, "--mode", "raise")
    assert p.returncode == 1, p.stderr
    assert "RuntimeError: boom on purpose" in p.stderr  # the rank's own traceback
    assert re.search(r"^laggard: the script exited with code 1 on rank 1; the trace so far is in ", p.stderr, re.M)
    assert "Traceback" not in p.stderr.split("laggard: the script exited")[1]  # laggard's part: one line each
    assert (out / "job.json").is_file()
    assert "straggler slowdown" not in p.stdout  # -q: no summary,
    assert "OMP_NUM_THREADS" not in p.stderr  # and no launcher log lines


@needs_torch
def test_a_killed_rank_is_named_missing_and_the_rest_analyzed(tmp_path, script):
    out = tmp_path / "t"
    p = _run(tmp_path, "--nproc-per-node", "2", "--out", out, script, "--mode", "kill")
    assert p.returncode == 128 + 9, p.stderr
    assert f"laggard: rank 1 was killed by SIGKILL (exit code 137); the trace so far is in {out}" in p.stderr
    assert 0 in _shard_ranks(out)
    warned = [line for line in p.stderr.splitlines() if line.startswith("laggard: warning:")]
    # the loader's check of the tracer's files: rank 1 left no ops, or did not close its trace
    assert any(re.search(r"\brank(\(s\))? 1\b.*(no ops|did not close)", line) for line in warned), p.stderr
    assert "straggler slowdown S = " in p.stdout  # rank 0's trace, analyzed


def test_bad_input_is_one_line_before_anything_starts(tmp_path, script, capsys):
    (tmp_path / "file").write_text("")
    old = tmp_path / "old"
    old.mkdir()
    (old / "job.json").write_text("{}")
    cases = [
        (["--out", tmp_path / "file" / "x", script], "--out"),  # under a regular file: cannot be created
        (["--out", tmp_path / "file", script], "is a file"),
        (["--out", old, script], "already holds a trace"),
        ([tmp_path / "missing.py"], "no such script"),
        (["-m", "no_such_module_here.train"], "no module named"),
        (["--nproc-per-node", "0", script], "--nproc-per-node"),
        (["--nproc-per-node", "two", script], "--nproc-per-node"),
        (["--nnodes", "2:1", script], "--nnodes"),
        (["--nnodes", "2", script], "give --out"),  # each node's default directory would differ
    ]
    for args, what in cases:
        assert run_cli("run", *args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("laggard: error: ") and len(err.strip().splitlines()) == 1, err
        assert what in err, err
    assert not (tmp_path / "laggard-run").exists()


def test_run_help_and_bad_input_do_not_import_torch(tmp_path):
    code = ("import sys; from laggard.cli.base import main; "
            f"main(['run', '--help']); main(['run', {str(tmp_path / 'missing.py')!r}]); "
            "print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "--nproc-per-node" in p.stdout and "laggard-run/" in p.stdout  # the default --out, in the help
    assert p.stdout.splitlines()[-1] == "False"
