"""`laggard diff A B` through the CLI on real files: terminal, --json and --html; and bad input
(missing files, traces that cannot be compared, wrong flags): one line, exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, ND, run_cli
from tests.whatif.test_diff import slowed

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    from laggard.io import load_job
    from laggard.optable.ops import write_native

    root = tmp_path_factory.mktemp("diff")
    write_native(load_job(ND / "trace-ST.parquet"), root / "a")
    return root / "a", slowed(root / "a", root / "b", [("forward-compute", "rank", 6, 1.6)])


def test_json_html_and_terminal(runs, tmp_path, capsys):
    a, b = runs
    out, page = tmp_path / "d.json", tmp_path / "d.html"
    assert run_cli("diff", a, b, "--json", out, "--html", page) == 0
    term = capsys.readouterr().out
    d = json.loads(out.read_text())
    top = d["contributions"][0]
    assert top["selector"] == "optype=forward-compute,rank=6" and top["share"] == pytest.approx(1.0, abs=0.02)
    assert sum(c["share"] for c in d["contributions"]) == pytest.approx(1.0, abs=1e-9)
    assert d["change"] > 0 and d["a"]["paths"] == [str(a)] and d["b"]["paths"] == [str(b)]
    assert f"B is {100 * d['change']:.1f}% slower than A" in term
    assert "forward-compute on rank 6" in term and "laggard whatif" in term
    html = page.read_text()
    assert "optype=forward-compute,rank=6" in html and "<svg" not in html and "What changed" in html


def test_json_to_stdout_is_only_json(runs, capsys):
    assert run_cli("diff", *runs, "--json", "-") == 0
    assert json.loads(capsys.readouterr().out)["contributions"]


def test_console_script_in_a_subprocess(runs):
    a, b = runs
    p = subprocess.run([sys.executable, "-c", "from laggard.cli.base import entry; entry()", "diff", str(b), str(a),
                        "-q", "--json", "-"], capture_output=True, text=True, env={"PYTHONPATH": str(SRC)}, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    # B (the edited copy's reference) is faster; a share is of the change, whichever way it goes
    assert d["change"] < 0 and d["contributions"][0]["selector"] == "optype=forward-compute,rank=6"
    assert d["contributions"][0]["share"] == pytest.approx(1.0, abs=0.02)


def _one_line_error(capsys, *args) -> str:
    code = run_cli(*args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("laggard: warning: ")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("laggard: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_bad_input(runs, tmp_path, capsys):
    a, _ = runs
    assert "B: " in _one_line_error(capsys, "diff", a, tmp_path / "nope")
    assert "A: " in _one_line_error(capsys, "diff", tmp_path / "nope", a)
    assert "no op type in common" in _one_line_error(capsys, "diff", DATA / "kineto" / "ddp_gloo", a)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "job.json").write_text("{not json")
    (corrupt / "ops-00000.parquet").write_bytes(b"not parquet")
    assert str(corrupt) in _one_line_error(capsys, "diff", a, corrupt)
    assert "--max-parts must be 1 to 10" in _one_line_error(capsys, "diff", a, a, "--max-parts", "0")
    assert "--max-parts" in _one_line_error(capsys, "diff", a, a, "--max-parts", "many")
    assert "--json" in _one_line_error(capsys, "diff", a, a, "--json", tmp_path)
    assert "Missing argument" in _one_line_error(capsys, "diff", a)


def test_max_regression_is_a_ci_gate(runs, tmp_path, capsys):
    """``--max-regression PCT``: exit 1 when B is more than PCT% slower than A, after the comparison is
    printed and written; 0 within it (and B against itself); a bad value is one line, exit 2. The
    change is read off the written JSON, not off the gate."""
    a, b = runs
    out = tmp_path / "d.json"
    assert run_cli("diff", a, b, "--json", out, "-q") == 0
    change = json.loads(out.read_text())["change"]
    capsys.readouterr()
    assert change > 0.01
    below, above = f"{100 * change * 0.5:.3f}%", f"{100 * change * 1.5:.3f}"
    assert run_cli("diff", a, b, "--max-regression", below, "--json", out) == 1
    res = capsys.readouterr()
    assert "slower than A" in res.out and f"laggard: regression: B's step is {100 * change:.1f}% slower" in res.err
    assert out.exists()
    assert run_cli("diff", a, b, "--max-regression", above, "-q") == 0
    assert run_cli("diff", b, a, "--max-regression", "0", "-q") == 0  # A is faster than B: no regression
    capsys.readouterr()
    assert run_cli("diff", a, b, "--max-regression", "five") == 2
    assert "--max-regression: cannot read 'five'" in capsys.readouterr().err


def _words(text: str) -> str:
    """The terminal's text with the lines rich wrapped at 80 columns joined again."""
    return " ".join(text.split())


def test_unrelated_jobs_are_warned_in_the_headline_and_the_json(tmp_path, capsys):
    """The published AR and ST traces are two unrelated jobs: exit 0, and the headline and the JSON
    say the layouts differ; the headline states the large share no duration of B carries."""
    out = tmp_path / "d.json"
    assert run_cli("diff", ND / "trace-AR.parquet", ND / "trace-ST.parquet", "--json", out) == 0
    term = _words(capsys.readouterr().out)
    d = json.loads(out.read_text())
    warning = "A is dp 4 x pp 4 x tp 4 (16 ranks), B is dp 2 x pp 4 (8 ranks): the attribution compares unlike jobs"
    assert d["layout_mismatch"] == ["ranks", "dp", "tp"] and d["warnings"][0] == warning
    assert f"Warning: {warning}" in term
    rest = [c for c in d["contributions"] if c["what"].startswith("not from durations")]
    assert len(rest) == 1 and rest[0]["share"] > 0.25 and "not from durations" in d["warnings"][1]
    of_step = f"{100 * abs(d['change']) * rest[0]['share']:.1f}%"
    assert f"B is {100 * abs(d['change']):.1f}% faster than A: {of_step} not from durations" in term


def test_same_layout_no_warning(runs, tmp_path, capsys):
    out = tmp_path / "d.json"
    assert run_cli("diff", *runs, "--json", out) == 0
    term = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["warnings"] == [] and d["layout_mismatch"] == [] and "Warning" not in term
    assert "not from durations" not in _words(term).split(" share ")[0]  # not in the headline


@pytest.mark.parametrize("trace", ["trace-ST", "host-stall"])
def test_analyze_and_diff_count_the_same_ops(trace, tmp_path, capsys):
    """Both count the traced ops, whatever untraced gaps each models as host ops (analyze the large
    ones, diff every one): a synthetic job with a host stall has both kinds of gaps."""
    from laggard.io import load_job

    if trace == "host-stall":
        path = tmp_path / "syn"
        assert run_cli("synth", "--out", path, "--inject", "host-stall:rank=1,ms=50,every=2") == 0
    else:
        path = ND / f"{trace}.parquet"
    n = load_job(path).num_ops
    a_json, d_json = tmp_path / "a.json", tmp_path / "d.json"
    capsys.readouterr()
    assert run_cli("analyze", path, "--json", a_json) == 0
    analyzed = _words(capsys.readouterr().out)
    assert run_cli("diff", path, path, "--json", d_json) == 0
    diffed = _words(capsys.readouterr().out)
    a, d = json.loads(a_json.read_text()), json.loads(d_json.read_text())
    assert a["num_ops"] == d["a"]["num_ops"] == d["b"]["num_ops"] == n
    assert f"{n:,} ops" in analyzed and f"{n:,} traced ops" in diffed
