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

    if path is None or (str(path) == "-" and not directory):
        return
    p = Path(str(path))
    if directory and str(path) == "-":
        raise LaggardError(f"{flag} -: needs a directory, not '-' (stdout)")
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


def check_seed(seed: object, flag: str = "--seed") -> int:
    """A random seed is an integer >= 0 (numpy's generators refuse negative ones)."""
    import operator

    try:
        value = operator.index(seed)  # type: ignore[arg-type]
    except TypeError:
        raise LaggardError(f"{flag}: the seed must be an integer >= 0, got {seed!r}") from None
    if isinstance(seed, bool) or value < 0:
        raise LaggardError(f"{flag}: the seed must be an integer >= 0, got {seed!r}")
    return value


def check_healthy_threshold(value: float, flag: str = "--healthy-threshold") -> None:
    """A slowdown below which a job is called healthy: a finite number >= 1."""
    import math

    if not (math.isfinite(value) and value >= 1.0):
        raise LaggardError(f"{flag} must be a number >= 1 (got {value})")


def check_job_size(num_ops: int, max_ops: int, sizes: str) -> None:
    """A generated job must fit in memory: ``sizes`` names the flags that make it (for the message)."""
    if num_ops > max_ops:
        raise LaggardError(f"{sizes} make about {num_ops:,} ops, more than the {max_ops:,} a generated job may have; "
                           "choose smaller sizes")
