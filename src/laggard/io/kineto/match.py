"""Profiler traces across ranks: which collectives are the same collective, and the ranks' clocks.

Collectives are matched by process group and sequence number, or, without sequence numbers, by
their order within the process group in each step (split by payload size where the ranks
disagree); a collective ends at the same moment on all its ranks, so its end times give each
clock domain's offset.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from laggard.errors import LaggardWarning
from laggard.io.kineto.comm import KIND_RECV, KIND_SEND

if TYPE_CHECKING:
    from laggard.io.kineto.rank import RankOps


def match_collectives(group_c: np.ndarray, groups: list[str], meta_seq: np.ndarray, start_ns: np.ndarray,
                      step: np.ndarray, rank_of: np.ndarray, size_b: np.ndarray) -> tuple[np.ndarray, dict[str, str]]:
    """Each collective's sequence number within its group (-1: not a collective) and, per group,
    how it was matched; ``group_c`` and ``groups`` gain a group per payload size where needed."""
    seq = np.full(len(step), -1, np.int64)
    coll = np.flatnonzero(group_c >= 0)
    matched_by: dict[str, str] = {}
    # one iteration per process group, and per group a size split appends (renumbered by order)
    for g, label in enumerate(groups):
        rows = coll[group_c[coll] == g]
        if (meta_seq[rows] >= 0).all():
            seq[rows] = meta_seq[rows]
            matched_by[label] = "sequence number"
            continue
        o = rows[np.lexsort((start_ns[rows], step[rows], rank_of[rows]))]
        new = np.ones(len(o), bool)
        new[1:] = (rank_of[o][1:] != rank_of[o][:-1]) | (step[o][1:] != step[o][:-1])
        first = np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
        seq[o] = np.arange(len(o)) - first
        matched_by[label] = "order in the step"
        _split_by_size(o, label, group_c, groups, seq, step, size_b, matched_by)
    return seq, matched_by


def unnamed_by_stage(group_c: np.ndarray, groups: list[str], kind: np.ndarray, rank_of: np.ndarray,
                     stage_of: dict[int, int]) -> tuple[np.ndarray, list[str]]:
    """Pipeline layouts: collectives with no process-group name (``?``: gloo's events carry none) are
    matched among the ranks of one stage (``?|stage<s>``), not across the job. A pipeline's collectives
    are its stages' gradient all-reduces over their DP replicas: each stage runs its own at its own
    time (the last stage's backward ends first), and matched across stages by order one stage's would
    wait for another's, which under 1F1B waits for the first, and the graph has a cycle."""
    if "?" not in groups:
        return group_c, groups
    unnamed = groups.index("?")
    rows = np.flatnonzero((group_c == unnamed) & ~np.isin(kind, (KIND_SEND, KIND_RECV)))
    if not len(rows):
        return group_c, groups
    stage = np.array([stage_of.get(int(r), -1) for r in rank_of[rows]])
    out, new_c = list(groups), group_c.copy()
    for s in np.unique(stage[stage >= 0]).tolist():
        out.append(f"?|stage{s}")
        new_c[rows[stage == s]] = len(out) - 1
    return new_c, out


def _split_by_size(o, label, group_c, groups, seq, step, size_b, matched_by) -> None:
    """Collectives matched by order whose participants disagree on the payload size are different
    collectives (e.g. gloo events, which carry no process group, of the per-stage gradient
    all-reduces): each size becomes its own group (``<group>|<size>B``)."""
    known = o[size_b[o] >= 0]
    if len(known) < 2:
        return
    key = np.stack([step[known], seq[known]], axis=1)
    _, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    pairs = np.unique(np.stack([inv, size_b[known]], axis=1), axis=0)
    mixed = np.flatnonzero(np.bincount(pairs[:, 0]) > 1)
    if not len(mixed):
        return
    rows = known[np.isin(inv, mixed)]
    for size in np.unique(size_b[rows]).tolist():
        new_label = f"{label}|{size}B"
        if new_label not in groups:
            groups.append(new_label)
            matched_by[new_label] = "order in the step and payload size"
        group_c[rows[size_b[rows] == size]] = groups.index(new_label)


def _instances(group_c: np.ndarray, seq: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The collectives' rows sorted by (step, group, seq), and each one's instance number (the
    rows of one collective on its ranks share it)."""
    coll = np.flatnonzero(group_c >= 0)
    o = coll[np.lexsort((seq[coll], group_c[coll], step[coll]))]
    new = np.ones(len(o), bool)
    new[1:] = (step[o][1:] != step[o][:-1]) | (group_c[o][1:] != group_c[o][:-1]) | (seq[o][1:] != seq[o][:-1])
    return o, np.cumsum(new) - 1


def check_matches(group_c, seq, step, name_c, names, groups, rank_of) -> None:
    """Collectives paired across ranks should be of one type; say so when they are not."""
    o, gid = _instances(group_c, seq, step)
    if len(o) == 0:
        return
    first = np.flatnonzero(np.diff(gid, prepend=-1))
    bad = name_c[o] != name_c[o][first[gid]]
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        g = int(gid[i])
        warnings.warn(
            f"{len(np.unique(gid[bad]))} matched collective(s) differ in type across ranks "
            f"(e.g. step {int(step[o][i])}, group {groups[int(group_c[o][i])]!r} #{int(seq[o][i])}: "
            f"{names[int(name_c[o][first[g]])]} on rank {int(rank_of[o][first[g]])}, {names[int(name_c[o][i])]} on "
            f"rank {int(rank_of[o][i])}); the ranks may not run the same collectives",
            LaggardWarning,
            stacklevel=4,
        )


def clock_domains(ranks: list[RankOps]) -> np.ndarray:
    """Each rank's clock domain (0..k-1): ranks on one host (same ``host_name`` and
    ``baseTimeNanoseconds``) share a clock; a rank without a host name is its own domain."""
    key = [(r.host, r.base_ns) if r.host else (None, i) for i, r in enumerate(ranks)]
    labels = {k: i for i, k in enumerate(dict.fromkeys(key))}
    return np.array([labels[k] for k in key], dtype=np.int64)


def _end_matrix(op_dom, group_c, seq, step, end_ns, num_dom: int) -> np.ndarray | None:
    """Mean end time (ns, from the earliest) per (collective joining 2+ domains, domain), NaN where
    the domain has no rank in it; None when there is no collective at all."""
    o, inst = _instances(group_c, seq, step)
    if len(o) == 0:
        return None
    num_inst = int(inst[-1]) + 1
    e = (end_ns[o] - float(end_ns[o].min())).astype(np.float64)
    cell = inst * num_dom + op_dom[o]
    tot = np.bincount(cell, weights=e, minlength=num_inst * num_dom)
    cnt = np.bincount(cell, minlength=num_inst * num_dom)
    E = np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan).reshape(num_inst, num_dom)
    return E[np.sum(~np.isnan(E), axis=1) >= 2]


def clock_spread(op_dom, group_c, seq, step, end_ns, off: np.ndarray) -> np.ndarray:
    """Per clock domain: the median distance (ns) of its collective ends from the fit with offsets
    ``off`` (0 for a domain no collective joins to another): how far its offset may be off."""
    E = _end_matrix(op_dom, group_c, seq, step, end_ns, len(off))
    if E is None or len(E) == 0:
        return np.zeros(len(off))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        R = E - off[None, :] - np.nanmedian(E - off[None, :], axis=1)[:, None]
        out = np.nanmedian(np.abs(R), axis=0)
    return np.where(np.isnan(out), 0.0, out)


def clock_offsets(op_dom, group_c, seq, step, end_ns, num_dom: int) -> np.ndarray:
    """Per clock domain: its offset (ns) from domain 0, from collective end times.

    A collective ends at the same moment on all its ranks, so ``end = T_c + offset_d + noise``.
    Two-way median fit (alternating medians over collectives and domains).
    """
    E = _end_matrix(op_dom, group_c, seq, step, end_ns, num_dom)
    if E is None:
        warnings.warn("no collective to align the ranks' clocks with; the traces' own clocks are used",
                      LaggardWarning, stacklevel=4)
        return np.zeros(num_dom)
    if len(E) == 0:
        warnings.warn("no collective joins ranks of different hosts; their clocks are not aligned",
                      LaggardWarning, stacklevel=4)
        return np.zeros(num_dom)
    off = np.zeros(num_dom)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices for unconnected domains
        for _ in range(20):
            T = np.nanmedian(E - off[None, :], axis=1)
            new_off = np.nanmedian(E - T[:, None], axis=0)
            new_off = np.where(np.isnan(new_off), 0.0, new_off)
            new_off -= new_off[0]
            if np.allclose(new_off, off, atol=1.0):
                off = new_off
                break
            off = new_off
    unlinked = np.flatnonzero(np.sum(~np.isnan(E), axis=0) == 0)
    if len(unlinked):
        warnings.warn(
            f"{len(unlinked)} host(s) share no collective with the others; their clocks are not aligned",
            LaggardWarning,
            stacklevel=4,
        )
    return off


__all__ = ["check_matches", "clock_domains", "clock_offsets", "clock_spread", "match_collectives", "unnamed_by_stage"]
