"""A stage-imbalance finding's gain agrees with its fix command: where the layer count is
known, the gain shown is that of `laggard partition`'s whole-layer split, with the continuous bound
beside it, labelled; where it is unknown, the bound alone, labelled."""

from __future__ import annotations

import json
import shlex

import pytest

from laggard.report.wording import finding_text
from tests.conftest import DATA, ND, run_cli

pytestmark = pytest.mark.timeout(300)

HEAVY = DATA / "tracer" / "heavy_last_stage"  # a real Tracer trace: job.json records num_layers
SLOW_RANK = DATA / "corpus" / "job054" / "trace"  # a real dp1 x pp3 job read as stage imbalance


def _stage_finding(tmp_path, *args) -> dict:
    out = tmp_path / "a.json"
    assert run_cli("analyze", *args, "--json", out, "-q") == 0
    return next(f for f in json.loads(out.read_text())["findings"] if f["cause"] == "stage-imbalance")


def _partition_predicts(tmp_path, command: str) -> float:
    """Run the partition command exactly as the finding prints it; its replayed speed-up."""
    out = tmp_path / "p.json"
    argv = shlex.split(command)
    assert argv[:2] == ["laggard", "partition"]
    assert run_cli(*argv[1:], "--json", out) == 0
    return json.loads(out.read_text())["whatif"]["speedup"]


@pytest.mark.parametrize("args", [(ND / "trace-ST.parquet", "--num-layers", "32"), (HEAVY,), (SLOW_RANK,),
                                  (HEAVY, "--num-layers", "8")],
                         ids=["ST --num-layers", "tracer heavy stage", "tracer slow rank", "given over the trace's"])
def test_shown_gain_is_what_partition_predicts(tmp_path, args):
    f = _stage_finding(tmp_path, *args)
    assert f["gain_bound"] is True and f["gain_layers"] is not None
    plan = f["layers_plan"]
    assert f["gain_layers"] == pytest.approx(_partition_predicts(tmp_path, plan["command"]), rel=1e-9)
    assert f["gain_layers"] == pytest.approx(plan["speedup"])
    assert plan["command"] in f["fix"] and "bound of a continuous split" in f["fix"]
    t = finding_text(f)
    assert t.gain.startswith(f"fixing it: {f['gain_layers']:.2f}x faster moving whole layers")
    assert f"{f['gain']:.2f}x is the bound of a continuous split" in t.gain and t.check_label == "check the bound"


def test_st_numbers(tmp_path):
    """The issue's numbers: the finding said 1.32x; `partition --num-layers 32` predicts 1.153x."""
    f = _stage_finding(tmp_path, ND / "trace-ST.parquet", "--num-layers", "32")
    assert round(f["gain"], 2) == 1.32 and round(f["gain_layers"], 3) == 1.153
    assert f["layers_plan"]["current"] == [8, 8, 8, 8] and f["layers_plan"]["proposed"] == [9, 10, 9, 4]
    assert "--num-layers 32" in f["layers_plan"]["command"]


def test_unknown_layers_keep_the_labelled_bound(tmp_path, capsys):
    f = _stage_finding(tmp_path, ND / "trace-ST.parquet")
    assert f["gain_layers"] is None and f["layers_plan"] is None and f["gain_bound"] is True
    assert "bound of a continuous split" in f["fix"] and "--num-layers N" in f["fix"]
    assert finding_text(f).gain == (f"fixing it: up to {f['gain']:.2f}x faster "
                                    "(the bound of a continuous split; whole layers gain less)")
    capsys.readouterr()
    assert run_cli("analyze", ND / "trace-ST.parquet") == 0
    out = capsys.readouterr().out
    assert "(bound)" in out and "whole layers):" not in out and f"check 1 ({f['gain']:.2f}x):" in out


def test_terminal_and_html_show_the_layer_gain(tmp_path, capsys):
    html = tmp_path / "r.html"
    capsys.readouterr()
    assert run_cli("analyze", ND / "trace-ST.parquet", "--num-layers", "32", "--html", html) == 0
    out = capsys.readouterr().out
    assert "1.15x" in out and "(bound" in out and "1.32x)" in out
    assert "check 1 (1.15x, whole layers):" in out and "check 1's bound (1.32x, a continuous split):" in out
    page = html.read_text()
    assert "1.15x<br><small>moving whole layers; 1.32x is the bound of a continuous split</small>" in page
    assert "check the 1.32x bound:" in page


def test_a_finding_without_a_partition_fix_has_no_bound(tmp_path):
    out = tmp_path / "a.json"
    assert run_cli("analyze", ND / "trace-AR.parquet", "--num-layers", "32", "--json", out, "-q") == 0
    found = json.loads(out.read_text())["findings"]
    assert found and all(f["cause"] != "stage-imbalance" for f in found)
    for f in found:
        assert f["gain_bound"] is False and f["gain_layers"] is None and f["layers_plan"] is None
        assert finding_text(f).gain == f"fixing it: {f['gain']:.2f}x faster"


def test_bad_layer_count_is_one_line(capsys):
    assert run_cli("analyze", ND / "trace-ST.parquet", "--num-layers", "2", "-q") == 2
    err = capsys.readouterr().err.strip()
    assert "--num-layers must be >= the trace's 4 stages" in err and "\n" not in err
    assert run_cli("analyze", ND / "trace-ST.parquet", "--num-layers", "0", "-q") == 2
