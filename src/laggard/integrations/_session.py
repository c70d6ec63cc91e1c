"""What the framework integrations share: a session started once per process, and the torch optimizer
behind the frameworks' wrappers. Imports no framework."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laggard.tracer.auto.session import AutoTrace

# wrappers that keep the optimizer they step in ``.optimizer`` (accelerate's AcceleratedOptimizer,
# Lightning's LightningOptimizer, DeepSpeed's): a bound on how deep they nest
MAX_WRAPPERS = 8


class Borrowed:
    """The session already active in this process (``laggard run``'s, or one the program started),
    lent to an integration: it traces as it is, and closing it is its owner's business, so ``close``
    and the context manager's exit do nothing. Its other attributes are the session's."""

    def __init__(self, session: AutoTrace) -> None:
        self.session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def close(self, status: str = "closed") -> None:
        """Nothing: the session's owner closes it."""

    def __enter__(self) -> Borrowed:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return False


Session = AutoTrace | Borrowed


def start(model: Any, optimizer: Any, *, out_dir: str | Path, name: str, tracer_kwargs: dict[str, Any]) -> Session:
    """A new session over ``model`` and ``optimizer`` (unwrapped), or the active one, borrowed."""
    from laggard.tracer.auto import session as s

    active = s._ACTIVE  # noqa: SLF001 - the one-per-process slot the session module keeps
    if active is not None:
        return Borrowed(active)
    return s.autotrace(model, unwrap_optimizer(optimizer), out_dir=out_dir, name=name, **tracer_kwargs)


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer whose ``step`` a wrapper calls: torch's step hooks, which end a traced
    step, see that one (a wrapper such as AcceleratedOptimizer never runs ``Optimizer.__init__``,
    so its own ``step`` is not hooked)."""
    for _ in range(MAX_WRAPPERS):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer or not callable(getattr(inner, "step", None)):
            break
        optimizer = inner
    return optimizer


def default_name(model: Any) -> str:
    """The job's name when none is given: the model's class name."""
    return type(model).__name__ if model is not None else "job"
