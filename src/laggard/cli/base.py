"""The `laggard` command: thin; parses arguments, calls the library, prints.

User mistakes (``LaggardError``, bad flags) end in one line on stderr and exit code 2;
warnings (``LaggardWarning``) are printed as one line each and the command goes on.
"""

from __future__ import annotations

import functools
import sys
import warnings

import typer
from click import exceptions as click_exc

from laggard.errors import LaggardError, LaggardWarning


def _new_app() -> typer.Typer:
    """The app with no command yet: its settings and the root options (``--version``)."""
    one = typer.Typer(
        name="laggard",
        help="Find, explain and fix stragglers in distributed training.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    one.callback()(_root)
    return one


# Every command module has ``register(app)``, which adds the commands (or command groups) listed
# beside it, in this order; `laggard NAME ...` imports only NAME's module (tests/cli checks the
# names against what each module registers). Keep them light at import: start-up time is benchmarked.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "laggard.cli.analyze": ("analyze", "whatif", "convert", "synth"),
    "laggard.cli.diff": ("diff",),
    "laggard.cli.simulate": ("simulate",),
    "laggard.cli.collectives": ("collectives", "bench"),
    # importing laggard.mitigate costs ~40 ms: only inside the commands
    "laggard.cli.mitigate": ("fit-cost", "partition"),
    "laggard.cli.demo": ("demo",),
    "laggard.cli.hang": ("hang",),
    "laggard.cli.fleet": ("fleet",),
    "laggard.cli.dessim": ("dessim",),  # simpy loads inside the command
    "laggard.cli.monitor": ("monitor",),
    "laggard.cli.cache": ("cache",),
    "laggard.cli.run": ("run",),  # torch loads inside the command (the launcher)
    "laggard.cli.top": ("top",),
}


# the root options that take no value and run a command after them (`laggard --no-cache analyze ...`)
ROOT_FLAGS = ("--no-cache",)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("laggard")
        except PackageNotFoundError:  # run from a source tree that was never installed
            v = "unknown (not installed)"
        typer.echo(f"laggard {v}")
        raise typer.Exit(0)


def _root(
    _show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="Print laggard's version and exit."),
    _no_cache: bool = typer.Option(False, "--no-cache",
                                   help="Load traces afresh and cache nothing (default: loaded op tables are kept in "
                                        "LAGGARD_CACHE_DIR, else ~/.cache/laggard/jobs; "
                                        "LAGGARD_NO_CACHE=1 also turns it off)."),
) -> None:
    """Find, explain and fix stragglers in distributed training."""


def _registered(modules: list[str]) -> typer.Typer:
    import importlib

    one = _new_app()
    for module in modules:
        importlib.import_module(module).register(one)
    return one


@functools.cache
def _full_app() -> typer.Typer:
    """Every command, registered once, on first use (a run of one command registers only its own)."""
    return _registered(list(COMMAND_MODULES))


def __getattr__(name: str) -> typer.Typer:
    """``app``: the full app (``_full_app``)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _full_app()


def _app_for(argv: list[str]) -> typer.Typer:
    """The app with only the command (or command group) that ``argv`` names, when it names one, from
    its module alone: typer builds the click command of every registered function from its signature
    on each start (~40 ms for all of them), and importing the other command modules costs ~10 ms;
    only one runs. Help, version and unknown names get the whole app."""
    rest = list(argv)
    while rest and rest[0] in ROOT_FLAGS:
        rest.pop(0)
    name = rest[0] if rest else ""
    modules = [m for m, names in COMMAND_MODULES.items() if name in names]
    if len(modules) != 1:
        return _full_app()
    one = _registered(modules)
    cmds = [c for c in one.registered_commands if (c.name or c.callback.__name__.replace("_", "-")) == name]
    groups = [g for g in one.registered_groups if (g.name or g.typer_instance.info.name) == name]
    if len(cmds) + len(groups) != 1:
        return _full_app()
    one.registered_commands, one.registered_groups = cmds, groups
    return one


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors with exit code 2, warnings as one line each."""
    command = typer.main.get_command(_app_for(sys.argv[1:] if argv is None else argv))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        try:
            # outside standalone mode click returns a `typer.Exit(N)` raised in a command as N (commands return None)
            rv = command.main(args=argv, prog_name="laggard", standalone_mode=False)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except LaggardError as e:
            _flush_warnings(caught)
            print(f"laggard: error: {e}", file=sys.stderr)
            return 2
        except (click_exc.Exit, typer.Exit) as e:
            code = e.exit_code
        except (click_exc.Abort, typer.Abort):
            print("laggard: aborted", file=sys.stderr)
            return 130
        except click_exc.UsageError as e:
            ctx = (f" (see 'laggard {e.ctx.command_path.split(' ', 1)[1]} --help')"
                   if e.ctx and " " in e.ctx.command_path else "")
            print(f"laggard: error: {e.format_message()}{ctx}", file=sys.stderr)
            return 2
        except click_exc.ClickException as e:
            print(f"laggard: error: {e.format_message()}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            return 0
        except OSError as e:  # an output that became unwritable mid-run (disk full, removed directory)
            _flush_warnings(caught)
            where = f" {e.filename}" if e.filename else ""
            print(f"laggard: error: cannot read or write{where}: {e.strerror or e}", file=sys.stderr)
            return 2
    _flush_warnings(caught)
    return code or 0


def _flush_warnings(caught: list[warnings.WarningMessage]) -> None:
    for w in caught:
        if issubclass(w.category, LaggardWarning):
            print(f"laggard: warning: {w.message}", file=sys.stderr)


def entry() -> None:
    """Console entry point (see laggard.startup: no pandas, no OpenBLAS thread pool, no teardown)."""
    from laggard.startup import exit_now, lean_process

    lean_process()
    exit_now(main())


if __name__ == "__main__":
    entry()
