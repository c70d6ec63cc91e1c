"""The `laggard` command: help everywhere, end-to-end runs on real traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ND, run_cli

LAGGARD = Path(sys.executable).with_name("laggard")


def _all_commands():
    import typer

    from laggard.cli.base import app

    root = typer.main.get_command(app)

    def walk(cmd, path):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(root, []))


def test_every_command_and_option_has_help():
    missing = []
    for path, cmd in _all_commands():
        if not (cmd.help or "").strip():
            missing.append(" ".join(path) or "laggard")
        for p in cmd.params:
            if getattr(p, "param_type_name", "") == "option" and not (getattr(p, "help", "") or "").strip():
                missing.append(f"{' '.join(path)} {p.opts[0]}")
            if getattr(p, "param_type_name", "") == "argument" and not (getattr(p, "help", "") or "").strip():
                missing.append(f"{' '.join(path)} <{p.name}>")
    assert not missing, f"commands/options without help text: {missing}"


def test_help_lists_commands(capsys):
    assert run_cli("--help") == 0
    out = capsys.readouterr().out
    for c in ("analyze", "whatif", "convert", "demo"):
        assert c in out


def test_command_modules_list_what_they_register():
    """`laggard NAME` imports only the module COMMAND_MODULES lists NAME under: the names must be the
    ones its ``register`` adds (in the full app's order), and each name one module's."""
    import importlib

    import typer

    from laggard.cli.base import COMMAND_MODULES

    for module, names in COMMAND_MODULES.items():
        one = typer.Typer()
        importlib.import_module(module).register(one)
        got = [c.name or c.callback.__name__.replace("_", "-") for c in one.registered_commands]
        got += [g.name or g.typer_instance.info.name for g in one.registered_groups]
        assert sorted(got) == sorted(names), module
    every = [n for names in COMMAND_MODULES.values() for n in names]
    assert len(every) == len(set(every))


def test_one_command_imports_only_its_module():
    code = ("import sys; from laggard.cli.base import main; main(['analyze', '--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('laggard.cli.')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "['laggard.cli.analyze', 'laggard.cli.base', 'laggard.cli.options']"


def test_analyze_end_to_end_subprocess(tmp_path):
    out = tmp_path / "ar.json"
    p = subprocess.run(
        [str(LAGGARD), "analyze", str(ND / "trace-AR.parquet"), "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "straggler slowdown S = 1.973" in p.stdout
    d = json.loads(out.read_text())
    assert d["slowdown"] == pytest.approx(1.973, abs=1e-3)


def test_json_to_stdout(capsys):
    assert run_cli("analyze", ND / "trace-ST.parquet", "--json", "-") == 0
    d = json.loads(capsys.readouterr().out)
    assert d["by_stage"]["3"] == pytest.approx(1.2323, rel=1e-3)


def test_whatif(capsys, tmp_path):
    out = tmp_path / "w.json"
    assert run_cli("whatif", ND / "trace-AR.parquet", "--fix", "worker=dp0:pp0", "--json", out) == 0
    d = json.loads(out.read_text())
    # fixing the slowed worker recovers (almost) the whole ideal speed-up
    assert d["speedup"] == pytest.approx(d["T_s"] / d["T_ideal_s"], rel=0.01)
    assert run_cli("whatif", ND / "trace-ST.parquet", "--scale", "stage=3:0.8", "--zero", "comm") == 0
    text = capsys.readouterr().out
    assert "speed-up" in text and "scale stage=3 x0.8" in text
    assert run_cli("whatif", ND / "trace-ST.parquet", "--fix", "optype=forward-pp-comm", "--json", out) == 0
    assert json.loads(out.read_text())["num_ops_changed"] == 1536


def test_whatif_fix_everything_gives_ideal(tmp_path):
    out = tmp_path / "w.json"
    assert run_cli("whatif", ND / "trace-ST.parquet", "--fix", "all", "--json", out) == 0
    d = json.loads(out.read_text())
    assert d["T_new_s"] == pytest.approx(d["T_ideal_s"], rel=1e-12)


def test_convert_round_trip(tmp_path, analyses):
    nat = tmp_path / "native"
    assert run_cli("convert", ND / "trace-AR.parquet", "--out", nat) == 0
    assert (nat / "job.json").exists() and list(nat.glob("ops-*.parquet"))
    out = tmp_path / "n.json"
    assert run_cli("analyze", nat, "--json", out, "-q") == 0
    d = json.loads(out.read_text())
    ref = analyses["AR"].to_json()
    for k in ("slowdown", "M_W", "M_S", "launch_slowdown"):
        assert d[k] == pytest.approx(ref[k], rel=1e-9)
    assert d["by_dp_rank"] == pytest.approx(ref["by_dp_rank"], rel=1e-9)
    assert d["meta"]["world_size"] == 64


def test_steps_selection(tmp_path):
    out = tmp_path / "s.json"
    assert run_cli("analyze", ND / "trace-AR.parquet", "--steps", "16-30,404", "--json", out, "-q") == 0
    d = json.loads(out.read_text())
    assert sorted(int(s) for s in d["per_step"]) == [16, 21, 27, 29, 404]


def test_whatif_negated_selector_names_the_complement(tmp_path):
    """`stage!=3` changes exactly the ops `stage=3` does not: the two together change every op."""
    out = tmp_path / "w.json"
    counts = {}
    for sel in ("stage=3", "stage!=3", "all"):
        assert run_cli("whatif", ND / "trace-ST.parquet", "--fix", sel, "--json", out) == 0
        counts[sel] = json.loads(out.read_text())["num_ops_changed"]
    assert 0 < counts["stage=3"] < counts["all"]
    assert counts["stage=3"] + counts["stage!=3"] == counts["all"]
    assert run_cli("whatif", ND / "trace-ST.parquet", "--fix", "all,stage!=3,stage=3") == 2


@pytest.mark.parametrize("command", ["demo", "synth"])
def test_inject_causes_are_listed_whole_at_80_columns(command: str) -> None:
    import os
    import subprocess
    import sys

    from laggard.cli.options import INJECT_CAUSES
    from laggard.groundtruth.inject import CAUSES

    assert [s.split(":")[0] for s, _ in INJECT_CAUSES] == list(CAUSES)
    for spec, _ in INJECT_CAUSES:
        assert [kv.split("=")[0] for kv in spec.split(":")[1].split(",")] == list(CAUSES[spec.split(":")[0]])
    out = subprocess.run([sys.executable, "-m", "laggard.cli.base", command, "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "80", "TERM": "dumb"}, timeout=60).stdout
    assert "…" not in out and max(len(ln) for ln in out.splitlines()) <= 80
    for spec, _ in INJECT_CAUSES:
        assert spec in out, spec
