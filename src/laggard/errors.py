"""The two exceptions every part of laggard shares (no dependencies: cheap to import anywhere)."""


class LaggardError(ValueError):
    """A mistake in the user's input (file, flag, data). The CLI prints it as one line, exit 2."""


class LaggardWarning(UserWarning):
    """Something was skipped or ignored; the analysis goes on. The CLI prints it as one line."""


class GraphCycleError(LaggardError):
    """The ops' dependencies form a cycle (the trace contradicts its own dependencies)."""


def check_output(path: object, flag: str, *, directory: bool = False) -> None:
    """Fail before any work when an output path cannot be written: ``flag`` names the option.
    A file output must not be a directory and its directory must exist and be writable; a
    directory output must not be a file and must be creatable. '-' (stdout) and None pass."""
    import os
    from pathlib import Path

    if path is None or str(path) == "-":
        return
    p = Path(str(path))
    if directory:
        if p.exists() and not p.is_dir():
            raise LaggardError(f"{flag} {p}: is a file, not a directory")
        probe = p
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise LaggardError(f"{flag} {p}: cannot create it ({probe} is a file)")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise LaggardError(f"{flag} {p}: {probe} is not writable")
        return
    if p.is_dir():
        raise LaggardError(f"{flag} {p}: is a directory; give a file name")
    parent = p.parent
    if parent.exists() and not parent.is_dir():
        raise LaggardError(f"{flag} {p}: {parent} is a file, not a directory")
    if not parent.is_dir():
        raise LaggardError(f"{flag} {p}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise LaggardError(f"{flag} {p}: not writable")
