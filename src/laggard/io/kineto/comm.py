"""One rank's collectives in a Kineto trace: which events they are and what they say about themselves.

On GPU ranks the collectives are the NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``); on
CPU-only ranks the gloo events (``gloo:*``), else the CPU side of NCCL calls (``nccl:*``), else the
``record_param_comms`` calls. Their metadata (collective name, process group name, description and
ranks, message size, sequence number, p2p source and destination) comes from the event itself
(newer traces) or from the ``record_param_comms`` call that launched it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from laggard.io.kineto.events import RankEvents

NCCL_KERNEL = re.compile(r"^(ncclKernel|ncclDevKernel)_?([A-Za-z]*)")
_NO_META: dict[str, Any] = {}
# op kind codes (KIND_LABELS in kineto_rank): collective, p2p send, p2p receive
KIND_COLL, KIND_SEND, KIND_RECV = 1, 2, 3


@functools.lru_cache(maxsize=4096)
def coll_type(name: str) -> str:
    """'allreduce', '_allgather_base', 'AllReduce', 'all_to_allv' -> all_reduce, all_gather, ..."""
    k = re.sub(r"[^a-z]", "", name.lower())
    for key, out in (
        ("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter"), ("allgather", "all_gather"),
        ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"), ("sendrecv", "send_recv"),
        ("send", "send"), ("recv", "recv"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
    ):
        if key in k:
            return out
    return k or "collective"


@dataclass(kw_only=True, slots=True)
class Collectives:
    """The collectives of one rank (``idx``: their event indices) and their metadata, aligned."""

    idx: np.ndarray  # event indices
    name: list[str]  # "<backend>:<type>"
    group: list[str]  # process group name, "p2p:<src>><dst>", or "" (not matched across ranks)
    seq: np.ndarray  # int64, -1 when the trace has no sequence number
    size_bytes: np.ndarray  # int64, -1 unknown
    peer: np.ndarray  # int64, -1
    kind: np.ndarray  # int8: KIND_COLL, KIND_SEND, KIND_RECV
    group_info: dict[str, dict[str, Any]]
    source: str  # what the collectives were read from (for the job metadata)
    # when each was issued (us): a transfer's c10d call start (a gloo:send event can begin ms into its
    # c10d::send call), else its own start: a CPU transfer's op starts there (rank._issued)
    issue_us: np.ndarray | None = None

    def subset(self, keep: np.ndarray) -> Collectives:
        k = keep.tolist()
        return Collectives(
            idx=self.idx[keep], name=[c for c, x in zip(self.name, k, strict=True) if x],
            group=[c for c, x in zip(self.group, k, strict=True) if x], seq=self.seq[keep],
            size_bytes=self.size_bytes[keep], peer=self.peer[keep], kind=self.kind[keep], group_info=self.group_info,
            source=self.source, issue_us=None if self.issue_us is None else self.issue_us[keep],
        )


def select_collectives(
    ev: RankEvents, *, device: str, cpu: np.ndarray, gpu: np.ndarray, is_name: dict[str, np.ndarray]
) -> tuple[np.ndarray, str, str]:
    """(event indices, backend, source description) of the rank's collectives."""
    nm = ev.name
    if device == "gpu":
        coll = np.flatnonzero(gpu & is_name["nccl_kernel"][nm])
        if len(coll) or not (cpu & is_name["gloo"][nm]).any():
            return coll, "nccl", "NCCL kernels"
        # a GPU rank whose collectives run on the host (gloo on CUDA tensors, or on host copies)
    coll = np.flatnonzero(cpu & is_name["gloo"][nm])
    if len(coll):
        return coll, "gloo", "gloo events"
    coll = np.flatnonzero(cpu & is_name["nccl_cpu"][nm])
    if len(coll):
        return coll, "nccl", "CPU-side NCCL calls (nccl:*; no GPU activity in the trace)"
    return (np.flatnonzero(is_name["rpc"][nm] & cpu), "comm",
            "record_param_comms calls (no GPU activity in the trace)")


