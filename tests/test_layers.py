"""The package reads as the pipeline: every import points down a layer, and no module imports itself
back through others. Imports inside functions and under TYPE_CHECKING count too.

The layer order is written here, once (docs/DESIGN.md describes it): a package may import its own
modules and packages of lower layers, never one of its own layer or above.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "laggard"

# lowest first; "laggard" is the public facade (laggard/__init__.py)
LAYERS: list[set[str]] = [
    {"errors", "startup"},  # the exceptions and input checks; process start-up
    {"util"},  # lazy exports, moved paths, the A-B,C range syntax (it raises errors.LaggardError)
    {"optable"},  # the op table: the one model
    {"io", "engine", "wire", "hang", "mitigate"},  # importers; replay engine; what travels to the collector
    {"results", "tracer", "simulate"},  # result types as data; instrumentation; Monte-Carlo
    {"whatif", "collectives", "integrations"},  # ...; framework callbacks over the tracer
    {"diagnose"},
    {"analysis"},  # what-if + diagnosis, composed, under one AnalysisConfig
    {"report"},  # every rendering and export of results
    {"groundtruth"},  # synth, injections, the independent simulator, evaluation sweeps
    {"monitor", "fleet"},  # thin layers over the pipeline
    {"demo"},
    {"cli"},
    {"laggard"},
]


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "laggard"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: package {top!r} is in no layer of tests/test_layers.py::LAYERS")


def modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for p in sorted(src.rglob("*.py")):
        parts = list(p.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the laggard modules it imports (a name imported from a package counts as the
    package's own module unless it is a submodule)."""
    mods = modules(src)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join(pkg + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                if t == "laggard" or t.startswith("laggard."):
                    r = resolve(t)
                    if r is not None and r != mod:
                        edges[mod].add(r)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def upward(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in sorted(edges.items()):
        for b in sorted(targets):
            same_package = a.split(".")[:2] == b.split(".")[:2] and len(a.split(".")) > 1
            if not same_package and layer_of(b) >= layer_of(a):
                bad.append(f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})")
    return bad


def test_every_package_has_a_layer():
    for mod in modules():
        layer_of(mod)


def test_no_import_circles():
    found = cycles(imports())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_point_down():
    bad = upward(imports())
    assert not bad, "imports that do not point to a lower layer:\n" + "\n".join(bad)


def test_root_holds_only_the_facade_errors_and_start_up():
    assert sorted(p.name for p in SRC.glob("*.py")) == ["__init__.py", "errors.py", "startup.py"]


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = root / "laggard" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "laggard"


@pytest.mark.parametrize("wrong", [
    "def f():\n    from laggard.report.html import write_report\n",  # function-level, upward
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from laggard.diagnose import Finding\n",  # type-only
    "from laggard.analysis import pipeline\n",  # a submodule named in the import list
])
def test_the_check_fails_on_a_wrong_import(tmp_path, wrong):
    """A check that cannot fail proves nothing: an engine module importing upward is caught."""
    src = _write(tmp_path, {"__init__.py": "", "engine/__init__.py": "", "engine/graph.py": wrong,
                            "report/__init__.py": "", "report/html.py": "", "diagnose/__init__.py": "",
                            "analysis/__init__.py": "", "analysis/pipeline.py": ""})
    bad = upward(imports(src))
    assert len(bad) == 1 and bad[0].startswith("laggard.engine.graph (layer 3) imports"), bad


def test_the_check_finds_a_circle(tmp_path):
    src = _write(tmp_path, {"__init__.py": "", "engine/__init__.py": "",
                            "engine/a.py": "from laggard.engine import b\n",
                            "engine/b.py": "def f():\n    from laggard.engine.a import x\n"})
    assert cycles(imports(src)) == [["laggard.engine.a", "laggard.engine.b"]]


def test_the_check_reads_relative_imports(tmp_path):
    src = _write(tmp_path, {"__init__.py": "", "engine/__init__.py": "", "report/__init__.py": "",
                            "report/html.py": "", "engine/graph.py": "from ..report import html\n"})
    assert upward(imports(src)) == ["laggard.engine.graph (layer 3) imports laggard.report.html (layer 8)"]
