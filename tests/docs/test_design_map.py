"""docs/DESIGN.md is the map of the code: every repo path and module it names must exist, and it stays
short enough to read (at most 400 lines; history goes to CHANGELOG.md, figures to benchmarks/README.md).

What counts as a name (inside backticks, or a Markdown link's target):
- a path from the repo root: ``src/...``, ``tests/...``, ``benchmarks/...``, ``docs/...``,
  ``examples/...``, ``deploy/...`` (a glob must match something);
- a path inside the package, the way the map writes them: ``engine/graph.py``, ``report/``,
  ``laggard/__init__.py``, a root module such as ``startup.py``;
- either of them with ``::NAME`` (``cli/base.py::COMMAND_MODULES``): NAME must be defined at the top
  level of that module;
- a dotted module name ``laggard.x.y`` (optionally ending in a name the module defines or exports
  lazily: ``laggard.io.load_job``), or one inside the package (``startup.reuse_memory``,
  ``whatif.diff.diff``: its first part a package or root module of ``laggard``);
- a bare source file name (``segments.py``, ``dashboard.html``), written where its folder is clear
  from the sentence: some file of that name must exist in the package or at the repo root;
- a link's target, relative to docs/.
Placeholders (``io/<format>.py``) and commands (anything with a space) are not names.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
PKG = ROOT / "src" / "laggard"
MAX_LINES = 400
REPO_ROOTS = ("src", "tests", "benchmarks", "docs", "examples", "deploy")
# a bare token with one of these endings is a file name that must exist somewhere
SOURCE_SUFFIXES = (".py", ".c", ".html", ".md", ".toml")
# a dotted token ending in one of these is a file name (``fleet.parquet``), not a module path
FILE_EXTENSIONS = {s.lstrip(".") for s in SOURCE_SUFFIXES} | {"json", "gz", "parquet", "yaml", "yml", "pkl", "svg",
                                                                "png", "csv", "txt"}

_TOKEN = re.compile(r"^[\w.*/-]+(::[\w.]+)?$")


def _packages() -> set[str]:
    return {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def _root_modules() -> set[str]:
    return {p.name for p in PKG.glob("*.py")}


def names_in(text: str) -> tuple[list[str], list[str]]:
    """(the backticked tokens that look like names, the Markdown links' targets)."""
    spans = re.findall(r"`([^`\n]+)`", text)
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]
    return [s for s in spans if _TOKEN.match(s) and "<" not in s], links


@cache
def _top_level(path: Path) -> frozenset[str]:
    """Names a module defines at its top level, plus the string constants in it (lazy exports)."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.add(n.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    out |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return frozenset(out)


def _module_file(dotted: list[str]) -> Path | None:
    base = PKG.parent.joinpath(*dotted)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def problem_with_dotted(name: str) -> str | None:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        f = _module_file(parts[:n])
        if f is None:
            continue
        rest = parts[n:]
        if not rest or rest[0] in _top_level(f):
            return None
        return f"{name}: {'.'.join(parts[:n])} defines no {rest[0]!r}"
    return f"{name}: no such module"


def _resolve(path: str) -> Path | None:
    """Where a path token points, or None when it is not a repo path (an output name, a URL path)."""
    first = path.split("/", 1)[0]
    if first in REPO_ROOTS:
        return ROOT / path
    if first == "laggard" and "/" in path:
        return PKG / path.split("/", 1)[1]
    if first in _packages() or ("/" not in path and path in _root_modules()):
        return PKG / path
    return None


def problem_with_path(token: str) -> str | None:
    path, _, name = token.partition("::")
    target = _resolve(path.rstrip("/"))
    if target is None:
        return None
    found = sorted(target.parent.glob(target.name)) if "*" in target.name else [target] * target.exists()
    if not found:
        return f"{token}: no such file or directory"
    if name:
        if target.suffix != ".py":
            return None  # a C function (_replay.c::levels): not parsed here
        if name.split(".")[0] not in _top_level(target):
            return f"{token}: {path} defines no {name.split('.')[0]!r}"
    return None


@cache
def _file_names() -> frozenset[str]:
    return frozenset(p.name for p in PKG.rglob("*") if p.is_file()) | {p.name for p in ROOT.iterdir()}


def _dotted(token: str) -> str | None:
    """The ``laggard.`` name a dotted token stands for, or None when it is no module path."""
    if "/" in token or "::" in token or "." not in token:
        return None
    if token.startswith("laggard."):
        return token
    first, last = token.split(".", 1)[0], token.rsplit(".", 1)[1]
    if (first in _packages() or f"{first}.py" in _root_modules()) and last not in FILE_EXTENSIONS:
        return f"laggard.{token}"
    return None


def problems(text: str) -> list[str]:
    tokens, links = names_in(text)
    out = []
    for t in tokens:
        dotted = _dotted(t)
        if dotted is not None:
            p = problem_with_dotted(dotted)
        elif "/" in t or "::" in t:
            p = problem_with_path(t)
        elif t.endswith(SOURCE_SUFFIXES):
            p = problem_with_path(t) if _resolve(t) else (None if t in _file_names() else f"{t}: no such file")
        else:
            p = None
        if p:
            out.append(p)
    for link in links:
        if not (DESIGN.parent / link.split("#")[0]).exists():
            out.append(f"link {link}: no such file")
    return out


def test_every_named_path_exists():
    bad = problems(DESIGN.read_text())
    assert not bad, "docs/DESIGN.md names what is not there:\n" + "\n".join(bad)


def test_the_map_stays_short():
    n = len(DESIGN.read_text().splitlines())
    assert n <= MAX_LINES, f"docs/DESIGN.md has {n} lines (at most {MAX_LINES}: history to CHANGELOG.md)"


def test_it_reads_names():
    """The map names things in every form the check reads: if none were found, it would pass on nothing."""
    tokens, links = names_in(DESIGN.read_text())
    assert any(t.startswith("src/laggard/") for t in tokens)
    assert any(t.startswith("tests/") for t in tokens)
    assert any(t.startswith("laggard.") for t in tokens)
    assert any("::" in t for t in tokens)
    assert links


@pytest.mark.parametrize("wrong", [
    "`src/laggard/diagnose/nowhere.py`",  # a file that is not there
    "`diagnose/run.py::CAUSE_OF`",  # a name the module does not define (it is nominate.py's)
    "`laggard.diagnose.nowhere`",  # a module that is not there
    "`laggard.io.read_everything`",  # a module that exists, a name it lacks
    "`tests/docs/test_nothing.py`",
    "`benchmarks/bench_nothing_*.py`",  # a glob matching nothing
    "[map](nowhere.md)",  # a link
    "`startup.nothing_here`",  # a dotted name inside the package
    "`nowhere_at_all.py`",  # a bare file name
])
def test_the_check_fails_on_a_wrong_name(wrong):
    """A check that cannot fail proves nothing."""
    assert len(problems(f"see {wrong} and `src/laggard/diagnose/nominate.py`")) == 1


def test_the_check_passes_right_names():
    text = ("`diagnose/nominate.py::CAUSE_OF`, `laggard.io.load_job`, `laggard.write_report`, `report/`, "
            "`startup.py`, `benchmarks/bench_*.py`, `io/<format>.py`, `laggard analyze`, `out/corpus64`, "
            "`engine/_replay.c::levels`, `startup.reuse_memory`, `segments.py`, `pa.array`, `Finding.cause`, "
            "[rules](rules.md)")
    assert problems(text) == []
