"""The op table of a profiler-traced job, built from its ranks' ops (``laggard.io.kineto.rank``):
labels shared across ranks (compute segments named by phase and transfers by direction on
pipelines), collectives matched across ranks, clock offsets removed, and the job's metadata
(layout, clock offsets, process groups, devices, decoding costs)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.errors import LaggardError, LaggardWarning
from laggard.io.kineto.comm import KIND_RECV, KIND_SEND
from laggard.io.kineto.rank import KIND_LABELS, RankOps

if TYPE_CHECKING:
    from laggard.io.kineto.layout import Layout
    from laggard.optable.ops import Job


def build_job(ranks: list[RankOps], files: list[Path], *, align_clocks: bool, layout: Layout,
              peers_matched: int = 0) -> Job:
    """The job of the ranks' ops, laid out by ``layout``; ``peers_matched``: the transfer ends whose
    peers were matched across ranks (``laggard.io.kineto.layout.assign_peers``)."""
    from laggard.io.kineto.match import check_matches, match_collectives
    from laggard.optable.ops import Job, make_table

    sizes = np.array([len(r.step) for r in ranks], dtype=np.int64)
    if sizes.sum() == 0:
        raise LaggardError(f"{files[0] if len(files) == 1 else files[0].parent}: "
                           "no op inside a ProfilerStep#N window to analyze")
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank_of = np.repeat(np.array([int(r.rank) for r in ranks], dtype=np.int64), sizes)  # type: ignore[arg-type]
    cat = np.concatenate
    kind = cat([r.kind for r in ranks]).astype(np.int64)
    peer = cat([r.peer for r in ranks])
    (name_c, names), (stream_c, streams), (group_c, groups) = _labels(ranks, layout, kind, peer, rank_of)
    step = cat([r.step for r in ranks])
    start_ns = cat([r.start_ns for r in ranks])
    dur_ns = cat([r.dur_ns for r in ranks])
    size_b = cat([r.size_bytes for r in ranks])
    n = len(step)
    if (dur_ns < 0).any():
        raise LaggardError(f"{int((dur_ns < 0).sum())} event(s) with negative durations in the traces")

    seq, matched_by = match_collectives(group_c, groups, cat([r.meta_seq for r in ranks]), start_ns, step, rank_of,
                                        size_b)
    # (a transfer's two ends are a send and a receive: only collectives must agree on their type)
    p2p = np.isin(kind, (KIND_SEND, KIND_RECV))
    check_matches(np.where(p2p, -1, group_c), seq, step, name_c, names, groups, rank_of)
    p2p_counts = _p2p_counts(p2p, name_c, names, group_c, seq, step, kind, peers_matched)
    domains, offsets_ns = _clock_offsets(ranks, sizes, group_c, seq, step, start_ns + dur_ns, align_clocks)
    start_ns = start_ns - np.round(np.repeat(offsets_ns[domains], sizes)).astype(np.int64)

    deps = _deps_column(ranks, offs, n)
    import pyarrow as pa

    columns: dict[str, Any] = {
        **_worker_columns(ranks, layout, sizes, rank_of),
        "step": step,
        "name": _dict_column(name_c, names, "name"),
        "kind": _dict_column(kind, list(KIND_LABELS), "kind"),
        "stream": _dict_column(stream_c, streams, "stream"),
        "start_ns": start_ns,
        "dur_ns": dur_ns,
        "group": _dict_column(group_c, groups, "group"),
        "seq": np.where(group_c >= 0, seq, -1),
        "peer": peer.astype(np.int32),
        "size_bytes": pa.array(size_b, mask=size_b < 0, type=pa.int64()),
        "deps": deps,
    }
    table = make_table(columns, num_rows=n)
    off_by_rank = {str(int(r.rank)): float(offsets_ns[domains[i]] / 1e9) for i, r in enumerate(ranks)}  # type: ignore[arg-type]
    meta = _job_meta(ranks, files, layout, matched_by, clock_offsets_s=off_by_rank, num_domains=len(offsets_ns))
    meta.extra["p2p"] = p2p_counts
    return Job(table=table, meta=meta)


def _labels(ranks: list[RankOps], layout: Layout, kind: np.ndarray, peer: np.ndarray, rank_of: np.ndarray
            ) -> tuple[tuple[np.ndarray, list[str]], ...]:
    """Every op's name, stream and group as codes into labels shared by all ranks; pipelines and CPU
    ranks name compute segments by phase (``_phase_names``), pipelines name transfers by direction
    (``_transfer_names``) and collectives without a process-group name by stage."""
    from laggard.io.kineto.match import unnamed_by_stage

    name_c, names = _relabel(ranks, "name", "names")
    if layout.pp_size > 1 or all(r.device == "cpu" for r in ranks):  # segments cut by phase (rank.build_rank)
        name_c, names = _phase_names(name_c, names, np.concatenate([r.phase for r in ranks]))
    if layout.pp_size > 1:
        name_c, names = _transfer_names(name_c, names, kind, peer, rank_of, layout)
    stream_c, streams = _relabel(ranks, "stream", "streams")
    group_c, groups = _relabel(ranks, "group", "groups")
    if layout.pp_size > 1:
        group_c, groups = unnamed_by_stage(group_c, groups, kind, rank_of,
                                           {int(r): c[1] for r, c in layout.coords.items()})
    return (name_c, names), (stream_c, streams), (group_c, groups)


def _relabel(ranks: list[RankOps], codes_attr: str, labels_attr: str) -> tuple[np.ndarray, list[str]]:
    """Each rank's codes (``codes_attr``, into its own ``labels_attr``; -1: none) as codes into the
    labels of all ranks, in order of first appearance."""
    labels: dict[str, int] = {}
    parts = []
    for r in ranks:
        lab = getattr(r, labels_attr)
        lut = np.array([labels.setdefault(x, len(labels)) for x in lab] + [-1], dtype=np.int64)
        parts.append(lut[getattr(r, codes_attr)])
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), list(labels)


def _clock_offsets(ranks: list[RankOps], sizes: np.ndarray, group_c: np.ndarray, seq: np.ndarray, step: np.ndarray,
                   end_ns: np.ndarray, align_clocks: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's clock domain (ranks on one host share one) and each domain's offset in ns, from the
    collectives' end times (all zero without ``align_clocks`` or with one domain)."""
    from laggard.io.kineto.match import clock_domains, clock_offsets

    domains = clock_domains(ranks)
    offsets_ns = np.zeros(int(domains.max()) + 1 if len(domains) else 1, np.float64)
    if align_clocks and len(offsets_ns) > 1:
        offsets_ns = clock_offsets(np.repeat(domains, sizes), group_c, seq, step, end_ns, len(offsets_ns))
    return domains, offsets_ns


