"""The public API: names never shadowed by submodules, a clean dir(), a short repr, notebook HTML,
the report written by laggard.write_report (results render nothing themselves)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ND


def test_public_names_survive_submodule_imports():
    code = (
        "import laggard, types\n"
        f"res = laggard.analyze(laggard.load_job({str(ND / 'trace-AR.parquet')!r}))\n"
        "import laggard.diagnose.worker\n"
        "assert callable(laggard.diagnose) and not isinstance(laggard.diagnose, types.ModuleType), laggard.diagnose\n"
        "d = laggard.diagnose(res)\n"
        "assert d.verdict == 'straggling'\n"
        "assert set(dir(laggard)) == set(laggard.__all__) | {'__version__'}, dir(laggard)\n"
        "from laggard.diagnose import DiagnoseConfig\n"
        "assert laggard.DiagnoseConfig is DiagnoseConfig\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_repr_html_and_write_report(ar, tmp_path):
    r = repr(ar)
    assert len(r) < 200 and "S=1.9" in r and "straggling" in r and "worker" in r
    html = ar._repr_html_()
    assert "S = 1.9" in html and "<ol>" in html and len(html) < 5000
    import laggard

    out, perfetto = laggard.write_report(ar, tmp_path / "r.html")
    assert out.exists() and "<html" in out.read_text()[:500].lower() and perfetto is not None and perfetto.exists()
    assert not hasattr(ar, "to_html")  # a result type does not render itself
