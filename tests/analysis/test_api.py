"""The public API: every exported name resolves; `import laggard` stays light."""

from __future__ import annotations

import subprocess
import sys

import laggard


def test_every_exported_name_resolves():
    for name in laggard.__all__:
        assert getattr(laggard, name) is not None, name


def test_import_is_light():
    code = "import sys, laggard; print(any(m in sys.modules for m in ('numpy', 'pyarrow', 'torch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_analysis_stack_does_not_import_torch():
    code = (
        "import sys, laggard; j = laggard.load_job('tests/data/ndtimeline/trace-ST.parquet'); "
        "laggard.analyze(j); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_diagnose_again_gives_the_same_commands(tmp_path):
    """``laggard.diagnose(res)`` (the README's "the diagnosis again") returned findings with
    ``command=''`` where ``res.diagnosis`` had each finding's ``laggard whatif`` command; and with
    ``--steps`` the command keeps the steps."""
    import laggard

    path = "tests/data/ndtimeline/trace-ST.parquet"
    for job in (laggard.load_job(path), laggard.load_job(path, steps="0-700")):
        res = laggard.analyze(job)
        again = laggard.diagnose(res)
        first = [f.command for f in res.diagnosis.findings]
        assert first and all(c.startswith(f"laggard whatif {path}") for c in first), first
        assert [f.command for f in again.findings] == first
    assert "--steps 0-700" in first[0], first[0]