def _p2p_counts(p2p: np.ndarray, name_c: np.ndarray, names: list[str], group_c: np.ndarray, seq: np.ndarray,
                step: np.ndarray, kind: np.ndarray, peers_matched: int) -> dict[str, int]:
    """Point-to-point ops (transfer ends: ``p2p``, and unlabelled send/recv events): how many are
    paired with their other end (a send and a receive sharing (step, group, seq)), how many are
    not, and how many of the paired ones the trace named no peer for (matched by order, counts
    and timing)."""
    from laggard.io.kineto.p2p import p2p_kind

    named = np.array([p2p_kind(x) is not None for x in names] + [False])[name_c]
    is_p2p = p2p | (named & (group_c < 0))
    rows = np.flatnonzero(p2p & (group_c >= 0))
    matched = 0
    if len(rows):
        key = np.stack([step[rows], group_c[rows], seq[rows]], axis=1)
        _, inv, cnt = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        sends = np.bincount(inv, weights=kind[rows] == KIND_SEND, minlength=len(cnt))
        matched = int(((cnt == 2) & (sends == 1))[inv].sum())
    total = int(is_p2p.sum())
    return {"ops": total, "matched": matched, "unmatched": total - matched, "peers_inferred": int(peers_matched)}


def _worker_columns(ranks: list[RankOps], layout: Layout, sizes: np.ndarray, rank_of: np.ndarray) -> dict[str, Any]:
    """What each op's rank tells: its worker coordinates, and the microbatch and sequences of its
    passes (``seq_lens`` only where some pass has them)."""
    n = len(rank_of)
    coord = np.array([layout.coords[int(r.rank)] for r in ranks], dtype=np.int32).reshape(-1, 3)  # type: ignore[arg-type]
    coord_of = np.repeat(coord, sizes, axis=0)
    out: dict[str, Any] = {
        "rank": rank_of.astype(np.int32),
        "dp_rank": coord_of[:, 0],
        "pp_rank": coord_of[:, 1],
        "tp_rank": coord_of[:, 2] if layout.tp_size > 1 else np.full(n, -1, np.int32),
        "microbatch": np.concatenate([r.microbatch for r in ranks]),
    }
    seq_lens = _seq_lens_column(np.concatenate([r.seq_count for r in ranks]),
                                np.concatenate([r.seq_tokens for r in ranks]))
    if seq_lens is not None:
        out["seq_lens"] = seq_lens
    return out


