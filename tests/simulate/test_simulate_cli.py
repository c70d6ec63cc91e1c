"""``laggard simulate tail|policy`` through the real entry point: output, JSON, plots, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from laggard.cli.base import main

AR_TRACE = Path(__file__).parents[1] / "data" / "ndtimeline" / "trace-AR.parquet"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_tail_prints_a_table_and_writes_json_and_png(tmp_path: Path, capsys) -> None:
    out, png = tmp_path / "tail.json", tmp_path / "tail.png"
    code = main(["simulate", "tail", "--dist", "exponential:rate=1", "--workers", "1,4,64", "--trials", "3000",
                 "--seed", "1", "--json", str(out), "--plot", str(png)])
    assert code == 0
    text = capsys.readouterr().out
    assert "E[max]" in text and "slowdown" in text and "exponential(rate=1)" in text
    data = json.loads(out.read_text())
    assert [r["workers"] for r in data["rows"]] == [1, 4, 64]
    for r in data["rows"]:
        assert set(r) >= {"workers", "mean", "p99", "slowdown"}
    assert data["rows"][0]["slowdown"] == 1.0
    assert data["rows"][2]["exact_mean"] == pytest.approx(sum(1 / j for j in range(1, 65)))
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_tail_json_to_stdout_is_pure_json(capsys) -> None:
    assert main(["simulate", "tail", "--workers", "2", "--trials", "500", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spec"] == "lognormal:base=1.0,mean=-0.7,sigma=0.9"  # the default is the textbook model


def test_policy_table_json_and_plot(tmp_path: Path, capsys) -> None:
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    code = main(["simulate", "policy", "--dist", "gaussian:mean=1,std=0.05", "--workers", "256",
                 "--policy", "bsp", "--policy", "backup:1", "--policy", "drop:2", "--policy", "ssp:3",
                 "--trials", "4000", "--steps", "40", "--json", str(out), "--plot", str(png)])
    assert code == 0
    text = capsys.readouterr().out
    assert "backup:1" in text and "barely helps" in text
    data = json.loads(out.read_text())
    assert [r["policy"] for r in data["rows"]] == ["bsp", "backup:1", "drop:2", "ssp:3"]
    for r in data["rows"]:
        assert set(r) >= {"policy", "mean", "p99", "idle_fraction", "compute_multiplier"}
    assert data["rows"][1]["compute_multiplier"] == pytest.approx(2.0)
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_svg_for_the_html_report() -> None:
    from laggard.simulate.dists import parse_dist
    from laggard.simulate.plots import policy_svg, tail_svg
    from laggard.simulate.policies import compare_policies
    from laggard.simulate.tail import tail_at_scale

    d = parse_dist("textbook")
    svg = tail_svg(tail_at_scale(d, [1, 8], num_trials=200))
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "</svg>" in svg
    assert svg == tail_svg(tail_at_scale(d, [1, 8], num_trials=200))  # deterministic
    assert "<svg" in policy_svg(compare_policies(d, 8, ["bsp", "backup:1"], num_trials=200))


def test_plot_as_svg_file(tmp_path: Path) -> None:
    target = tmp_path / "t.svg"
    assert main(["simulate", "tail", "--workers", "1,2", "--trials", "200", "--plot", str(target), "--json",
                 str(tmp_path / "x.json")]) == 0
    assert "<svg" in target.read_text()


@pytest.mark.skipif(not AR_TRACE.exists(), reason="shipped trace missing")
def test_from_trace_projects_the_ar_job_to_4x_and_16x(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ar.json"
    code = main(["simulate", "tail", "--from-trace", str(AR_TRACE), "--workers", "1x,4x,16x", "--trials", "3000",
                 "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "measured" in text and "rank 0" in text
    data = json.loads(out.read_text())
    assert [r["workers"] for r in data["rows"]] == [16, 64, 256]
    assert data["reference_workers"] == 16
    assert data["source"]["num_workers"] == 16
    rows = data["rows"]
    assert rows[0]["vs_reference"] == 1.0
    assert rows[0]["mean"] == pytest.approx(data["source"]["measured_barrier_s"], rel=0.005)
    assert 1.0 <= rows[1]["vs_reference"] <= rows[2]["vs_reference"] < 1.02
    # the same through the trace: spec, and the policy command at 4x
    assert main(["simulate", "policy", "--dist", f"trace:{AR_TRACE}", "--workers", "32", "--policy", "drop:2",
                 "--trials", "1000", "--json", "-"]) == 0
    pol = json.loads(capsys.readouterr().out)
    assert pol["workers"] == 32
    assert main(["simulate", "policy", "--from-trace", str(AR_TRACE), "--workers", "4x", "--policy", "backup:1",
                 "--trials", "1000", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["workers"] == 64


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["simulate", "tail", "--dist", "lognormal:sigma=-1", "--trials", "200"], "sigma must be > 0"),
        (["simulate", "tail", "--dist", "weibull"], "unknown distribution 'weibull'"),
        (["simulate", "tail", "--workers", "1,x", "--trials", "200"], "'x' is not a worker count"),
        (["simulate", "tail", "--workers", "4x", "--trials", "200"], "need --from-trace"),
        (["simulate", "tail", "--workers", "0", "--trials", "200"], "worker counts must be >= 1"),
        (["simulate", "tail", "--trials", "5"], "at least 100 trials"),
        (["simulate", "tail", "--trials", "200", "--workers", "2", "--plot", "out.jpg"], "must end in .png or .svg"),
        (["simulate", "tail", "--trials", "200", "--workers", "2", "--plot", "/no/such/dir/x.png"], "does not exist"),
        (["simulate", "tail", "--threads", "0"], "--threads"),
        (["simulate", "tail", "--from-trace", "/no/such/trace.parquet"], "no such file"),
        (["simulate", "tail", "--from-trace", "x.parquet", "--dist", "textbook"], "not both"),
        (["simulate", "policy", "--policy", "gossip"], "unknown policy 'gossip'"),
        (["simulate", "policy", "--policy", "backup:0", "--trials", "200"], "copies must be"),
        (["simulate", "policy", "--workers", "8", "--policy", "drop:9", "--trials", "200"], "cannot drop 9 of 8"),
        (["simulate", "policy", "--workers", "8,16"], "one job size"),
        (["simulate", "policy", "--workers", "8", "--steps", "1", "--policy", "ssp:1"], "--steps"),
        (["simulate", "tail", "--trials", "many"], "many"),
        (["simulate", "tail", "--trials", "200", "--seed", "-3"], "seed must be an integer >= 0"),
        (["simulate", "tail", "--trials", "1000000000"], "at most 100000000 trials"),
        (["simulate", "policy", "--trials", "200", "--seed", "-1"], "seed must be an integer >= 0"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(args: list[str], fragment: str, capsys) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert fragment in err
    assert len(err.splitlines()) == 1
    assert "Traceback" not in captured.err + captured.out


def test_help_lists_both_commands(capsys) -> None:
    assert main(["simulate", "--help"]) == 0
    text = capsys.readouterr().out
    assert "tail" in text and "policy" in text
    for cmd in ("tail", "policy"):
        assert main(["simulate", cmd, "--help"]) == 0
        help_text = capsys.readouterr().out
        for opt in ("--dist", "--workers", "--trials", "--seed", "--json", "--plot", "--from-trace"):
            assert opt in help_text


def test_cli_module_is_light_at_import() -> None:
    code = ("import sys, laggard.cli.simulate; "
            "heavy = [m for m in ('matplotlib', 'laggard.simulate.policies', 'laggard.simulate.tail', "
            "'laggard.simulate.empirical', 'torch') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_simulation_never_imports_torch() -> None:
    code = ("import sys\n"
            "from laggard.simulate.dists import parse_dist\n"
            "from laggard.simulate.policies import compare_policies\n"
            "from laggard.simulate.tail import tail_at_scale\n"
            "from laggard.simulate import plots\n"
            "compare_policies(parse_dist('textbook'), 4, num_trials=200)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_warnings_are_one_line_and_the_command_goes_on(capsys) -> None:
    assert main(["simulate", "tail", "--dist", "pareto:alpha=0.8", "--workers", "1,2", "--trials", "200"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laggard: warning:") and "infinite mean" in lines[0]
    assert "E[max]" in captured.out
