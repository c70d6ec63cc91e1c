"""Suggested commands run: the stage finding's `laggard partition` command (with what the trace lacks
asked for by name), and partition on a stage slowed by one worker says so."""

from __future__ import annotations

import json
import re
import shlex

from tests.conftest import ND, run_cli


def _stage_finding(job, tmp_path) -> dict:
    out = tmp_path / "a.json"
    assert run_cli("analyze", job, "--json", out, "-q") == 0
    return next(f for f in json.loads(out.read_text())["findings"] if f["cause"] == "stage-imbalance")


def _partition_cmd(fix: str) -> list[str]:
    m = re.search(r"`(laggard partition [^`]+)`", fix)
    assert m, fix
    return shlex.split(m.group(1))


def test_stage_finding_partition_command_runs(tmp_path, capsys):
    job = tmp_path / "job"
    assert run_cli("synth", "--dp", "2", "--pp", "4", "-m", "4", "--steps", "4", "--inject",
                   "heavy-last-stage:factor=1.8", "--out", job) == 0
    f = _stage_finding(job, tmp_path)
    cmd = _partition_cmd(f["fix"])
    # the trace does not record the layer count: the command asks for exactly that
    assert cmd[-2:] == ["--num-layers", "N"] and "decoder layers" in f["fix"] and cmd[2] == str(job)
    assert run_cli(*cmd[1:-1], "16") == 0
    # where the trace records it, the command needs nothing more and runs as printed
    meta = json.loads((job / "job.json").read_text())
    meta.setdefault("extra", {})["num_layers"] = 16
    (job / "job.json").write_text(json.dumps(meta))
    f = _stage_finding(job, tmp_path)
    cmd = _partition_cmd(f["fix"])
    assert "--num-layers" not in cmd
    capsys.readouterr()
    assert run_cli(*cmd[1:]) == 0
    assert "proposed:" in capsys.readouterr().out


def test_partition_without_layers_asks_for_them(capsys):
    assert run_cli("partition", ND / "trace-ST.parquet") == 2
    err = capsys.readouterr().err
    assert "trace-ST.parquet" in err and "--num-layers N" in err and "--layers-per-stage" in err


def test_partition_says_a_stage_is_slow_because_of_one_worker(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert run_cli("partition", ND / "trace-AR.parquet", "--num-layers", "32", "--json", out) == 0
    d = json.loads(out.read_text())
    assert [(w["stage"], w["rank"]) for w in d["slow_workers"]] == [(0, 0)]
    # sized by its typical replica, stage 0 is no bottleneck: no layers move off it
    assert d["proposed"]["counts"][0] >= d["current"]["counts"][0]
    assert run_cli("partition", ND / "trace-AR.parquet", "--num-layers", "32") == 0
    assert "slow because of one worker" in capsys.readouterr().out
    # ST's slow stage is its layers: no such note
    assert run_cli("partition", ND / "trace-ST.parquet", "--num-layers", "32", "--json", out) == 0
    assert json.loads(out.read_text())["slow_workers"] == []
