"""MkDocs hook of the laggard site (mkdocs.yml ``hooks:``): everything here runs at build time,
offline.

* ``<!-- laggard:cli-reference -->`` in a page becomes the CLI reference: the ``--help`` of the
  ``laggard`` command and of every command and subcommand of its typer app, run in-process at a
  fixed width, in the app's own order (``cli_reference``).
* ``<!-- laggard:include PATH -->`` becomes the repo file PATH (from the repo root), and
  ``<!-- laggard:include PATH SECTION -->`` the part of it between ``<!-- docs:SECTION:start -->``
  and ``<!-- docs:SECTION:end -->``: the README's performance table, CHANGELOG.md and
  benchmarks/README.md are written once, where they live, and shown on the site as they are.
* Relative links are rebased: a link (in a page or an included file) to a repo file that a page
  includes whole goes to that page; one to any other repo file outside docs/ (a source file, the
  README) becomes its plain text, since the site cannot serve it; a link to nothing stays as it
  is, for ``mkdocs build --strict`` to fail on.

``tests/docs/test_site.py`` imports this module (``commands``, ``cli_reference``,
``missing_commands``) to check the reference names every command.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
CLI_MARKER = "<!-- laggard:cli-reference -->"
WIDTH = 80  # columns of the rendered --help: fits Material's content column in a code block

_INCLUDE = re.compile(r"^<!-- laggard:include (\S+)(?: (\S+))? -->[ \t]*$", re.M)
_LINK = re.compile(r"(!?\[(?P<text>[^\]\n]*)\])\((?P<target>[^)\s]+)\)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_FENCE = re.compile(r"^\s*(```|~~~)")

# repo path (posix, from the root) -> the docs page (src_uri) that includes it whole; on_files fills it
_included_whole: dict[str, str] = {}


# ---- the CLI reference ----------------------------------------------------------------------


def root_command():
    """The click command behind ``laggard`` (every command registered)."""
    import typer

    from laggard.cli.base import app

    return typer.main.get_command(app)


def commands(root=None) -> list[tuple[str, ...]]:
    """Every command path of the app, in its own order: ``()`` for ``laggard`` itself, then
    ``("analyze",)``, ..., ``("simulate",)``, ``("simulate", "tail")``, ... (hidden ones too)."""
    import click

    root = root_command() if root is None else root
    out: list[tuple[str, ...]] = []

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        out.append(path)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))

    walk(root, ())
    return out


def anchor(path: tuple[str, ...]) -> str:
    """The reference's heading id of a command path: ``laggard-simulate-tail``."""
    return "-".join(("laggard", *path))


def help_text(path: tuple[str, ...], root=None) -> str:
    """What ``laggard PATH --help`` prints, at ``WIDTH`` columns, with no colour."""
    from click.testing import CliRunner

    try:  # typer reads its console settings from the environment at import: set them for this run
        import typer.rich_utils as ru

        saved = (ru.MAX_WIDTH, ru.FORCE_TERMINAL, ru.COLOR_SYSTEM)
        ru.MAX_WIDTH, ru.FORCE_TERMINAL, ru.COLOR_SYSTEM = WIDTH, False, None
    except (ImportError, AttributeError):  # a typer without rich: click's own formatter
        ru = saved = None
    try:
        res = CliRunner().invoke(root_command() if root is None else root, [*path, "--help"], prog_name="laggard",
                                 color=False, env={"COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"})
    finally:
        if ru is not None:
            ru.MAX_WIDTH, ru.FORCE_TERMINAL, ru.COLOR_SYSTEM = saved
    cmd = " ".join(("laggard", *path, "--help"))
    if res.exit_code != 0:
        raise RuntimeError(f"`{cmd}` exited {res.exit_code}: {res.output or res.exception!r}")
    lines = [_ANSI.sub("", line).rstrip() for line in res.output.splitlines()]
    text = "\n".join(lines).strip("\n")
    if not text:
        raise RuntimeError(f"`{cmd}` printed nothing")
    return text


