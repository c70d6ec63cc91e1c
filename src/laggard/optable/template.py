"""One pipeline instance's dependency model, replicated to every (step, DP rank) of a job.

Megatron-style jobs run one static schedule: the ops of one DP rank in one step (all its pipeline
stages), with their dependencies and communication groups, repeat in every step and on every DP
rank. The NDTimeline importer derives such a template from a trace; the synthetic generator
writes one from the 1F1B schedule. ``template_columns`` turns it into op-table columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa


@dataclass(slots=True, eq=False)  # numpy arrays: a generated == could only raise (no truth value)
class Template:
    """Ops of one instance: per op its stage, type, kind, stream, microbatch, chunk, deps, group."""

    stage: np.ndarray
    name: list[str]
    kind: list[str]
    stream: list[str]
    microbatch: np.ndarray
    vchunk: np.ndarray
    deps: list[list[int]]
    scope: list[str | None]  # None (no sync), "local" (within a DP rank), "dp", "world"
    label: list[str | None]
    gseq: list[int]
    peer_stage: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.stage)


def _tiled_dict(values_t: list[str], reps: int) -> pa.DictionaryArray:
    uniq = sorted(set(values_t))
    codes = np.array([uniq.index(v) for v in values_t], dtype=np.int32)
    return pa.DictionaryArray.from_arrays(pa.array(np.tile(codes, reps)), pa.array(uniq, type=pa.string()))


def template_columns(tpl: Template, inst_step: np.ndarray, num_dp: int, worker_rank: np.ndarray) -> dict:
    """Op-table columns (all but start_ns/dur_ns) for instances ``i = step_index * num_dp + dp``.

    ``inst_step[i]`` is the step number of instance i; op ``i * len(tpl) + t`` is template op t of
    instance i, and its ``deps`` refer to ops of the same instance. ``worker_rank[dp * P + stage]``
    is the global rank of each worker.
    """
    num_t = len(tpl)
    n_inst = len(inst_step)
    num_pp = int(tpl.stage.max()) + 1
    # per-op columns built in the table's int32 where it has one, not in int64 and then cast: each
    # op-sized array is fresh memory, and its pages are faulted in (trace-AR: 117k ops)
    t_idx = np.tile(np.arange(num_t, dtype=np.int32), n_inst)
    inst_dp = np.repeat((np.arange(n_inst) % num_dp).astype(np.int32), num_t)
    stage = tpl.stage.astype(np.int32)[t_idx]
    worker_rank = worker_rank.astype(np.int32)

    # deps: the template CSR with per-instance offsets
    t_len = np.array([len(d) for d in tpl.deps], dtype=np.int64)
    t_vals = np.array([x for d in tpl.deps for x in d], dtype=np.int64)
    t_ptr = np.concatenate([[0], np.cumsum(t_len)])
    e_t = len(t_vals)
    offsets = np.tile(t_ptr[:-1], n_inst) + np.repeat(np.arange(n_inst, dtype=np.int64) * e_t, num_t)
    offsets = np.append(offsets, n_inst * e_t)
    off_type = pa.int32() if n_inst * e_t < 2**31 else pa.int64()
    values = np.tile(t_vals, n_inst) + np.repeat(np.arange(n_inst, dtype=np.int64) * num_t, e_t)
    list_cls = pa.ListArray if off_type == pa.int32() else pa.LargeListArray
    deps = list_cls.from_arrays(pa.array(offsets, type=off_type), pa.array(values, type=pa.int64()))
    if off_type != pa.int32():
        deps = deps.cast(pa.list_(pa.int64()))

    # communication groups: local labels get one group per DP rank
    local_labels = sorted({lab for lab, sc in zip(tpl.label, tpl.scope, strict=True) if sc == "local"})
    global_labels = sorted({lab for lab, sc in zip(tpl.label, tpl.scope, strict=True) if sc in ("dp", "world")})
    n_loc = len(local_labels)
    group_dict = [f"{lab}:dp{d}" for d in range(num_dp) for lab in local_labels] + global_labels
    t_gcode = np.full(num_t, -1, dtype=np.int64)
    t_local = np.zeros(num_t, dtype=bool)
    for t in range(num_t):
        sc = tpl.scope[t]
        if sc == "local":
            t_gcode[t] = local_labels.index(tpl.label[t])
            t_local[t] = True
        elif sc is not None:
            t_gcode[t] = num_dp * n_loc + global_labels.index(tpl.label[t])
    gcode = t_gcode[t_idx] + np.where(t_local[t_idx], inst_dp * n_loc, 0)
    has_group = gcode >= 0
    group = pa.DictionaryArray.from_arrays(
        pa.array(np.where(has_group, gcode, 0).astype(np.int32), mask=~has_group),
        pa.array(group_dict or [""], type=pa.string()),
    )
    gseq = np.array(tpl.gseq, dtype=np.int64)[t_idx]
    peer_stage = np.array(tpl.peer_stage or [-1] * num_t, dtype=np.int32)[t_idx]
    peer = np.where(peer_stage >= 0, worker_rank[inst_dp * num_pp + np.maximum(peer_stage, 0)], np.int32(-1))
    n = n_inst * num_t
    return {
        "rank": worker_rank[inst_dp * num_pp + stage],
        "dp_rank": inst_dp,
        "pp_rank": stage,
        "tp_rank": np.full(n, -1, dtype=np.int32),
        "cp_rank": np.full(n, -1, dtype=np.int32),
        "vchunk": np.tile(tpl.vchunk.astype(np.int32), n_inst),
        "step": np.repeat(np.asarray(inst_step, dtype=np.int64), num_t),
        "microbatch": np.tile(np.asarray(tpl.microbatch).astype(np.int32), n_inst),
        "name": _tiled_dict(tpl.name, n_inst),
        "kind": _tiled_dict(tpl.kind, n_inst),
        "stream": _tiled_dict(tpl.stream, n_inst),
        "group": group,
        "seq": np.where(has_group, gseq, -1),
        "peer": peer,
        "deps": deps,
    }
