"""One definition of gain: every finding's gain is the speed-up of the `laggard whatif` command it
prints (the real trace path and every flag the load needed), and running that command through the
CLI gives the same number. On every shipped trace and on generated ones with each injected cause."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.conftest import DATA, ND, run_cli

SHIPPED = [
    [str(ND / "trace-AR.parquet")],
    [str(ND / "trace-ST.parquet"), "--meta", str(ND / "meta-ST.yaml")],
    *[[str(d)] for d in sorted((DATA / "kineto").iterdir()) if d.is_dir()],
]
INJECTED = ["slow-worker:rank=1,factor=1.8", "heavy-last-stage:factor=1.6", "seqlen-imbalance:sigma=0.5",
            "gc-pauses:prob=0.05,pause_ms=40", "slow-link:src=2,dst=3,delay_ms=8", "launch-delay:ms=3"]


def _findings(args: list[str], tmp_path: Path) -> list[dict]:
    out = tmp_path / "a.json"
    assert run_cli("analyze", *args, "--json", out, "-q") == 0
    return json.loads(out.read_text())["findings"]


def _check_commands(findings: list[dict], trace: str, tmp_path: Path) -> int:
    checked = 0
    for f in findings:
        cmd = shlex.split(f["whatif"])
        assert cmd[:2] == ["laggard", "whatif"] and cmd[2] == trace, f["whatif"]
        assert "TRACE" not in cmd
        out = tmp_path / "w.json"
        assert run_cli(*cmd[1:], "--json", out) == 0, f["whatif"]
        speedup = json.loads(out.read_text())["speedup"]
        assert speedup == pytest.approx(f["gain"], rel=1e-9), (f["cause"], f["whatif"], speedup, f["gain"])
        checked += 1
    return checked


@pytest.mark.parametrize("args", SHIPPED, ids=lambda a: Path(a[0]).name)
def test_shipped_findings_commands_give_their_gain(args, tmp_path):
    findings = _findings(args, tmp_path)
    _check_commands(findings, args[0], tmp_path)
    if "trace-AR" in args[0] or "ddp_gloo" in args[0]:
        assert findings, "a straggling job with no finding to check"
    if "trace-ST" in args[0]:  # the flags the load needed are in the command
        assert all("--meta" in f["whatif"] for f in findings) and findings


@pytest.mark.timeout(240)
@pytest.mark.parametrize("cause", INJECTED, ids=lambda c: c.split(":")[0])
def test_generated_findings_commands_give_their_gain(cause, tmp_path):
    job = tmp_path / "job"
    assert run_cli("synth", "--dp", "4", "--pp", "2", "-m", "4", "--steps", "5", "--inject", cause, "--out", job) == 0
    findings = _findings([str(job)], tmp_path)
    assert findings, cause
    assert _check_commands(findings, str(job), tmp_path) == len(findings)


def test_a_wrong_gain_is_caught(tmp_path):
    """The comparison can fail: a gain off by 1% does not pass."""
    findings = _findings([str(ND / "trace-AR.parquet")], tmp_path)
    findings[0]["gain"] *= 1.01
    with pytest.raises(AssertionError):
        _check_commands(findings[:1], str(ND / "trace-AR.parquet"), tmp_path)
