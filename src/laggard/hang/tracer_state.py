"""What laggard's own tracer says about each rank: its heartbeat state file and its last recorded op,
and (``add_tracer_entries``) the collectives it counted, standing in for a Flight Recorder that was off.

``laggard.tracer`` keeps ``rank{R}.state.json`` beside the op shards (status, last step started,
``updated_unix_s`` = the time of the last flush: a heartbeat) and writes ``ops-rank{R}-*.parquet``.
A rank whose status is still ``running`` never closed its trace (hung, killed or crashed). The
last op comes from the rank's newest shard (pyarrow is imported only when there is one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from laggard.hang.dumps import Entry, RankDump
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


def _label_ranks(label: str, world_size: int | None) -> list[int] | None:
    """The ranks of a tracer group label: ``world``, ``pg:0,2,4``; None for labels a user gave."""
    if label == "world":
        return list(range(world_size)) if world_size else None
    if label.startswith("pg:"):
        try:
            return sorted(int(x) for x in label[3:].split(","))
        except ValueError:
            return None
    return None


def add_tracer_entries(d: RankDump) -> bool:
    """With the Flight Recorder off (a dump whose ``laggard`` key says ``fr: false``), let the
    collectives laggard's tracer counted stand in for the ring buffer: per process group, the
    last collective the rank entered (``group_calls``: how many it called, the same numbering on
    every member), pending while the main thread is in it (``comm``). Sizes are unknown (no desync
    is found this way). True when entries were added."""
    t = d.tracer
    calls = t.get("group_calls")
    if d.entries or t.get("fr", True) is not False or not isinstance(calls, dict):
        return False
    comm = t.get("comm") if isinstance(t.get("comm"), dict) else {}
    last = t.get("group_last") if isinstance(t.get("group_last"), dict) else {}
    position = sum(n for k, n in calls.items() if isinstance(n, int) and not str(k).startswith("p2p:"))
    for label, n in sorted(calls.items()):
        label = str(label)
        if label.startswith("p2p:") or not isinstance(n, int) or n <= 0:
            continue
        pending = comm.get("group") == label and comm.get("kind") == "collective"
        op = str(comm.get("name") if pending else last.get(label, "?"))
        created = comm.get("start_unix_ns") if pending else 0
        d.entries.append(Entry(group=label, seq=n, record_id=position if pending else -1, op=op,
                               sig=("tracer", (), (), ()),
                               created_ns=created if isinstance(created, int) else 0, is_p2p=False,
                               done=not pending))
        ranks = _label_ranks(label, d.world_size)
        if ranks is not None:
            d.group_ranks[label] = ranks
    d.synthetic = True
    return True
