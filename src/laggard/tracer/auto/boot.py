"""Run a training script with zero-code tracing: ``python -m laggard.tracer.auto.boot SCRIPT [ARGS...]``
(or ``-m MODULE [ARGS...]``), what ``laggard run`` starts in every rank.

The tracing settings come from the environment (``laggard.tracer.auto.env``); the script runs as
``__main__`` with ``sys.argv`` as it would under ``python SCRIPT ARGS``, and the process exits as
the script would: its ``SystemExit`` code, or 1 with Python's traceback for an uncaught exception.
The trace is closed either way (status ``closed``, or ``failed: <exception>``), so a failed run's
ops are kept.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print("usage: python -m laggard.tracer.auto.boot (SCRIPT | -m MODULE) [ARGS...]", file=sys.stderr)
        return 2
    from laggard.tracer.auto.session import install_from_env

    session = install_from_env()
    module = argv[1] if argv[0] == "-m" else None
    target = module or argv[0]
    sys.argv = [target, *argv[(2 if module else 1):]]
    status, code = "closed", 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))  # as `python SCRIPT` does
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
        status = "closed" if code == 0 else f"failed: exit {code}"
    except BaseException as e:  # noqa: BLE001 - the script's own error: reported as Python would
        traceback.print_exc()
        status, code = f"failed: {type(e).__name__}", 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        if session is not None:
            session.close(status)
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits 1
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
