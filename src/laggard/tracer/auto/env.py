"""What ``laggard run`` tells each rank through its environment, read by ``install_from_env``.

The launcher sets these in every rank's environment and starts the rank through
``python -m laggard.tracer.auto.boot``; a script run that way is traced without importing laggard.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from laggard.errors import LaggardError

TRACE_DIR_ENV = "LAGGARD_TRACE_DIR"  # where every rank writes its shards (tracing is on when set)
JOB_NAME_ENV = "LAGGARD_JOB_NAME"  # the job's name in job.json (default: the script's stem)
MONITOR_URL_ENV = "LAGGARD_MONITOR_URL"  # stream to a live-monitor collector too
TOKEN_ENV = "LAGGARD_TOKEN"  # the collector's token
FLUSH_ENV = "LAGGARD_FLUSH_S"  # how often a rank hands its page to the writer (what `laggard top` sees)
# a live view reads the shards as they land: a page every 2 s at most costs one small Parquet file
# per rank per 2 s, and keeps the view within a few steps of the job
DEFAULT_FLUSH_S = 2.0


@dataclass(kw_only=True, slots=True)
class AutoEnv:
    """The tracing settings one rank was started with."""

    trace_dir: str
    name: str | None = None
    monitor_url: str | None = None
    token: str | None = None
    flush_interval_s: float = DEFAULT_FLUSH_S

    def to_env(self) -> dict[str, str]:
        """The environment variables that say the same (what the launcher sets)."""
        env = {TRACE_DIR_ENV: self.trace_dir, FLUSH_ENV: repr(float(self.flush_interval_s))}
        if self.name:
            env[JOB_NAME_ENV] = self.name
        if self.monitor_url:
            env[MONITOR_URL_ENV] = self.monitor_url
        if self.token:
            env[TOKEN_ENV] = self.token
        return env


def read_env(environ: dict[str, str] | None = None) -> AutoEnv | None:
    """The settings in ``environ`` (default ``os.environ``), or None when tracing is not asked for."""
    env = os.environ if environ is None else environ
    trace_dir = env.get(TRACE_DIR_ENV, "")
    if not trace_dir:
        return None
    flush = env.get(FLUSH_ENV, "")
    try:
        flush_s = float(flush) if flush else DEFAULT_FLUSH_S
    except ValueError:
        raise LaggardError(f"{FLUSH_ENV} must be a number of seconds, not {flush!r}") from None
    if not flush_s > 0:
        raise LaggardError(f"{FLUSH_ENV} must be positive, not {flush!r}")
    return AutoEnv(trace_dir=trace_dir, name=env.get(JOB_NAME_ENV) or None,
                   monitor_url=env.get(MONITOR_URL_ENV) or None, token=env.get(TOKEN_ENV) or None,
                   flush_interval_s=flush_s)
