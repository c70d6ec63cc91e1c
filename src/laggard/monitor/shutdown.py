"""SIGTERM stops a server command the way Ctrl-C does: through its ``finally`` blocks.

uvicorn takes SIGINT and SIGTERM while it serves, shuts down gracefully, puts the previous handlers
back and raises the signal again. Python's own SIGINT handler then raises KeyboardInterrupt, so the
command's ``finally`` runs (the collector stops, its analysis processes are shut down and joined);
SIGTERM's default handler ends the process at once instead, with the pool's children and queues
never closed (multiprocessing's resource tracker then reports "leaked semaphore objects"). Inside
``stop_on_sigterm`` SIGTERM raises ``Terminated`` instead, which unwinds the block and is taken there:
the command returns, exit code 0 (a requested stop is a clean one).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, as KeyboardInterrupt: no ``except Exception`` takes it)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # a second SIGTERM while the first one's shutdown runs ends the process at once
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM during the block unwinds it as an exception (its ``finally`` blocks run) and ends here;
    the previous handler is back afterwards. Outside the main thread (no signals there): nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, before)


__all__ = ["Terminated", "stop_on_sigterm"]