def _seq_lens_column(count: np.ndarray, tokens: np.ndarray) -> Any:
    """``seq_lens`` of the passes whose attention calls were recorded (``count`` sequences of
    ``tokens`` each, laggard.io.kineto.sequences); None when no op has them."""
    import pyarrow as pa

    known = (count > 0) & (tokens > 0)
    if not known.any():
        return None
    per = np.where(known, count, 0).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(per)]).astype(np.int32)
    values = np.repeat(tokens[known].astype(np.int32), per[known])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()),
                                    mask=pa.array(~known))


def _deps_column(ranks: list[RankOps], offs: np.ndarray, n: int) -> Any:
    """Every rank's dependency lists (local indices) as one list column of op ids (null: no list)."""
    import pyarrow as pa

    cat = np.concatenate
    owner = cat([offs[i] + np.repeat(np.arange(len(r.step)), np.diff(r.dep_ptr)) for i, r in enumerate(ranks)])
    dep_vals = cat([offs[i] + r.dep_idx for i, r in enumerate(ranks)])
    has = cat([r.has_deps for r in ranks])
    counts = np.bincount(owner, minlength=n) if len(owner) else np.zeros(n, np.int64)
    order = np.argsort(owner, kind="stable")
    offsets = np.zeros(n + 1, np.int32 if len(dep_vals) < 2**31 else np.int64)
    np.cumsum(counts, out=offsets[1:])
    mask = ~has
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(dep_vals[order].astype(np.int64)), mask=pa.array(mask) if mask.any() else None
    )


def _job_meta(ranks: list[RankOps], files: list[Path], layout: Layout, matched_by: dict[str, str], *,
              clock_offsets_s: dict[str, float], num_domains: int) -> Any:
    """The job's metadata: layout, clock offsets, process groups, devices, decoding costs."""
    from laggard.io.kineto.segments import HOST_GAP_SHARE
    from laggard.optable.hosts import HOSTS_KEY, host_entry
    from laggard.optable.ops import HOST_GAP_CUT_KEY, JobMeta

    declared = next((r.world_size for r in ranks if r.world_size is not None), None)
    pg_info: dict[str, Any] = {}
    for r in ranks:
        for g, inf in r.group_info.items():
            pg_info.setdefault(g, {**inf, "matched_by": matched_by.get(g, "order in the step")})
    devices = sorted({r.device for r in ranks})
    hosts = [e for r in ranks for e in [host_entry(int(r.rank), **r.identity)] if e is not None]  # type: ignore[arg-type]
    if len(devices) > 1:
        cpu_only = [int(r.rank) for r in ranks if r.device == "cpu"]  # type: ignore[arg-type]
        warnings.warn(
            f"{len(cpu_only)} rank(s) have no GPU activity in their trace ({', '.join(map(str, cpu_only[:8]))}"
            f"{' ...' if len(cpu_only) > 8 else ''}): their ops are CPU ops and their collectives the CPU-side "
            "calls, timed differently from the other ranks' GPU kernels",
            LaggardWarning,
            stacklevel=4,
        )
    return JobMeta(
        name=_job_name(files),
        world_size=len(ranks),
        dp_size=layout.dp_size,
        pp_size=layout.pp_size,
        tp_size=layout.tp_size,
        source=f"kineto:{len(files)} file(s)",
        extra={
            "layout": layout.to_json(),
            "clock_offsets_s": clock_offsets_s,
            "clock_domains": num_domains,
            "declared_world_size": declared,
            "devices": devices,
            # CPU ranks: idle gaps over this share of a step were taken out of the compute segments
            # (segments.HOST_GAP_SHARE): a pause that long is host time here, never a longer op
            **({HOST_GAP_CUT_KEY: HOST_GAP_SHARE} if "cpu" in devices else {}),
            "collectives_from": sorted({r.coll_source for r in ranks if r.coll_source}),
            "process_groups": pg_info,
            "num_bytes": int(sum(r.num_bytes for r in ranks)),
            "num_events": int(sum(r.num_events for r in ranks)),
            "decode_cpu_s": float(sum(r.cpu_s for r in ranks)),
            "worker_cpu_s": float(sum(r.worker_cpu_s for r in ranks)),
            **({HOSTS_KEY: hosts} if hosts else {}),
        },
    )


