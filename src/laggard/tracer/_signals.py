"""Flush live tracers on interpreter exit and on SIGTERM, including when the main thread is stuck.

Python runs a signal handler only when the main thread returns to the interpreter; a rank blocked
in a collective that will never finish would never flush. So besides the handler, a watcher thread
reads the signal wake-up pipe (written by the C-level handler at once): if the Python handler has
not started ``GRACE_S`` after a SIGTERM, the watcher flushes the tracers itself and ends the
process with the status SIGTERM would give. A wake-up fd someone else installed (asyncio) is left
alone; then only the handler path is used.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from typing import Any

# the Tracer of laggard.tracer.core, which imports this module (so it is not imported back here)
Tracer = Any

GRACE_S = 2.0

_live: list[Tracer] = []
_lock = threading.Lock()
_flush_lock = threading.Lock()
_handled = threading.Event()
_state: dict[str, Any] = {"installed": False, "atexit": False, "prev": None, "pipe": None}
# a SIGTERM that lands while the main thread is closing a tracer waits for the close to finish: the
# handler interrupting it would find the tracer closed, flush nothing, and end the process before
# the close wrote the last page and the final status
_closing = [0]
_deferred = threading.Event()


def closing(delta: int) -> None:
    """Tracer.close brackets itself with +1 / -1; a SIGTERM deferred meanwhile is handled at the end."""
    _closing[0] = max(0, _closing[0] + delta)
    if not _closing[0] and _deferred.is_set():
        _deferred.clear()
        _on_sigterm(signal.SIGTERM, None)


def register(tracer: Tracer, *, handle_signals: bool) -> None:
    with _lock:
        _live.append(tracer)
        if not _state["atexit"]:
            atexit.register(_at_exit)
            _state["atexit"] = True
    if handle_signals and not _state["installed"] and threading.current_thread() is threading.main_thread():
        _install()


def unregister(tracer: Tracer) -> None:
    with _lock:
        if tracer in _live:
            _live.remove(tracer)
        empty = not _live
    if empty and _state["installed"] and threading.current_thread() is threading.main_thread():
        _uninstall()


def _install() -> None:
    prev = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _state.update(installed=True, prev=prev)
    _handled.clear()
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        old = -2
    if old != -1:  # someone else's wake-up fd: put it back, use the handler only
        if old >= 0:
            signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return
    _state["pipe"] = (r, w)
    threading.Thread(target=_watch, args=(r,), name="laggard-sigterm-watch", daemon=True).start()


def _uninstall() -> None:
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        prev = _state["prev"]
        signal.signal(signal.SIGTERM, prev if prev is not None else signal.SIG_DFL)
    pipe = _state["pipe"]
    if pipe is not None:
        signal.set_wakeup_fd(-1)
        os.close(pipe[1])  # the watcher's read returns b"" and it closes the read end
    _state.update(installed=False, prev=None, pipe=None)


def _flush_all(status: str) -> None:
    with _lock:
        tracers = list(_live)
    for t in tracers:
        t._emergency_flush(status)  # noqa: SLF001 - the registry is part of the tracer


def _on_sigterm(signum: int, frame: Any) -> None:
    _handled.set()
    if _closing[0] and threading.current_thread() is threading.main_thread():
        _deferred.set()
        return
    with _flush_lock:
        _flush_all("terminated")
    prev = _state["prev"]
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _watch(fd: int) -> None:
    try:
        while True:
            data = os.read(fd, 64)
            if not data:
                return
            if signal.SIGTERM in data and not _handled.wait(GRACE_S):
                with _flush_lock:
                    if not _handled.is_set():
                        _flush_all("terminated")
                        os._exit(128 + signal.SIGTERM)
    finally:
        os.close(fd)


def _at_exit() -> None:
    with _lock:
        tracers = list(_live)
    for t in tracers:
        t.close()
