"""Custom what-ifs: replay the measured job with chosen ops fixed (idealised), zeroed, scaled,
set to their peers' value, evened out or despiked.

``laggard whatif --fix/--zero/--scale/--peer/--even/--despike SELECTOR``; selectors name ops by
stage, DP rank, rank, peer, worker, op type, kind or step (see ``select_ops``); ``A,B`` names the
ops both name. Every finding of the diagnosis is one of these what-ifs (``Finding.whatif``), so its
gain is a number a user can reproduce.

- ``fix``: the op's ideal duration (mean per compute op type, median per communication op type);
- ``peer``: the mean of the same op (its op type, and how many of that type its rank ran before it in
  the step) on its stage over the ops no ``--peer`` selects, in the same step (over every step where
  that step has none): a slow worker made as fast as the other workers of its stage were in each step;
- ``even``: the mean of the selected ops of its op type, stage and step (balanced microbatches);
  stalls (``laggard.engine.spikes``) stay out of the mean and keep their excess (a GC pause is not a long
  sequence's);
- ``despike``: ops far above what they should take set to it (``laggard.engine.spikes``: the median of
  their rank and op type; for a forward pass, its own backward's time times the rank's median
  forward/backward ratio): rare stalls such as garbage collections.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from laggard.engine.baseline import Baseline, prepare
from laggard.engine.replay import replay_steps
from laggard.engine.sameop import nth_in_group
from laggard.engine.spikes import group_mean
from laggard.errors import LaggardError
from laggard.optable.ops import Job
from laggard.results.diagnosis import finite as _num

_SELECTOR = re.compile(r"^(?P<key>[a-z_]+)(?P<neg>!?)=(?P<val>.+)$")


@dataclass(kw_only=True, slots=True)
class Change:
    action: str  # fix | zero | scale | peer | even | despike
    selector: str
    factor: float = 1.0

    def args(self) -> list[str]:
        """The command-line flags that make this change."""
        if self.action == "scale":
            return ["--scale", f"{self.selector}:{self.factor:.6g}"]
        return [f"--{self.action}", self.selector]


ACTIONS = ("fix", "zero", "scale", "peer", "even", "despike")


def parse_changes(fix: list[str], zero: list[str], scale: list[str], *, peer: list[str] | None = None,
                  even: list[str] | None = None, despike: list[str] | None = None) -> list[Change]:
    changes = [Change(action="fix", selector=s) for s in fix]
    changes += [Change(action="zero", selector=s) for s in zero]
    changes += [Change(action="peer", selector=s) for s in peer or []]
    changes += [Change(action="even", selector=s) for s in even or []]
    changes += [Change(action="despike", selector=s) for s in despike or []]
    for s in scale:
        sel, sep, fac = s.rpartition(":")
        if not sep:
            raise LaggardError(f"--scale {s!r}: expected SELECTOR:FACTOR, e.g. stage=3:0.8")
        try:
            f = float(fac)
        except ValueError:
            raise LaggardError(f"--scale {s!r}: factor {fac!r} is not a number") from None
        if not math.isfinite(f) or f < 0:
            raise LaggardError(f"--scale {s!r}: factor must be a finite number >= 0")
        changes.append(Change(action="scale", selector=sel, factor=f))
    if not changes:
        raise LaggardError("nothing to change: give at least one --fix, --zero, --scale, --peer, --even or --despike")
    for c in changes:
        _check_selector(c.selector)
    return changes


def _check_selector(sel: str) -> None:
    if "," in sel:  # an intersection: rank=2,kind=host
        for part in sel.split(","):
            _check_selector(part)
        return
    if sel in ("all", "comm", "compute"):
        return
    m = _SELECTOR.match(sel)
    keys = ("stage", "pp", "dp", "rank", "peer", "worker", "optype", "name", "kind", "step")
    if not m or m.group("key") not in keys:
        raise LaggardError(
            f"selector {sel!r} not understood (use all, comm, compute, or one of "
            + ", ".join(f"{k}=..." for k in keys)
            + ")"
        )


def select_ops(base: Baseline, sel: str) -> np.ndarray:
    """Boolean mask of the ops a selector names (``A,B``: the ops both name)."""
    n = base.graph.num_ops
    if "," in sel:
        mask = np.ones(n, dtype=bool)
        for part in sel.split(","):
            mask &= select_ops(base, part)
        if not mask.any():
            raise LaggardError(f"selector {sel!r} matches no op in the trace")
        return mask
    if sel == "all":
        return np.ones(n, dtype=bool)
    if sel in ("comm", "compute"):
        comm = base.is_comm()
        return comm if sel == "comm" else ~comm
    m = _SELECTOR.match(sel)
    assert m is not None
    mask = _select_one(base, sel, m.group("key"), m.group("val"))
    if m.group("neg"):  # rank!=2: every op the positive selector does not name
        mask = ~mask
    if not mask.any():
        raise LaggardError(f"selector {sel!r} matches no op in the trace")
    return mask


def _select_one(base: Baseline, sel: str, key: str, val: str) -> np.ndarray:
    """Mask of ``key=val`` (may be empty: the caller says so)."""

    def as_int(v: str) -> int:
        try:
            return int(v)
        except ValueError:
            raise LaggardError(f"selector {sel!r}: {v!r} is not an integer") from None

    if key in ("stage", "pp"):
        mask = base.pp_rank == as_int(val)
    elif key == "dp":
        mask = base.dp_rank == as_int(val)
    elif key == "rank":
        mask = base.rank == as_int(val)
    elif key == "peer":
        mask = base.job.column("peer") == as_int(val)
    elif key == "step":  # step=N, or step=A-B: the steps A to B, both included
        step = base.job.column("step")
        lo, dash, hi = val.partition("-")
        mask = (step >= as_int(lo)) & (step <= as_int(hi)) if dash and lo else step == as_int(val)
    elif key == "worker":
        wm = re.fullmatch(r"dp(\d+):pp(\d+)", val)
        if not wm:
            raise LaggardError(f"selector {sel!r}: expected worker=dpD:ppP, e.g. worker=dp0:pp1")
        mask = (base.dp_rank == int(wm.group(1))) & (base.pp_rank == int(wm.group(2)))
    elif key == "kind":
        if val not in base.kinds:
            raise LaggardError(f"selector {sel!r}: no op of kind {val!r} (the trace has {', '.join(base.kinds)})")
        mask = base.kind_code == base.kinds.index(val)
    else:  # optype / name: an op type or an attribution type
        if val in base.names:
            mask = base.name_code == base.names.index(val)
        elif val in base.attr_names:
            mask = base.attr_code == base.attr_names.index(val)
        else:
            raise LaggardError(
                f"selector {sel!r}: no op type {val!r} in the trace "
                f"(it has {', '.join(sorted(set(base.names) | set(base.attr_names)))})"
            )
    return mask


@dataclass(kw_only=True, slots=True)
class WhatIfResult:
    changes: list[str]
    T_s: float
    T_new_s: float
    T_ideal_s: float
    speedup: float
    num_ops_changed: int
    per_step_new_s: dict[int, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "changes": self.changes,
            "T_s": _num(self.T_s),
            "T_new_s": _num(self.T_new_s),
            "T_ideal_s": _num(self.T_ideal_s),
            "speedup": _num(self.speedup),
            "num_ops_changed": self.num_ops_changed,
            "per_step_new_s": {str(k): _num(v) for k, v in self.per_step_new_s.items()},
        }


def apply_changes(base: Baseline, changes: list[Change]) -> tuple[np.ndarray, np.ndarray]:
    """The measured durations with ``changes`` applied in order; returns (weights, changed mask)."""
    w = base.measured.copy()
    changed = np.zeros(len(w), dtype=bool)
    masks = [select_ops(base, c.selector) for c in changes]
    peers = np.zeros(len(w), dtype=bool)
    for c, mask in zip(changes, masks, strict=True):
        if c.action == "peer":
            peers |= mask
    peer_ref = None  # the stage means --peer sets: they read only non-peer ops, which only other actions write
    for c, mask in zip(changes, masks, strict=True):
        changed |= mask
        if c.action != "peer":
            peer_ref = None
        if c.action == "fix":
            w[mask] = base.ideal[mask]
        elif c.action == "zero":
            w[mask] = 0.0
        elif c.action == "scale":
            w[mask] = w[mask] * c.factor
        elif c.action == "peer":
            if peer_ref is None:
                peer_ref = _peer_means(base, w, ~peers)
            ref, ok = peer_ref
            sel = mask & ok
            w[sel] = ref[sel]
        elif c.action == "even":
            # a stall (laggard.engine.spikes: a forward far over its own backward) is not the data's: out of
            # the mean, and its excess kept (without a partner, a long microbatch looks the same)
            # (judged on the measured times: an earlier --even may have evened out the backward)
            hit, expect = _spikes_of(base, base.measured, mask, paired_only=True)
            ref, ok = group_mean(w, mask & ~hit, [base.graph.op_step, base.pp_rank, base.name_code])
            sel = mask & ok
            w[sel] = ref[sel] + np.where(hit[sel], np.maximum(w[sel] - expect[sel], 0.0), 0.0)  # (0 once despiked)
        else:  # despike
            hit, expect = _spikes_of(base, w, mask)
            w[hit] = expect[hit]
    return w, changed


def _peer_means(base: Baseline, w: np.ndarray, ref_ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per op, the mean of its op type on its stage over ``ref_ops`` in the same step, or over every
    step where its step has none (and whether it has either). Step by step, because what a rank's peers
    take moves from step to step (warm-up, a step the whole host ran slow): against the pooled mean, a
    straggler that is slow in half the steps would be made slower in its good ones, and its fix would
    read as no gain. The same op on each peer (``occurrence``), not its op type's mean."""
    nth = occurrence(base)
    ref, ok = group_mean(w, ref_ops, [base.graph.op_step, base.name_code, base.pp_rank, nth])
    pooled, pooled_ok = group_mean(w, ref_ops, [base.name_code, base.pp_rank, nth])
    return np.where(ok, ref, pooled), ok | pooled_ok


