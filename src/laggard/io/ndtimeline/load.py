"""Importer for NDTimeline / Megatron-LM traces (the format published with the OSDI '25 what-if paper).

One Parquet row per op: ``dp_rank, stage, rank, step, optype, start_ts, duration`` (seconds,
``start_ts`` relative to the step), ``seq_id`` (index of the op among ops of its type in the step),
``mc`` (model chunk), ``gmc`` (global model chunk), ``mb_id`` (microbatch). A ``meta-*.yaml`` beside
the trace (or ``--meta``) gives the layout (see :mod:`laggard.io.ndtimeline.meta`).

Megatron runs one static schedule, so the dependencies of one pipeline instance (all stages of one
DP rank in one step) are derived once, from a reference instance, and replicated to every
(step, DP rank). The rules (1F1B, with virtual chunks):

* per worker a compute stream (forward/backward compute in observed order), one stream per p2p
  op type, and a DP-comm stream (params all-gather, grads reduce-scatter);
* a recv precedes the compute of its microbatch and follows the previous compute of its type;
  a send follows the compute that produced its data; the first backward send/recv cannot start
  before the second-to-last forward of the warm-up;
* the last params all-gather of a model chunk precedes that chunk's first forward;
* after the last compute: gc -> layernorm all-reduce -> embedding all-reduce -> grads
  reduce-scatters (or separate grads all-reduce when DP comm overlaps backward) -> clip -> optimizer;
* DP collectives join the DP ranks of one stage; p2p ops join adjacent stages of one DP rank;
  the embedding all-reduce joins the first and last stage; clip-main-grad joins every worker.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from laggard.errors import LaggardError, LaggardWarning
from laggard.io.ndtimeline.clean import invalid_times, unknown_optypes
from laggard.io.ndtimeline.meta import fmt_list, read_meta, resolve_layout
from laggard.io.ndtimeline.template import build_template
from laggard.optable.ops import (
    Job,
    JobMeta,
    make_table,
    to_numpy,
    unique_inverse,
    valid_mask,
)
from laggard.optable.template import template_columns

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")
def _read_table(path: Path) -> pa.Table:
    try:
        if path.stat().st_size == 0:
            raise LaggardError(f"{path}: empty file (0 bytes), not a Parquet trace")
        return pq.ParquetFile(path).read()
    except (OSError, pa.ArrowException) as e:
        raise LaggardError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None


def read_ndtimeline(path: Path, meta: Path | None = None) -> Job:
    table = _read_table(path)
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise LaggardError(f"{path}: not an NDTimeline trace: missing column(s) {', '.join(missing)}")
    if table.num_rows == 0:
        raise LaggardError(f"{path}: the trace has no ops")
    meta_obj, meta_path = read_meta(meta, path)
    where = str(path)

    a, labels, gmc_present = _read_columns(table, where)
    dp, stage, rank, step, seq, start, dur, mc, gmc, mb, codes = (
        a[k] for k in ("dp", "stage", "rank", "step", "seq", "start", "dur", "mc", "gmc", "mb", "codes")
    )
    keep, unknown_note = unknown_optypes(codes, labels, where)
    group = (dp * (int(stage.max()) + 1) + stage) * len(labels) + codes  # one per (worker, op type)
    keep = invalid_times(keep, group, step, start, dur, where)
    vpp_trace = int(mc[keep].max()) + 1
    lay = resolve_layout(meta_obj, meta_path, path, unique_inverse(dp[keep])[0], unique_inverse(stage[keep])[0],
                         vpp_trace)
    num_dp, num_pp, vpp = lay.num_dp, lay.num_pp, lay.vpp
    _check_workers(dp[keep], stage[keep], step[keep], num_dp, num_pp, where, meta_path)

    # Each (dp, stage) is one worker with one global rank.
    wid = dp * num_pp + stage
    w_rank = np.full(num_dp * num_pp, -1, dtype=np.int64)
    w_rank[wid[keep]] = rank[keep]
    if (w_rank[wid[keep]] != rank[keep]).any():
        raise LaggardError(f"{where}: a (dp_rank, stage) pair appears with more than one rank")
    if not gmc_present:
        gmc = mc * num_pp + stage

    if not keep.all():  # rows dropped (unknown op types, bad times)
        idx = np.nonzero(keep)[0]
        dp, stage, step, seq, start, dur, mc, gmc, mb, codes = (
            a[idx] for a in (dp, stage, step, seq, start, dur, mc, gmc, mb, codes)
        )
    steps, step_idx = unique_inverse(step)
    inst = step_idx * num_dp + dp  # one pipeline instance per (step, DP rank)

    n_codes = len(labels)
    max_seq = int(seq.max()) + 1
    key = (stage * n_codes + codes) * max_seq + seq
    ref_inst = _reference_instance(inst, key)
    sel = inst == ref_inst
    try:
        tpl = build_template(
            stage[sel], codes[sel], seq[sel], start[sel], start[sel] + dur[sel], mc[sel], gmc[sel], mb[sel],
            labels, num_pp, vpp, where,
        )
    except LaggardError as e:
        raise LaggardError(_with_note(str(e), unknown_note)) from None
    num_t = len(tpl.stage)

    t_of, good_row, good_steps = _match_instances(
        tpl, sel, key, inst, steps, codes, seq, n_codes, max_seq, num_dp, num_pp, where, unknown_note
    )
    n, start_ns, dur_ns = _lay_out(t_of, good_row, good_steps, step_idx, len(steps), dp, start, dur, num_dp, num_t)
    inst_step = steps[good_steps].repeat(num_dp)
    columns = template_columns(tpl, inst_step, num_dp, w_rank)
    columns["start_ns"] = start_ns
    columns["dur_ns"] = dur_ns
    out = make_table(columns, num_rows=n)
    job_meta = lay.job_meta(path)
    return Job(table=out, meta=job_meta)


def _check_workers(dp: np.ndarray, stage: np.ndarray, step: np.ndarray, num_dp: int,
                   num_pp: int, where: str, meta_path: Path | None) -> None:
    """Every (DP rank, stage) worker of the layout has ops: a pipeline without one of its workers
    cannot be replayed, so a worker missing from the whole trace is an error naming it."""
    have = np.zeros(num_dp * num_pp, dtype=bool)
    have[dp * num_pp + stage] = True
    if have.all():
        return
    gone = np.flatnonzero(~have)
    names = ", ".join(f"dp{w // num_pp}/pp{w % num_pp}" for w in gone[:8]) + (" ..." if len(gone) > 8 else "")
    source = f"{meta_path.name}" if meta_path is not None else "the trace's DP ranks and stages"
    raise LaggardError(
        f"{where}: worker(s) {names} have no ops in any of the {len(np.unique(step))} step(s), but the "
        f"layout dp={num_dp} x pp={num_pp} from {source} expects {num_dp * num_pp} workers "
        f"({int(have.sum())} found); a pipeline cannot be replayed without them"
    )


def _read_columns(table: pa.Table, where: str) -> tuple[dict[str, np.ndarray], list[str], bool]:
    """The trace's columns as arrays (checked: numbers, no nulls where required, no negative ids),
    the op-type labels and whether ``gmc`` was given."""
    def col(name: str, dtype, default=None) -> np.ndarray:
        if name not in table.column_names:
            return np.full(table.num_rows, default, dtype=dtype)
        c = table.column(name)
        if c.null_count and default is None:
            raise LaggardError(f"{where}: column {name} has {c.null_count} null value(s)")
        if not (pa.types.is_integer(c.type) or pa.types.is_floating(c.type)):
            raise LaggardError(f"{where}: column {name} has type {c.type}, expected numbers")
        arr = np.asarray(to_numpy(c))
        if c.null_count:
            valid = valid_mask(c)
            arr = np.where(valid, arr, default)
        # Arrow's buffer itself where the type matches (read-only: nothing here writes to a column),
        # not a copy: each fresh array's pages are faulted in (~0.7 ms a column of trace-AR)
        return arr.astype(dtype, copy=False)

    dp = col("dp_rank", np.int64)
    stage = col("stage", np.int64)
    rank = col("rank", np.int64)
    step = col("step", np.int64)
    seq = col("seq_id", np.int64)
    start = col("start_ts", np.float64, np.nan)
    dur = col("duration", np.float64, np.nan)
    mc = col("mc", np.int64, 0)
    gmc_present = "gmc" in table.column_names
    gmc = col("gmc", np.int64, -1)
    mb = col("mb_id", np.int64, -1)
    optype = table.column("optype")
    if optype.null_count:
        raise LaggardError(f"{where}: column optype has {optype.null_count} null value(s)")
    if pa.types.is_dictionary(optype.type):
        codes_i, labels = Job(table=pa.table({"o": optype}), meta=JobMeta()).codes("o")
        codes = codes_i.astype(np.int64)
        labels = [str(x) for x in labels]
    elif pa.types.is_string(optype.type) or pa.types.is_large_string(optype.type):
        labels_a, codes = np.unique(np.asarray(to_numpy(optype), dtype=object).astype(str), return_inverse=True)
        labels = labels_a.tolist()
    else:
        raise LaggardError(f"{where}: column optype has type {optype.type}, expected strings")
    for name, arr in (("dp_rank", dp), ("stage", stage), ("rank", rank), ("seq_id", seq)):
        if (arr < 0).any():
            raise LaggardError(f"{where}: column {name} has negative values")

    arrays = {"dp": dp, "stage": stage, "rank": rank, "step": step, "seq": seq, "start": start, "dur": dur,
              "mc": mc, "gmc": gmc, "mb": mb, "codes": codes}
    return arrays, labels, gmc_present


def _reference_instance(inst: np.ndarray, key: np.ndarray) -> int:
    """The first pipeline instance whose op set is the most common op set."""
    span = int(key.max()) + 1 if len(key) else 1
    if (int(inst.max()) + 1 if len(inst) else 1) * span < 2**62:  # one int64 key: one stable sort, not two
        order = np.argsort(inst * span + key, kind="stable")
    else:
        order = np.lexsort((key, inst))
    inst_sorted = inst[order]
    bounds = np.flatnonzero(np.diff(inst_sorted)) + 1
    starts_ = np.concatenate([[0], bounds])
    # signature of an instance: (op count, sum and xor-ish hash of its keys)
    h = (key[order] * 0x9E3779B1) % (2**31 - 1)
    sig = np.stack(
        [np.diff(np.append(starts_, len(order))), np.add.reduceat(key[order], starts_),
         np.add.reduceat(h * h % 1000003, starts_)],
        axis=1,
    )
    # one 64-bit hash per instance (wrapping arithmetic is fine for telling op sets apart)
    sig64 = sig.astype(np.uint64)
    flat = (sig64[:, 0] * np.uint64(0x9E3779B97F4A7C15) + sig64[:, 1]) * np.uint64(0xBF58476D1CE4E5B9) + sig64[:, 2]
    uniq, inv, cnt = np.unique(flat, return_inverse=True, return_counts=True)
    common = int(np.argmax(cnt))
    ref_pos = int(np.flatnonzero(inv.ravel() == common)[0])
    ref_inst = int(inst_sorted[starts_[ref_pos]])
    return ref_inst


def _match_instances(tpl, sel, key, inst, steps, codes, seq, n_codes, max_seq, num_dp, num_pp, where, note=""):
    """Every op's template op (-1: none), and the steps whose every instance matches the template
    exactly (the others are skipped with a warning)."""
    num_steps, num_t = len(steps), len(tpl.stage)
    # Map every op to its template op; instances that do not match the template exactly are dropped.
    lut = np.full(num_pp * n_codes * max_seq, -1, dtype=np.int64)
    lut[(tpl.stage * n_codes + codes[sel]) * max_seq + seq[sel]] = np.arange(num_t)
    t_of = lut[key]
    num_inst = num_steps * num_dp
    good_row = t_of >= 0
    counts = np.bincount(inst[good_row] * num_t + t_of[good_row], minlength=num_inst * num_t).reshape(num_inst, num_t)
    extra = np.bincount(inst[~good_row], minlength=num_inst)
    bad_inst = (counts != 1).any(axis=1) | (extra > 0)
    if bad_inst.any():
        bad_steps_idx = np.unique(np.flatnonzero(bad_inst) // num_dp)
        first = int(np.flatnonzero(bad_inst)[0])
        c0 = counts[first]
        n_ops_have = int((c0 > 0).sum())
        missing_workers = sorted(
            {
                (int(first % num_dp), int(s))
                for s in range(num_pp)
                if not (c0[tpl.stage == s] > 0).any()
            }
        )
        detail = (
            f"worker dp{missing_workers[0][0]}/pp{missing_workers[0][1]} has no ops in step {steps[first // num_dp]}"
            if missing_workers
            else f"DP rank {first % num_dp} has {n_ops_have} of the schedule's {num_t} ops"
            + (f" and {int(extra[first])} extra" if extra[first] else "")
            + f" in step {steps[first // num_dp]}"
        )
        if len(bad_steps_idx) == num_steps:
            raise LaggardError(_with_note(
                f"{where}: no complete step left to analyze: all {num_steps} step(s) have ops that do not match the "
                f"pipeline schedule (missing or extra ops; e.g. {detail})", note))
        warnings.warn(
            f"{where}: skipped {len(bad_steps_idx)} of {num_steps} step(s) whose ops do not match the "
            f"pipeline schedule (missing or extra ops; e.g. {detail}): steps {fmt_list(steps[bad_steps_idx])}",
            LaggardWarning,
            stacklevel=3,
        )
        good_steps = np.setdiff1d(np.arange(num_steps), bad_steps_idx)
    else:
        good_steps = np.arange(num_steps)

    return t_of, good_row, good_steps


def _with_note(msg: str, note: str) -> str:
    """An error about the schedule, with the unknown op types skipped before it (the likely cause)."""
    return f"{msg}; {note}, which may be why" if note else msg


def _lay_out(t_of, good_row, good_steps, step_idx, num_steps, dp, start, dur, num_dp, num_t):
    """Order the kept ops as (instance, template op) and put the steps end to end on one clock."""
    # Keep good instances, renumbered densely in (step, dp) order; op index = inst * T + t.
    new_step = np.full(num_steps, -1, dtype=np.int64)
    new_step[good_steps] = np.arange(len(good_steps))
    row_ok = good_row & (new_step[step_idx] >= 0)
    new_inst = new_step[step_idx[row_ok]] * num_dp + dp[row_ok]
    pos = new_inst * num_t + t_of[row_ok]
    n_inst = len(good_steps) * num_dp
    n = n_inst * num_t
    perm = np.empty(n, dtype=np.int64)
    perm[pos] = np.flatnonzero(row_ok)

    # Lay the steps end to end on one clock (the trace's times are step-relative).
    o_step_idx = step_idx[perm]
    o_start = start[perm]
    o_end = o_start + dur[perm]
    k = len(good_steps)
    o_new_step = new_step[o_step_idx]
    smin = np.full(k, np.inf)
    smax = np.full(k, -np.inf)
    np.minimum.at(smin, o_new_step, o_start)
    np.maximum.at(smax, o_new_step, o_end)
    span = smax - smin
    offset = np.concatenate([[0.0], np.cumsum(span[:-1])]) - smin
    start_ns = np.round((o_start + offset[o_new_step]) * 1e9).astype(np.int64)
    dur_ns = np.round(dur[perm] * 1e9).astype(np.int64)

    return n, start_ns, dur_ns
