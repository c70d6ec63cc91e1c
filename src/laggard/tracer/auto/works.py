"""What the zero-code communication capture's parts share: the asynchronous work it records, the
patches it puts into torch (and takes out), and the phase pause around a communication."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from laggard.tracer.comm import TracedWork, _nbytes


class AutoWork(TracedWork):
    """An asynchronous communication captured by zero-code tracing: its end is the completion its
    future reports (from whichever thread completes it), written by the training thread at the
    next phase segment (``CommCapture.flush``), or, for a work without a future, at ``wait()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._end_ns: int | None = None
        self._ev1: Any = None

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs) if self._work is not None else True
        if not self._done:
            self._done = True
            self._tracer._complete_async(self, self._end_ns, self._ev1)
        return out


class Patches:
    """Functions replaced in torch's modules and classes, each put back by ``undo`` (last first)."""

    def __init__(self) -> None:
        self._originals: list[tuple[Any, str, Any]] = []

    def wrap(self, fname: str, orig: Any, wrapper: Callable[..., Any], namespaces: tuple[Any, ...]) -> None:
        """``wrapper`` in place of ``orig`` under ``fname`` in each namespace that holds ``orig`` there."""
        wrapper.__name__ = getattr(orig, "__name__", fname)
        wrapper.__qualname__ = getattr(orig, "__qualname__", fname)
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        for ns in namespaces:
            if getattr(ns, fname, None) is orig:
                self._originals.append((ns, fname, orig))
                setattr(ns, fname, wrapper)

    def undo(self) -> None:
        for ns, fname, orig in reversed(self._originals):
            setattr(ns, fname, orig)
        self._originals.clear()


@contextmanager
def paused(phases: Any) -> Iterator[None]:
    """The phase segment open on the training thread ends at the communication and a new one starts
    after it: the compute before an issue is what the communication depends on, and what follows a
    wait depends on it."""
    phases.pause()
    try:
        yield
    finally:
        phases.resume()


def storage_key(x: Any) -> int:
    """What identifies a functional collective's result when it is awaited: the wait may get a view of
    it (DTensor's async tensor re-wraps views), which shares its storage, never its identity."""
    try:
        return int(x.untyped_storage().data_ptr())
    except (AttributeError, RuntimeError, TypeError):
        return id(x)


def size_of(x: Any) -> int:
    """Bytes of a tensor or a list of tensors (-1 when unknown)."""
    if x is None:
        return -1
    if isinstance(x, (list, tuple)):
        sizes = [_nbytes(t) for t in x]
        return sum(sizes) if sizes and min(sizes) >= 0 else -1
    return _nbytes(x)