def occurrence(base: Baseline) -> np.ndarray:
    """Per op, how many ops of its op type its rank ran before it in its step (0 for the first): the
    same op on another rank. One op type can name ops of very different lengths (the backward before
    the gradients' all-reduce and the short rest after it), and a peer's mean over all of them would
    give the short one the long one's time."""
    return nth_in_group(base.rank, base.graph.op_step, base.name_code, start=base.job.column("start_ns"))


def _spikes_of(base: Baseline, w: np.ndarray, mask: np.ndarray, *,
               paired_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Spikes among ``mask`` (``laggard.engine.spikes``: a forward judged against its own backward; with
    ``paired_only``, only those) and every op's expected time."""
    from laggard.engine.spikes import fwd_bwd_partner, spikes

    compute = np.asarray(base.kinds, dtype=object)[base.kind_code] == "compute" if len(base.kinds) else \
        np.zeros(len(w), dtype=bool)
    mb = base.job.column("microbatch").astype(np.int64)
    partner = fwd_bwd_partner(base.names, base.name_code, compute, base.rank, base.graph.op_step, mb)
    key = base.rank * (len(base.names) + 1) + base.name_code
    if paired_only:
        mask = mask & (partner >= 0)
    return spikes(w, key, mask, partner=partner)


def custom_whatif(job: Job, changes: list[Change], *, gap_share: float | None = None) -> WhatIfResult:
    """Replay the measured job with ``changes`` applied in order; compare with the measured replay.
    ``gap_share``: model untraced host gaps as host ops from this share of a step on (0: every gap;
    default: ``GapConfig``'s)."""
    base = prepare(job, gap_config(gap_share))
    w, changed = apply_changes(base, changes)
    weights = np.stack([base.measured, w, base.ideal], axis=1)
    st = replay_steps(base.graph, weights)
    T, T_new, T_ideal = (float(x) for x in st.mean(axis=0))
    return WhatIfResult(
        changes=[f"{c.action} {c.selector}" + (f" x{c.factor:g}" if c.action == "scale" else "") for c in changes],
        T_s=T,
        T_new_s=T_new,
        T_ideal_s=T_ideal,
        speedup=T / T_new if T_new > 0 else float("inf"),
        num_ops_changed=int(changed.sum()),
        per_step_new_s=dict(zip(base.graph.steps.tolist(), st[:, 1].tolist(), strict=True)),
    )


def whatif_command(load_args: dict[str, Any], flags: list[str], command: str = "whatif") -> str:
    """The `laggard whatif` (or another ``command``'s) command line that loads the trace as it was
    loaded and applies ``flags`` (``TRACE`` for a job that was not read from files)."""
    import shlex

    parts = ["laggard", command] + [shlex.quote(p) for p in load_args.get("paths") or ["TRACE"]]
    keys = (("--format", "fmt"), ("--meta", "meta"), ("--steps", "steps"), ("--layout", "layout"),
            ("--rank-map", "rank_map"))
    if command == "partition":  # reads NDTimeline and native traces: no profiler layout flags
        keys = keys[:3]
    for flag, key in keys:
        v = load_args.get(key)
        if v is not None and not (key == "fmt" and _implied_format(load_args, v)):
            parts += [flag, shlex.quote(str(v))]
    return " ".join(parts + [shlex.quote(f) for f in flags])


def _implied_format(load_args: dict[str, Any], fmt: str) -> bool:
    """Whether ``--format fmt`` says nothing the path does not (auto, or what auto would find)."""
    from laggard.io import detect_format

    paths = load_args.get("paths") or []
    if fmt == "auto":
        return True
    if len(paths) != 1:
        return False
    try:
        return detect_format(Path(paths[0])) == fmt
    except LaggardError:
        return False


def gap_config(gap_share: float | None):  # -> GapConfig | None
    if gap_share is None:
        return None
    from laggard.engine.gaps import GapConfig

    if not (math.isfinite(gap_share) and 0.0 <= gap_share <= 1.0):
        raise LaggardError(f"--gap-share must be a number from 0 to 1 (got {gap_share})")
    return GapConfig(min_share_of_step=gap_share)


__all__ = ["ACTIONS", "Change", "WhatIfResult", "apply_changes", "custom_whatif", "parse_changes", "select_ops",
           "whatif_command"]
