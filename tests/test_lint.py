"""`make test` enforces `make lint`: ruff (pyproject.toml's [tool.ruff], line length included) passes over
src, tests, benchmarks and examples; and the user errors have one door, ``laggard.errors``."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("src", "tests", "benchmarks", "examples")
SHOWN = 20  # offending lines listed in a failure


def _ruff() -> str:
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        pytest.skip("ruff is not installed in this environment (pip install -e '.[dev]' installs it)")
    try:
        return str(find_ruff_bin())
    except FileNotFoundError:
        pytest.skip("the ruff package is installed but its binary is missing")


def test_ruff_check_passes() -> None:
    # --no-cache: nothing written into the tree; the check takes well under a second without it
    p = subprocess.run([_ruff(), "check", "--no-cache", "--output-format", "concise", *PATHS], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        return
    lines = [ln for ln in p.stdout.splitlines() if ln.strip() and not ln.startswith(("Found ", "["))]
    if not lines:  # ruff itself failed (a bad config, say): its own words
        pytest.fail(f"ruff check exited {p.returncode}:\n{p.stdout}{p.stderr}")
    more = f"\n... and {len(lines) - SHOWN} more" if len(lines) > SHOWN else ""
    pytest.fail(f"`ruff check {' '.join(PATHS)}` finds {len(lines)} problem(s) (`make lint`; wrap long lines by "
                f"hand, this project does not use `ruff format`):\n" + "\n".join(lines[:SHOWN]) + more)


ERRORS = {"LaggardError", "LaggardWarning", "GraphCycleError"}  # what laggard.errors defines


def _wrong_doors(files: list[Path]) -> list[str]:
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "laggard.errors"
                    and (node.module or "").startswith("laggard")):
                names = sorted(a.name for a in node.names if a.name in ERRORS)
                if names:
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    bad.append(f"{where}:{node.lineno}: {', '.join(names)} from {node.module}")
    return bad


def test_errors_are_imported_from_laggard_errors_only() -> None:
    """``from laggard.errors import LaggardError``, never through a module that happens to import it."""
    files = sorted(p for d in PATHS for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)
    bad = _wrong_doors(files)
    assert not bad, "import these from laggard.errors:\n" + "\n".join(bad)


def test_the_door_check_fails_on_another_door(tmp_path: Path) -> None:
    """A check that cannot fail proves nothing: an import through laggard.optable.ops is caught, in a function too."""
    p = tmp_path / "m.py"
    p.write_text("from laggard.errors import LaggardWarning\n"
                 "from laggard.optable.ops import Job, LaggardError\n"
                 "def f():\n    from laggard import GraphCycleError\n")
    assert _wrong_doors([p]) == [f"{p}:2: LaggardError from laggard.optable.ops",
                                 f"{p}:4: GraphCycleError from laggard"]
