"""What laggard's own tracer says about each rank: its heartbeat state file and its last recorded op.

``laggard.tracer`` keeps ``rank{R}.state.json`` beside the op shards (status, last step started,
``updated_unix_s`` = the time of the last flush: a heartbeat) and writes ``ops-rank{R}-*.parquet``.
A rank whose status is still ``running`` never closed its trace (hung, killed or crashed). The
last op comes from the rank's newest shard (pyarrow is imported only when there is one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from laggard.optable.tracedir import SHARD_RE, STATE_GLOB, STATE_RE, shard_glob


def _last_op(shard: Path) -> dict[str, Any] | None:
    try:
        import pyarrow.parquet as pq

        t = pq.read_table(shard, columns=["name", "kind", "step", "start_ns", "dur_ns"])
    except (OSError, ValueError, ImportError, KeyError):
        return None
    if t.num_rows == 0:
        return None
    end = [s + d for s, d in zip(t.column("start_ns").to_pylist(), t.column("dur_ns").to_pylist(), strict=True)]
    names = t.column("name").to_pylist()
    # the zero-length gc op that closes each step says nothing: the last other op
    order = sorted(range(len(end)), key=lambda i: end[i], reverse=True)
    i = next((i for i in order if names[i] != "gc"), order[0])
    return {"name": names[i], "kind": t.column("kind").to_pylist()[i], "step": t.column("step").to_pylist()[i],
            "end_unix_ns": end[i], "source": shard.name}


def read_tracer_states(dirs: list[Path]) -> dict[int, dict[str, Any]]:
    """rank -> {status, last_step_started, heartbeat_unix_s, last_op (from the shards)} for every
    tracer state file under ``dirs``."""
    out: dict[int, dict[str, Any]] = {}
    for d in dirs:
        shards: dict[int, Path] = {}
        for p in d.rglob(shard_glob()):
            m = SHARD_RE.match(p.name)
            if m and (int(m.group(1)) not in shards or p.name > shards[int(m.group(1))].name):
                shards[int(m.group(1))] = p
        for p in d.rglob(STATE_GLOB):
            m = STATE_RE.match(p.name)
            if not m:
                continue
            rank = int(m.group(1))
            try:
                st = json.loads(p.read_text())
            except (OSError, ValueError):
                out[rank] = {"status": "unreadable", "path": str(p)}
                continue
            if not isinstance(st, dict):
                continue
            info = {"status": st.get("status"), "last_step_started": st.get("last_step_started"),
                    "heartbeat_unix_s": st.get("updated_unix_s"), "path": str(p)}
            if rank in shards:
                info["last_op"] = _last_op(shards[rank])
            out[rank] = info
    return out
