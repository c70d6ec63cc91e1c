"""One row per job in ``fleet.parquet``: the schema, and the row of an analysis or of a failure.

A row is built only from the job's analysis (``Analysis.to_json()``, the document
``laggard analyze --json`` writes; ``s_compute``/``s_comm`` are its ``by_opkind``) plus the replay
error the task computes from the same analysis. Status: ``ok``; ``rejected`` (analyzed, but the numbers are not to
be trusted: too few steps, replay fidelity out of bounds; kept with their numbers, left out of the
fleet statistics); ``error`` (could not be read or analyzed; ``error`` says why).
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

WORKER = pa.struct([("rank", pa.int64()), ("dp_rank", pa.int64()), ("stage", pa.int64())])
FINDING = pa.struct([
    ("cause", pa.string()),
    ("score", pa.float64()),  # share of the job's slowdown the finding explains (targeted what-if)
    ("gain", pa.float64()),  # predicted speed-up of its fix
    ("workers", pa.list_(WORKER)),
    ("stages", pa.list_(pa.int64())),
    ("steps", pa.list_(pa.int64())),
    ("evidence", pa.string()),
    ("fix", pa.string()),
])
# where each rank ran (laggard.optable.hosts; null fields where the trace does not say)
HOST = pa.struct([("rank", pa.int64()), ("host", pa.string()), ("gpu_uuid", pa.string()), ("pci_bus_id", pa.string())])
SCHEMA = pa.schema([
    ("job", pa.string()),
    ("format", pa.string()),
    ("status", pa.string()),  # ok | rejected | error
    ("error", pa.string()),  # why a job is rejected or failed; null when ok
    ("slowdown", pa.float64()),
    ("waste", pa.float64()),
    ("num_workers", pa.int64()),
    ("num_gpus", pa.int64()),
    ("num_steps", pa.int64()),
    ("num_ops", pa.int64()),
    ("gpu_hours", pa.float64()),
    ("gpu_hours_wasted", pa.float64()),
    ("s_compute", pa.float64()),  # S_t with only compute ops measured, the rest ideal
    ("s_comm", pa.float64()),  # S_t with only communication ops measured
    ("verdict", pa.string()),  # healthy | straggling
    ("top_cause", pa.string()),
    ("top_cause_share", pa.float64()),
    ("findings", pa.list_(FINDING)),
    ("replay_fidelity", pa.float64()),  # wall-clock / replayed step time (1 = the replay fits)
    ("replay_error", pa.float64()),  # mean |replayed - wall-clock| / wall-clock per step
    ("num_warnings", pa.int64()),
    ("size_bytes", pa.int64()),
    ("wall_s", pa.float64()),  # seconds to read and analyze the job
    ("json", pa.string()),  # the per-job analysis document, relative to the output directory
    ("hosts", pa.list_(HOST)),  # every rank's host and GPU the trace names (empty: it names none)
    # a hang found beside the trace (laggard.hang.window: hang | desync | missing-ranks; null: none)
    ("hang_verdict", pa.string()),
    ("gpu_hours_hung", pa.float64()),  # GPUs x the hang's window
    ("gpu_hours_hung_traced", pa.float64()),  # the part of it inside the traced steps
    # goodput (laggard.fleet.goodput): productive GPU-hours and their share of the job's GPU-hours
    ("gpu_hours_productive", pa.float64()),
    ("goodput", pa.float64()),
])


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def empty_row(job: str, fmt: str, size_bytes: int) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(SCHEMA.names)
    row.update(job=job, format=fmt, size_bytes=size_bytes, findings=[], hosts=[])
    return row


def error_row(job: str, fmt: str, size_bytes: int, reason: str, wall_s: float) -> dict[str, Any]:
    row = empty_row(job, fmt, size_bytes)
    row.update(status="error", error=reason, wall_s=wall_s)
    return row


def analysis_row(base_row: dict[str, Any], doc: dict[str, Any], *, replay_error: float) -> dict[str, Any]:
    """Fill ``base_row`` from an analysis document (``Analysis.to_json()``)."""
    findings = [
        {
            "cause": f["cause"],
            "score": _num(f.get("score")),
            # the gain the finding shows: a stage fix's whole-layer one where the layer count is known
            "gain": _num(f["gain_layers"] if f.get("gain_layers") is not None else f.get("gain")),
            "workers": [{k: int(w[k]) for k in ("rank", "dp_rank", "stage")} for w in f.get("workers", [])],
            "stages": [int(s) for s in f.get("stages", [])],
            "steps": [int(s) for s in f.get("steps", [])],
            "evidence": f.get("evidence", ""),
            "fix": f.get("fix", ""),
        }
        for f in doc.get("findings", [])
    ]
    row = dict(base_row)
    row.update(
        status="ok",
        slowdown=_num(doc["slowdown"]),
        waste=_num(doc["waste"]),
        num_workers=doc["num_workers"],
        num_gpus=doc["num_gpus"],
        num_steps=doc["num_steps"],
        num_ops=doc["num_ops"],
        gpu_hours=_num(doc["gpu_hours"]),
        gpu_hours_wasted=_num(doc["gpu_hours_wasted"]),
        s_compute=_num(doc["by_opkind"]["compute"]),
        s_comm=_num(doc["by_opkind"]["comm"]),
        verdict=doc.get("verdict"),
        top_cause=findings[0]["cause"] if findings else None,
        top_cause_share=findings[0]["score"] if findings else None,
        findings=findings,
        replay_fidelity=_num(doc["replay_fidelity"]),
        replay_error=_num(replay_error),
        num_warnings=len(doc.get("warnings", [])),
        hosts=[{"rank": int(h["rank"]), **{k: h.get(k) for k in ("host", "gpu_uuid", "pci_bus_id")}}
               for h in doc.get("meta", {}).get("hosts", [])],
    )
    return row


def add_goodput(row: dict[str, Any], hang: Any = None, *, num_gpus: int | None = None,
                trace_span_ns: tuple[int, int] | None = None) -> None:
    """The hang columns from ``hang`` (a ``laggard.hang.window.HangWindow`` or None) and the job's
    goodput (``laggard.fleet.goodput.job_goodput``) into an analyzed row."""
    from laggard.fleet.goodput import job_goodput

    hung = hung_traced = 0.0
    if hang is not None and num_gpus:
        hung = num_gpus * hang.lost_s / 3600.0
        if trace_span_ns is not None:
            overlap = min(hang.end_ns, trace_span_ns[1]) - max(hang.start_ns, trace_span_ns[0])
            hung_traced = num_gpus * max(overlap, 0) / 1e9 / 3600.0
        row.update(hang_verdict=hang.verdict, gpu_hours_hung=hung, gpu_hours_hung_traced=hung_traced)
    gh, ghw = row.get("gpu_hours"), row.get("gpu_hours_wasted")
    if gh is None or ghw is None:
        return
    g = job_goodput(gh, ghw, hung, hung_traced)
    row.update(gpu_hours_productive=g.productive, goodput=_num(g.goodput))


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)
