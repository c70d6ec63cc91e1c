"""Every output path is checked before work starts: one line naming the flag and the file, exit 2,
no traceback (an existing file, a directory, a missing parent, a read-only directory and a place under
a regular file, across convert, synth, simulate, collectives, analyze and whatif)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import ND, run_cli

AR = str(ND / "trace-AR.parquet")


@pytest.fixture
def places(tmp_path):
    a_file = tmp_path / "exists.txt"
    a_file.write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    yield {"file": a_file, "dir": tmp_path, "ro": ro, "missing_parent": tmp_path / "nope" / "out.json"}
    ro.chmod(0o700)


CASES = [
    (["convert", AR, "--out", "{file}"], "is a file"),
    (["convert", AR, "--out", "{ro}/sub"], "not writable"),
    (["synth", "--out", "{file}"], "is a file"),
    (["simulate", "tail", "--dist", "lognormal:base=1.0,mean=-0.7,sigma=0.9", "--workers", "1,4",
      "--plot", "{ro}/p.png"], "not writable"),
    (["collectives", "verify", "--ranks", "4", "--json", "{ro}/v.json"], "not writable"),
    (["collectives", "verify", "--ranks", "4", "--json", "{dir}"], "is a directory"),
    (["analyze", AR, "--html", "{missing_parent}"], "does not exist"),
    (["analyze", AR, "--json", "{dir}"], "is a directory"),
    (["whatif", AR, "--fix", "rank=0", "--json", "{ro}/w.json"], "not writable"),
    # unwritable even for root: a place under a regular file
    (["convert", AR, "--out", "{file}/sub"], "is a file"),
    (["synth", "--out", "{file}/job"], "is a file"),
    (["simulate", "tail", "--dist", "lognormal:base=1.0,mean=-0.7,sigma=0.9", "--workers", "1,4",
      "--plot", "{file}/p.png"], "is a file"),
    (["collectives", "verify", "--ranks", "4", "--json", "{file}/v.json"], "is a file"),
    (["analyze", AR, "--perfetto", "{file}/t.json"], "is a file"),
]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes anywhere: read-only cases untestable")
@pytest.mark.parametrize(("args", "msg"), [c for c in CASES if "{ro}" in " ".join(c[0])])
def test_unwritable_outputs(args, msg, places, capsys):
    _check(args, msg, places, capsys)


@pytest.mark.parametrize(("args", "msg"), [c for c in CASES if "{ro}" not in " ".join(c[0])])
def test_bad_outputs(args, msg, places, capsys):
    _check(args, msg, places, capsys)


def _check(args, msg, places, capsys):
    argv = [a.format(**places) for a in args]
    assert run_cli(*argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and msg in err, err
    flag = next(a for a in args if a.startswith("--") and "{" in args[args.index(a) + 1])
    assert flag in err and argv[args.index(flag) + 1] in err