def read_collectives(
    ev: RankEvents, coll: np.ndarray, *, backend: str, source: str, device: str, holder: np.ndarray,
    rpc: np.ndarray, pg_config: list[dict[str, Any]], warns: list[str], c10d: np.ndarray | None = None,
    c10d_holder: np.ndarray | None = None, rank: int | None = None,
) -> Collectives:
    """Each collective's metadata: its own, else that of the ``record_param_comms`` call holding its
    launch (``holder``: index into ``rpc``, -1 none)."""
    names, nm = ev.names, ev.name
    default_pg = str(pg_config[0].get("pg_name")) if len(pg_config) == 1 else None
    num_coll = len(coll)
    c_name: list[str] = []
    c_group: list[str] = []
    c_seq, c_size, c_peer, c_kind = [-1] * num_coll, [-1] * num_coll, [-1] * num_coll, [KIND_COLL] * num_coll
    group_info: dict[str, dict[str, Any]] = {}
    no_pg = 0
    unpaired_p2p = 0
    meta, rpc_l = ev.meta, rpc.tolist()
    type_of_name: dict[int, str] = {}  # name code -> collective type read from the name
    c10d_l = c10d.tolist() if c10d is not None else []
    c10d_h = c10d_holder.tolist() if c10d_holder is not None else [-1] * num_coll
    for i, (e, h, code) in enumerate(zip(coll.tolist(), holder.tolist(), nm[coll].tolist(), strict=True)):
        # one iteration per collective, not per event: its metadata, else its launcher's
        own = meta.get(e)
        launcher = meta.get(rpc_l[h]) if h >= 0 else None
        m = ({**launcher, **own} if own else launcher) if launcher else (own or _NO_META)
        if "coll" in m:
            ctype = coll_type(m["coll"])
        else:
            ctype = type_of_name.get(code, "")
            if not ctype:
                ctype = _type_from_name(names[code], device if backend == "nccl" else "cpu")
                type_of_name[code] = ctype
        c_name.append(f"{backend}:{ctype}")
        pg = m.get("pg_name", default_pg)
        if pg is None:
            no_pg += 1
            pg = "?"
        if pg not in group_info:
            group_info[pg] = _group_info(m, pg, pg_config)
        grp = pg
        if ctype in ("send", "recv"):
            src, dst = m.get("src"), m.get("dst")
            if not (isinstance(src, int) and isinstance(dst, int)) and c10d_h[i] >= 0 and rank is not None:
                src, dst = _c10d_ends(meta.get(c10d_l[c10d_h[i]], _NO_META), ctype, rank, group_info[pg]["ranks"])
            if isinstance(src, int) and isinstance(dst, int) and src >= 0 and dst >= 0:
                grp = f"p2p:{src}>{dst}"
                c_kind[i] = KIND_SEND if ctype == "send" else KIND_RECV
                c_peer[i] = dst if ctype == "send" else src
            else:  # matched across ranks by order, counts and timing, or named then (kineto/p2p.py)
                grp = ""
        elif ctype == "send_recv":
            unpaired_p2p += 1
            grp = ""
        c_group.append(grp)
        if "seq" in m:
            c_seq[i] = m["seq"]
        if "size_bytes" in m:
            c_size[i] = m["size_bytes"]
    if no_pg and num_coll:
        warns.append(
            f"{ev.path}: {no_pg} of {num_coll} collective(s) carry no process-group name; they are matched across "
            "ranks by their order among the rank's collectives"
        )
    if unpaired_p2p:
        warns.append(f"{ev.path}: {unpaired_p2p} combined send/recv transfer(s) without source/destination ranks are "
                     "not matched across ranks")
    return Collectives(
        idx=coll, name=c_name, group=c_group, seq=np.array(c_seq, np.int64), size_bytes=np.array(c_size, np.int64),
        peer=np.array(c_peer, np.int64), kind=np.array(c_kind, np.int8), group_info=group_info,
        source=source if num_coll else "",
    )


def _c10d_ends(m: dict[str, Any], ctype: str, rank: int, pg_ranks: list[int] | None) -> tuple[int | None, int | None]:
    """(src, dst) global ranks of a p2p transfer from its c10d call's peer (a rank in its group)."""
    peer = m.get("c10d_peer")
    if peer is None:
        return None, None
    if pg_ranks:  # the peer is numbered within the group
        if peer >= len(pg_ranks):
            return None, None
        peer = int(pg_ranks[peer])
    return (rank, peer) if ctype == "send" else (peer, rank)


def _type_from_name(raw: str, device: str) -> str:
    if device == "gpu":
        km = NCCL_KERNEL.match(raw)
        return coll_type(km.group(2) if km and km.group(2) else "collective")
    return coll_type(raw.split(":", 1)[-1])


def _group_info(m: dict[str, Any], pg: str, pg_config: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = m.get("pg_ranks")
    if ranks is None:
        ranks = next((p.get("ranks") for p in pg_config if str(p.get("pg_name")) == pg), None)
    desc = m.get("pg_desc") or next((p.get("pg_desc") for p in pg_config if str(p.get("pg_name")) == pg), None)
    return {"desc": desc, "ranks": ranks}
