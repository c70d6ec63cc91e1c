"""Modules users may import today keep working after the layered layout: the old path warns with a
DeprecationWarning naming the new one and gives the new module's names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from laggard.util.moved import MOVED


@pytest.mark.parametrize("old, new, name", [
    ("laggard.ops", "laggard.optable.ops", "Job"),
    ("laggard.whatif_custom", "laggard.whatif.custom", "parse_changes"),
    ("laggard.synth", "laggard.groundtruth.synth", "synthesize"),
    ("laggard.io.perfetto", "laggard.report.perfetto", "write_perfetto"),
    ("laggard.monitor.client", "laggard.wire.client", "Client"),
])
def test_an_old_path_warns_and_gives_the_new_names(old, new, name):
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        f"assert getattr(old, {name!r}) is getattr(new, {name!r})\n"
        f"assert any(issubclass(x.category, DeprecationWarning) and {new!r} in str(x.message) for x in w), "
        "[str(x.message) for x in w]\n"
        f"from {old} import {name}\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_an_old_package_keeps_its_submodules():
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "import laggard.dessim.causes as c, laggard.groundtruth.dessim.causes as n\n"
            "assert c.parse_cause is n.parse_cause\n"
            "from laggard.dessim import simulate; import laggard.groundtruth.dessim.engine as e\n"
            "assert simulate is e.simulate\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_old_modules_that_became_packages_still_export_their_names():
    import laggard.analysis
    import laggard.io.kineto
    import laggard.whatif
    from laggard.cli import main

    assert laggard.analysis.analyze is laggard.analyze
    assert callable(laggard.whatif.analyze) and laggard.whatif.Analysis is laggard.Analysis
    assert callable(laggard.io.kineto.read_kineto) and callable(main)


def test_every_new_path_exists_and_no_old_path_does():
    import importlib.util

    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        parent = old.rpartition(".")[0]
        path = importlib.util.find_spec(parent).submodule_search_locations if parent != "laggard.dessim" else None
        if path:  # the old file is gone (else the shim would never be reached)
            from pathlib import Path

            leaf = old.rpartition(".")[2]
            assert not any((Path(p) / f"{leaf}.py").exists() for p in path), old