def cli_reference(paths: list[tuple[str, ...]] | None = None) -> str:
    """The reference's Markdown: one section per command path (all of them by default), each the
    command's ``--help`` in a text block under a heading whose id is ``anchor(path)``."""
    root = root_command()
    paths = commands(root) if paths is None else paths
    parts: list[str] = []
    for path in paths:
        name = " ".join(("laggard", *path))
        level = "#" * min(2 + max(len(path) - 1, 0), 6)
        parts += [f"{level} `{name}` {{ #{anchor(path)} }}", "", "```text", help_text(path, root), "```", ""]
    return "\n".join(parts)


def missing_commands(reference: str, paths: list[tuple[str, ...]]) -> list[str]:
    """The command paths a reference (its Markdown or the built HTML page) lacks: no heading with
    the command's id, or no ``Usage: laggard PATH`` line of its help."""
    import html as _html

    plain = _html.unescape(re.sub(r"<[^>]+>", "", reference))
    out = []
    for path in paths:
        name = " ".join(("laggard", *path))
        has_anchor = f'id="{anchor(path)}"' in reference or f"#{anchor(path)} " in reference
        usage = re.search(rf"Usage: {re.escape(name)}(?: |$)", plain, re.M)
        if not (has_anchor and usage):
            out.append(name)
    return out


# ---- includes and links ---------------------------------------------------------------------


def _section(text: str, name: str, where: str) -> str:
    start, end = f"<!-- docs:{name}:start -->", f"<!-- docs:{name}:end -->"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{where} has no section {name!r} ({start} ... {end})")
    return text[i + len(start):j].strip("\n") + "\n"


def _rebase(markdown: str, source_dir: Path, page_dir: Path, docs_dir: Path) -> str:
    """``markdown``'s relative links, written from ``source_dir`` (a real folder of the repo), made
    right for a page in ``page_dir`` (a folder of docs_dir)."""

    def fix(m: re.Match[str]) -> str:
        target = m["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
            return m[0]
        rel, _, frag = target.partition("#")
        if not rel:
            return m[0]
        dest = (source_dir / rel).resolve()
        frag = f"#{frag}" if frag else ""
        try:
            inside = dest.relative_to(docs_dir)
        except ValueError:
            inside = None
        if inside is not None:
            return f"{m[1]}({os.path.relpath(dest, page_dir).replace(os.sep, '/')}{frag})"
        try:
            repo_path = dest.relative_to(ROOT).as_posix()
        except ValueError:
            return m[0]
        if repo_path in _included_whole:
            page = docs_dir / _included_whole[repo_path]
            return f"{m[1]}({os.path.relpath(page, page_dir).replace(os.sep, '/')}{frag})"
        if dest.exists():  # a repo file the site does not serve: keep the words, drop the link
            return m["text"]
        return m[0]

    out, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        out.append(line if fenced else _LINK.sub(fix, line))
    return "".join(out)


def expand(markdown: str, page_src: str, docs_dir: Path) -> str:
    """A page's Markdown with its include markers replaced and its links rebased."""
    page_dir = (docs_dir / page_src).parent

    def include(m: re.Match[str]) -> str:
        path = ROOT / m[1]
        if not path.is_file():
            raise ValueError(f"{page_src}: {m[0].strip()}: no file {path}")
        text = path.read_text(encoding="utf-8")
        if m[2]:
            text = _section(text, m[2], m[1])
        return _rebase(text, path.parent, page_dir, docs_dir)

    markdown = _rebase(markdown, page_dir, page_dir, docs_dir)
    return _INCLUDE.sub(include, markdown)


# ---- MkDocs events --------------------------------------------------------------------------


def on_files(files, config, **kwargs):
    """Which repo files pages include whole (for the links that point at them)."""
    docs_dir = Path(config["docs_dir"]).resolve()
    _included_whole.clear()
    for f in files.documentation_pages():
        src = docs_dir / f.src_uri
        if not src.is_file():
            continue
        for m in _INCLUDE.finditer(src.read_text(encoding="utf-8")):
            if not m[2]:
                _included_whole[PurePosixPath(m[1]).as_posix()] = f.src_uri
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    from mkdocs.exceptions import PluginError

    docs_dir = Path(config["docs_dir"]).resolve()
    try:
        markdown = expand(markdown, page.file.src_uri, docs_dir)
        if CLI_MARKER in markdown:
            markdown = markdown.replace(CLI_MARKER, cli_reference())
    except (ValueError, RuntimeError) as e:
        raise PluginError(f"laggard_docs: {e}") from e
    return markdown