def _dict_column(codes: np.ndarray, labels: list[str], column: str) -> Any:
    """Codes (-1: null) into ``labels`` as the op table's dictionary column: the labels that occur,
    sorted, as ``make_table`` would encode the strings themselves (without building them)."""
    import pyarrow as pa

    from laggard.optable.ops import OP_SCHEMA, numpy_dtype

    index_type = OP_SCHEMA.field(column).type.index_type
    valid = codes >= 0
    used = np.flatnonzero(np.bincount(codes[valid], minlength=len(labels)))
    text = np.array([labels[i] for i in used.tolist()], dtype=str)
    order = np.argsort(text, kind="stable")
    lut = np.zeros(max(len(labels), 1), np.int64)
    lut[used[order]] = np.arange(len(used))
    idx = np.where(valid, lut[np.where(valid, codes, 0)], 0).astype(numpy_dtype(index_type))
    return pa.DictionaryArray.from_arrays(
        pa.array(idx, mask=~valid if not valid.all() else None), pa.array(text[order].tolist(), type=pa.string())
    )


def _job_name(files: list[Path]) -> str:
    if len(files) == 1:
        return files[0].name.removesuffix(".gz").removesuffix(".json")
    parent = files[0].parent
    return parent.name or "kineto"


def _phase_names(name_c: np.ndarray, names: list[str], phase: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Pipeline layouts and CPU ranks: compute segments are named by their training phase and lane
    (``cpu-forward``, ``gpu-backward``, ...), not by their position among the step's collectives,
    which differs from stage to stage: the same phase on every stage is one op type, idealised
    to its mean over all stages (as the tracer's ``forward-compute`` is), so stage imbalance shows."""
    from laggard.io.kineto.segments import PHASES

    lane = [n.split("-compute#", 1)[0] if "-compute#" in n else None for n in names]
    out = list(names)
    lut: dict[str, int] = {n: i for i, n in enumerate(out)}
    new_c = name_c.copy()
    for k in range(1, len(PHASES)):
        rows = np.flatnonzero(phase == k)
        for code in np.unique(name_c[rows]).tolist():
            if lane[code] is None:
                continue
            label = f"{lane[code]}-{PHASES[k]}"
            if label not in lut:
                lut[label] = len(out)
                out.append(label)
            new_c[rows[name_c[rows] == code]] = lut[label]
    return new_c, out


def _transfer_names(name_c: np.ndarray, names: list[str], kind: np.ndarray, peer: np.ndarray, rank_of: np.ndarray,
                    layout: Layout) -> tuple[np.ndarray, list[str]]:
    """Pipeline layouts: point-to-point transfers are named by direction from the stages of their two
    ends (``forward-send``, ``forward-recv``, ``backward-send``, ``backward-recv``, the names laggard's
    tracer gives them). A stage's wait for the previous stage's activations (which holds the
    pipeline's fill) is then idealised among its kind only, not to the median of every transfer of
    the job, which would count the last stage's fill as its slowness. Transfers whose peer or its
    stage is unknown keep their name."""
    stage_of = {int(r): c[1] for r, c in layout.coords.items()}
    rows = np.flatnonzero(np.isin(kind, (KIND_SEND, KIND_RECV)) & (peer >= 0))
    if not len(rows):
        return name_c, names
    me = np.array([stage_of.get(int(r), -1) for r in rank_of[rows]])
    them = np.array([stage_of.get(int(r), -1) for r in peer[rows]])
    pp = layout.pp_size
    wrap = pp > 2  # interleaved schedules send the last stage's activations on to stage 0
    to_next = (me >= 0) & ((them == me + 1) | (wrap & (me == pp - 1) & (them == 0)))
    to_prev = (me >= 0) & ((them == me - 1) | (wrap & (me == 0) & (them == pp - 1))) & ~to_next
    send = kind[rows] == KIND_SEND
    direction = {"forward-send": send & to_next, "backward-send": send & to_prev,
                 "forward-recv": ~send & to_prev, "backward-recv": ~send & to_next}
    out = list(names)
    new_c = name_c.copy()
    for label, hit in direction.items():
        if hit.any():
            if label not in out:
                out.append(label)
            new_c[rows[hit]] = out.index(label)
    return new_c, out
