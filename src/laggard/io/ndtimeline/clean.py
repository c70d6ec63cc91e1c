"""Which rows of an NDTimeline trace can be replayed: unknown op types and invalid times.

An op of a type the Megatron dependency model does not know is dropped (warned, with its count).
An op with a NaN/inf start or duration, or a negative duration, cannot be placed: its whole step
is skipped, since DP collectives tie the ranks of a step together. When that would leave too few
steps (a few bad ops spread over every step), ops whose start is valid get the median duration of
their worker and op type instead, and only the steps of ops that cannot be filled are skipped.
Every choice is warned with its counts; nothing left is an error with the counts.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from laggard.errors import LaggardError, LaggardWarning
from laggard.io.ndtimeline.meta import fmt_list
from laggard.io.ndtimeline.template import OPTYPES


@dataclass(kw_only=True, slots=True, frozen=True)
class CleanConfig:
    # Skip the steps with bad times while at least this share of the steps stays: whole steps are
    # exact. Below it the bad durations are filled in instead: half the steps is where a user would
    # rather have every step, approximately, than a biased sample of the clean ones.
    min_kept_step_share: float = 0.5


DEFAULT_CLEAN = CleanConfig()


def unknown_optypes(codes: np.ndarray, labels: list[str], where: str) -> tuple[np.ndarray, str]:
    """Rows of a known op type, and a note naming the skipped types with their counts ('' if none)."""
    keep = np.ones(len(codes), dtype=bool)
    counts = np.bincount(codes, minlength=len(labels))
    unknown = {lab: int(counts[i]) for i, lab in enumerate(labels) if lab not in OPTYPES and counts[i]}
    if not unknown:
        return keep, ""
    keep &= ~np.isin(codes, [labels.index(u) for u in unknown])
    note = (f"skipped {sum(unknown.values())} of {len(codes)} op(s) of unknown type(s) "
            + ", ".join(f"{u!r} ({c})" for u, c in unknown.items()) + " (not in the Megatron dependency model)")
    if not keep.any():
        raise LaggardError(f"{where}: no op of a known type: {note}; known types: {', '.join(OPTYPES)}")
    warnings.warn(f"{where}: {note}", LaggardWarning, stacklevel=3)
    return keep, note


def invalid_times(keep: np.ndarray, group: np.ndarray, step: np.ndarray, start: np.ndarray, dur: np.ndarray,
                  where: str, cfg: CleanConfig = DEFAULT_CLEAN) -> np.ndarray:
    """Rows to keep after bad times (``dur`` is filled in place where that is the choice);
    ``group`` is one id per (worker, op type): the ops a filled duration is the median of."""
    bad_start = ~np.isfinite(start) & keep
    bad_dur = (~np.isfinite(dur) | (dur < 0)) & keep & ~bad_start
    bad = bad_start | bad_dur
    if not bad.any():
        return keep
    num_ops, num_steps = int(keep.sum()), len(np.unique(step[keep]))
    why = _why(bad_start, bad_dur, dur)
    poisoned = np.unique(step[bad])
    if num_steps - len(poisoned) >= cfg.min_kept_step_share * num_steps:
        warnings.warn(
            f"{where}: skipped {len(poisoned)} of {num_steps} step(s) with {why} ({int(bad.sum())} of {num_ops} "
            f"op(s)): steps {fmt_list(poisoned)}",
            LaggardWarning, stacklevel=3)
        return keep & ~np.isin(step, poisoned)
    filled = _fill_durations(bad_dur, keep & ~bad, group, dur)
    unfilled = bad & ~filled
    skip = np.unique(step[unfilled])
    left = num_steps - len(skip)
    if left == 0:
        raise LaggardError(
            f"{where}: no step left: {int(bad.sum())} of {num_ops} op(s) have {why}, in {len(poisoned)} of {num_steps} "
            f"step(s), and {int(unfilled.sum())} of them cannot be filled in (a bad start, or no valid op of "
            "their worker and op type)")
    msg = (f"{where}: {int(bad.sum())} of {num_ops} op(s) have {why}, in {len(poisoned)} of {num_steps} step(s): "
           f"filled in the duration of {int(filled.sum())} op(s) with the median of their worker and op type")
    if len(skip):
        msg += (f"; skipped {len(skip)} step(s) whose {int(unfilled.sum())} bad op(s) cannot be filled: "
                f"steps {fmt_list(skip)}")
    warnings.warn(msg, LaggardWarning, stacklevel=3)
    return keep & ~np.isin(step, skip)


def _why(bad_start: np.ndarray, bad_dur: np.ndarray, dur: np.ndarray) -> str:
    parts = []
    if bad_start.any() or (bad_dur & ~np.isfinite(dur)).any():
        parts.append("NaN/inf times")
    if (bad_dur & np.isfinite(dur)).any():
        parts.append("negative durations")
    return " and ".join(parts)


def _fill_durations(bad_dur: np.ndarray, good: np.ndarray, group: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Set each bad duration to the median of the valid ops of its group; returns the rows filled."""
    filled = np.zeros(len(dur), dtype=bool)
    rows = np.flatnonzero(bad_dur)
    if not len(rows):
        return filled
    order = np.flatnonzero(good)
    order = order[np.lexsort((dur[order], group[order]))]
    g_sorted = group[order]
    for g in np.unique(group[rows]):
        lo, hi = np.searchsorted(g_sorted, [g, g + 1])
        if hi == lo:
            continue
        med = float(np.median(dur[order[lo:hi]]))
        these = rows[group[rows] == g]
        dur[these] = med
        filled[these] = True
    return filled
