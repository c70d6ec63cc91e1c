"""The tracer's directory format: the names of its files, and what a tracer-written trace is missing
(ranks without ops, ranks that died, lost tails, dropped ops).

Each rank keeps ``rank{R}.state.json`` up to date (status, ops recorded/written/dropped, last step
written). A rank that was killed or crashed leaves ``status: running`` and the counts of its last
flush: everything it recorded after that is lost, and this module says so. No torch, no pyarrow.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

from laggard.errors import LaggardWarning

# The files of a trace directory; every module that writes, reads, cleans or skips them names them from here.
JOB_FILE = "job.json"  # the job's metadata (rank 0 writes it); also the native format's
STATE_SUFFIX = ".state.json"
STATE_GLOB = "rank*" + STATE_SUFFIX  # each rank's state file (its heartbeat): ``state_name``
SHARD_RE = re.compile(r"^ops-rank(\d+)-(\d+)\.parquet$")  # groups: rank, shard number
STATE_RE = re.compile(r"^rank(\d+)\.state\.json$")  # group: rank
FLIGHT_REQUEST_FILE = "flight-dump-request"  # created to ask the job's ranks for a Flight Recorder dump
FLIGHT_DUMP_KEY = "laggard"  # the extra key of a laggard-written Flight Recorder dump (torch's readers ignore it)
SPOOL_DIR = "monitor-spool"  # batches for the monitor's collector that could not be sent yet


def shard_name(rank: int, k: int) -> str:
    """The ``k``-th op shard of ``rank``: ``ops-rank{R}-{k:05d}.parquet``."""
    return f"ops-rank{rank}-{k:05d}.parquet"


def shard_glob(rank: int | None = None) -> str:
    """A glob for the op shards of ``rank`` (None: of every rank)."""
    return f"ops-rank{'*' if rank is None else rank}-*.parquet"


def state_name(rank: int) -> str:
    """The state file of ``rank``: ``rank{R}.state.json``."""
    return f"rank{rank}{STATE_SUFFIX}"


def flight_name(rank: int, fmt: str) -> str:
    """The Flight Recorder dump of ``rank``: ``flight-rank{R}.json`` for fmt 'json', else ``.pkl``."""
    return f"flight-rank{rank}.{'json' if fmt == 'json' else 'pkl'}"


def rank_of(name: str) -> int | None:
    """The rank in the name of an op shard or a state file; None for any other name."""
    m = SHARD_RE.match(name) or STATE_RE.match(name)
    return int(m.group(1)) if m else None


def read_states(path: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p in path.glob(STATE_GLOB):
        m = STATE_RE.match(p.name)
        if not m:
            continue
        try:
            out[int(m.group(1))] = json.loads(p.read_text())
        except (OSError, ValueError):
            out[int(m.group(1))] = {"status": "unreadable"}
    return out


def _ranks(rs: list[int]) -> str:
    return ", ".join(str(r) for r in rs[:8]) + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")


def check_trace(path: str | Path) -> list[str]:
    """One line per problem with a trace written by ``laggard.tracer.Tracer`` (empty: complete)."""
    path = Path(path)
    if not path.is_dir():
        return []
    states = read_states(path)
    world: int | None = None
    try:
        world = json.loads((path / JOB_FILE).read_text()).get("world_size")
    except (OSError, ValueError, AttributeError):
        pass
    if not states and world is None:
        return []
    shard_ranks = {int(m.group(1)) for p in path.glob(shard_glob()) if (m := SHARD_RE.match(p.name))}
    expected = set(range(world)) if isinstance(world, int) else set(states) | shard_ranks
    msgs: list[str] = []
    # ranks that trained but never ended a step (a loop with no optimizer under the zero-code capture)
    unended = {r: int(s["no_step_ended"].get("backward_passes", 0)) for r, s in states.items()
               if isinstance(s.get("no_step_ended"), dict)}
    if unended:
        msgs.append(f"{path}: rank(s) {_ranks(sorted(unended))} ran {max(unended.values())} backward passes but "
                    "no step ended: the zero-code capture ends a step at a torch.optim optimizer's step(); a loop "
                    "that updates the weights itself calls laggard.end_step() at the end of each step")
    missing = sorted(expected - shard_ranks - set(unended))
    if missing:
        msgs.append(f"{path}: no ops from rank(s) {_ranks(missing)} of {len(expected)} (died before their "
                    "first flush, or could not write); the analysis covers the other ranks only")
    last_steps = {r: s.get("last_step_written") for r, s in states.items() if s.get("last_step_written") is not None}
    top = max(last_steps.values()) if last_steps else None
    for r in sorted(states):
        st = states[r]
        status = str(st.get("status", "?"))
        written = st.get("num_ops_written", 0)
        last = st.get("last_step_written")
        where = f"step {last}" if last is not None else "before any step"
        if status == "running":
            msgs.append(f"rank {r} did not close its trace (killed or crashed): its last flush wrote {written} ops "
                        f"up to {where}; ops recorded after that are lost")
        elif status == "incomplete":
            msgs.append(f"rank {r}: the trace writer did not finish; {written} ops written up to {where}")
        elif status.startswith("failed") or status == "terminated":
            msgs.append(f"rank {r} stopped ({status}) at {where}; its trace was flushed ({written} ops)")
        elif status == "unreadable":
            msgs.append(f"rank {r}: unreadable state file")
        dropped = int(st.get("num_ops_dropped", 0) or 0)
        if dropped:
            msgs.append(f"rank {r} dropped {dropped} op(s): its trace writer fell behind")
        if top is not None and last is not None and last < top and status not in ("closed",):
            msgs.append(f"rank {r} has no ops after step {last} (other ranks reach step {top})")
    return msgs


def warn_trace(path: str | Path) -> list[str]:
    """``check_trace`` with each line issued as a ``LaggardWarning``."""
    msgs = check_trace(path)
    for m in msgs:
        warnings.warn(m, LaggardWarning, stacklevel=2)
    return msgs
