"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict`` (a broken link,
an unreadable docstring or a missing include fails it), offline, and its CLI reference, generated from
``--help`` at build time (docs/hooks/laggard_docs.py), has every command and subcommand of the app.

The build needs the ``docs`` extra (in ``all``, which ``make test`` installs); without it the build
tests skip, and the CLI reference is still checked on the Markdown the hook generates.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "hooks" / "laggard_docs.py"
BUILD_TIMEOUT_S = 120  # the build takes ~3 s here; the CLI's --help runs in-process


def _hook():
    spec = importlib.util.spec_from_file_location("laggard_docs_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _hook()


def _docs_missing() -> str | None:
    for module, dist in (("mkdocs", "mkdocs"), ("material", "mkdocs-material"),
                         ("mkdocstrings", "mkdocstrings"), ("mkdocstrings_handlers.python", "mkdocstrings-python")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{dist} is not installed (pip install -e '.[docs]'; `make test` installs it with '.[all]')"
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built with --strict into a temporary directory (not site/)."""
    reason = _docs_missing()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    t0 = time.monotonic()
    # never -q: mkdocs counts --strict's warnings only where it logs them
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
           "--site-dir", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    wall = time.monotonic() - t0
    assert res.returncode == 0, f"mkdocs build --strict failed ({wall:.1f} s):\n{res.stdout}\n{res.stderr}"
    print(f"site built in {wall:.1f} s")
    return out


def _page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def test_the_site_builds_strict_and_offline(site: Path) -> None:
    pages = {p.relative_to(site).parent.as_posix() for p in site.rglob("index.html")}
    for name in ("quickstart", "guide/analyze", "guide/whatif", "guide/diff", "guide/monitor", "guide/hangs",
                 "guide/fleet", "guide/mitigations", "reference/cli", "reference/api", "diagnosis", "performance"):
        assert name in pages, (name, sorted(pages))
    # nothing fetched when a page is opened: no web fonts, no script or stylesheet from another host
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
        remote = re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="(https?:)?//[^"]*"', text)
        assert not remote, (page, remote)


def test_the_cli_reference_has_every_command(site: Path) -> None:
    paths = hook.commands()
    assert hook.missing_commands(_page(site, "reference/cli"), paths) == []


def test_every_command_module_is_in_the_reference_walk() -> None:
    """The walk the reference and its check use sees every command the app registers (``COMMAND_MODULES``)."""
    from laggard.cli.base import COMMAND_MODULES

    top = {p[0] for p in hook.commands() if len(p) == 1}
    registered = {name for names in COMMAND_MODULES.values() for name in names}
    assert registered <= top, sorted(registered - top)
    assert any(len(p) == 2 for p in hook.commands())  # the groups' subcommands too (simulate tail, ...)


def test_the_generated_reference_has_every_command_and_the_check_catches_a_dropped_one() -> None:
    paths = hook.commands()
    full = hook.cli_reference(paths)
    assert hook.missing_commands(full, paths) == []
    # a wrong answer: the reference without one subcommand and one command
    dropped = [("simulate", "tail"), ("diff",)]
    assert all(p in paths for p in dropped)
    partial = hook.cli_reference([p for p in paths if p not in dropped])
    assert hook.missing_commands(partial, paths) == ["laggard diff", "laggard simulate tail"]


def test_the_api_reference_documents_the_public_api() -> None:
    import laggard

    api = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    missing = [name for name in laggard.__all__ if f'heading: "laggard.{name}"' not in api]
    assert not missing, f"add {missing} to docs/reference/api.md"


def test_the_api_reference_is_rendered_from_the_docstrings(site: Path) -> None:
    html = _page(site, "reference/api")
    # the signature and the docstring of laggard.analyze, rendered by mkdocstrings
    assert 'id="laggard.analysis.pipeline.analyze"' in html
    assert "Slowdown, attributions and" in html


def test_the_performance_page_is_the_readmes_section(site: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = hook._section(readme, "performance", "README.md")
    assert "| figure |" in section
    html = _page(site, "performance")
    assert html.count("<table>") == section.count("| figure |")
    first_row = re.search(r"^\| `laggard analyze[^|]*", section, re.M)[0].strip("| ")
    assert first_row.replace("`", "").split(",")[0] in re.sub(r"<[^>]+>", "", html)


def test_the_readmes_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t and not t.startswith("#")]
    assert links
    missing = [t for t in links if not (ROOT / t.partition("#")[0]).exists()]
    assert not missing, missing
