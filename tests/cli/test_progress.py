"""Commands that run over ~2 s show a rich progress display on stderr when it is a terminal:
analyze, diff, simulate tail, simulate policy and bench allreduce (fleet, demo and monitor push use the
same helper). Piped, with --quiet, or with --json -, nothing but the result is written."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import DATA, ND, run_cli

pytestmark = pytest.mark.timeout(300)

SIM = ("--trials", "2000")
COMMANDS = {
    "analyze": (("analyze", ND / "trace-ST.parquet"), "phases", "loading the trace"),
    "diff": (("diff", DATA / "corpus" / "job009" / "trace", DATA / "corpus" / "job004" / "trace"),
             "phases", "loading run A"),
    "simulate tail": (("simulate", "tail", "--workers", "1,4,16", *SIM), "sizes", "simulating job sizes"),
    "simulate policy": (("simulate", "policy", "--workers", "16", *SIM), "policies", "simulating policies"),
}


@pytest.fixture
def terminal(monkeypatch):
    """stderr read as a terminal by rich (as in an interactive shell)."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_long_commands_show_progress_on_a_terminal(name, terminal, capsys):
    args, unit, first = COMMANDS[name]
    capsys.readouterr()
    assert run_cli(*args) == 0
    out, err = capsys.readouterr()
    assert first in err and unit in err, err[-500:]
    assert first not in out  # the display goes to stderr only


@pytest.mark.parametrize("name", list(COMMANDS))
def test_json_on_stdout_stays_clean(name, terminal, capsys):
    args, _unit, first = COMMANDS[name]
    capsys.readouterr()
    assert run_cli(*args, "--json", "-") == 0
    out, _err = capsys.readouterr()
    json.loads(out)  # nothing but the JSON on stdout, even with the display on stderr


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_progress_when_piped(name, monkeypatch, capsys):
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    args, unit, first = COMMANDS[name]
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert first not in capsys.readouterr().err


def test_quiet_has_no_progress(terminal, capsys, tmp_path):
    capsys.readouterr()
    assert run_cli("analyze", ND / "trace-ST.parquet", "--json", tmp_path / "a.json", "-q") == 0
    out, err = capsys.readouterr()
    assert out == "" and "loading the trace" not in err


def test_analyze_names_the_file_it_writes(terminal, capsys, tmp_path):
    capsys.readouterr()
    assert run_cli("analyze", ND / "trace-ST.parquet", "--html", tmp_path / "r.html") == 0
    err = capsys.readouterr().err
    assert "writing the HTML report" in err and "3/4" in err  # the last phase, drawn as the display stops


BENCH = ("bench", "allreduce", "--ranks", "2", "--size-mb", "0.01", "--delay-ms", "0", "--repeats", "1",
         "--no-calibrate")


def test_bench_allreduce_shows_its_all_reduces(terminal, capsys):
    """Its ranks' start and all-reduces take ~40 s at the README's size: the bar names the phase and
    counts rank 0's all-reduces (3 warm-up + 3 timed here); stdout keeps only the JSON."""
    pytest.importorskip("torch")
    from laggard.collectives.bench import PHASE_ALLREDUCE

    capsys.readouterr()
    assert run_cli(*BENCH, "--json", "-") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["correct"] is True
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)  # the bar's colours
    assert "starting 2 ranks" in err and PHASE_ALLREDUCE in err and "6/6 all-reduces" in err, err[-500:]


def test_bench_allreduce_piped_has_no_progress(monkeypatch, capsys):
    pytest.importorskip("torch")
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    capsys.readouterr()
    assert run_cli(*BENCH) == 0
    out, err = capsys.readouterr()
    assert "result correct" in out and "all-reduces" not in err
