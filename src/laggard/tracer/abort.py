"""Ending a hung rank when the collector's verdict is in (``Tracer(..., abort_on_hang=True)``), and
the emergency flush it shares with SIGTERM.

A hung job holds its GPUs until the collective timeout (30 minutes by default on NCCL) and then
fails. With ``abort_on_hang`` (opt-in, off by default) each rank's stream thread, once the
collector publishes a verdict of ``hang``, ``desync`` or ``missing-ranks`` for a hang it
suspected, checks that this rank has not recorded a single op since it sent its report (a job
that moved on is left alone), logs one CRITICAL line naming the verdict, the culprit ranks and the
collective, writes what was recorded, aborts the default process group (from a helper thread,
given ``ABORT_WAIT_S``: on gloo the blocked collective then fails at once) and ends the process
with ``HANG_EXIT_CODE`` (75, EX_TEMPFAIL of sysexits.h: "try again later"), so the scheduler can
restart the job instead of waiting for the timeout. The message goes through ``logging``
(logger ``laggard.tracer``; with no handler configured Python writes it to stderr).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

HANG_EXIT_CODE = 75  # EX_TEMPFAIL: the job hung and was ended on purpose; restart it
ABORT_WAIT_S = 5.0  # for the process group's abort (a backend that blocks in it is not waited for longer)
FLUSH_WAIT_S = 10.0  # for the shard writer to write the last page (a stuck disk must not keep a hung job up)
VERDICTS = ("hang", "desync", "missing-ranks")  # verdicts that end a hung rank

log = logging.getLogger("laggard.tracer")


def flush_now(tracer: Any, status: str, *, close_stream: bool, wait_s: float = 30.0) -> None:
    """Write what was recorded and stop recording (SIGTERM, an abort): from any thread."""
    t = tracer
    if t._closed or not t._enabled:  # noqa: SLF001 - this module is the tracer's
        return
    if t._flight is not None:  # noqa: SLF001
        t._flight.dump(status)  # noqa: SLF001
    t._enabled = t._plain = False  # noqa: SLF001
    done = threading.Event()
    page = t._take(done)  # noqa: SLF001
    t._update_counts()  # noqa: SLF001
    if page is not None:
        t._writer.submit(page)  # noqa: SLF001
        done.wait(wait_s)
    t._writer.write_state(status)  # noqa: SLF001
    if close_stream and t._stream is not None:  # noqa: SLF001
        t._stream.close(2.0)  # noqa: SLF001 - what is not sent stays in the spool


def should_abort(verdict: dict[str, Any], *, opted_in: bool | None) -> bool:
    """The collector's published verdict (``hang`` in a heartbeat answer) asks a hung rank to end."""
    if opted_in is False or not verdict.get("suspected") or verdict.get("verdict") not in VERDICTS:
        return False
    return bool(opted_in) or bool(verdict.get("abort"))


def abort_hung(tracer: Any, verdict: dict[str, Any]) -> None:
    """Log why, write the trace, abort the process group and exit with ``HANG_EXIT_CODE`` (never returns)."""
    where = ""
    if verdict.get("op") is not None:
        where = f" at {verdict.get('op')} seq {verdict.get('seq')} of group {verdict.get('group')}"
    log.critical("laggard: job %s hung (collector verdict: %s, culprit rank(s) %s%s); rank %d has not moved since "
                 "its hang report: aborting its process group and exiting with code %d (Tracer(abort_on_hang=...) "
                 "or the collector's hang rule asked for it)", verdict.get("job"), verdict.get("verdict"),
                 verdict.get("culprit_ranks"), where, tracer.rank, HANG_EXIT_CODE)
    try:
        flush_now(tracer, f"aborted: {verdict.get('verdict')}", close_stream=False, wait_s=FLUSH_WAIT_S)
    except Exception:  # noqa: BLE001 - the exit must happen whatever the flush does
        log.exception("laggard: flushing the trace before the abort failed")
    done = threading.Thread(target=_abort_group, name="laggard-abort", daemon=True)
    done.start()
    done.join(ABORT_WAIT_S)
    for h in logging.getLogger().handlers + log.handlers:
        try:
            h.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(HANG_EXIT_CODE)


def _abort_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.distributed_c10d._abort_process_group()  # noqa: SLF001 - torch's abort of every group
    except Exception as e:  # noqa: BLE001 - a backend without abort: the exit ends it anyway
        log.warning("laggard: aborting the process group failed (%s); exiting anyway", e)
