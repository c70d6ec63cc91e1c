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
