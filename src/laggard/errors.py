"""The two exceptions every part of laggard shares (no dependencies: cheap to import anywhere)."""


class LaggardError(ValueError):
    """A mistake in the user's input (file, flag, data). The CLI prints it as one line, exit 2."""


class LaggardWarning(UserWarning):
    """Something was skipped or ignored; the analysis goes on. The CLI prints it as one line."""


class GraphCycleError(LaggardError):
    """The ops' dependencies form a cycle (the trace contradicts its own dependencies)."""
