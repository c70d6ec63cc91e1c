"""Importer for NDTimeline / Megatron-LM traces (the format published with the OSDI '25 what-if paper).

One Parquet row per op: ``dp_rank, stage, rank, step, optype, start_ts, duration`` (seconds,
``start_ts`` relative to the step), ``seq_id`` (index of the op among ops of its type in the step),
``mc`` (model chunk), ``gmc`` (global model chunk), ``mb_id`` (microbatch). A ``meta-*.yaml`` beside
the trace (or ``--meta``) gives the layout (see :mod:`laggard.io.ndtimeline_meta`).

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

from laggard.io.ndtimeline_meta import fmt_list, read_meta, resolve_layout
from laggard.io.template import Template, template_columns
from laggard.ops import Job, JobMeta, LaggardError, LaggardWarning, make_table, to_numpy, valid_mask

FWD, BWD = "forward-compute", "backward-compute"
AG, RS, SEP = "params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce"
LN, EMB, CLIP, OPT, GC = (
    "layernorm-grads-all-reduce",
    "embedding-grads-all-reduce",
    "optimizer-clip-main-grad",
    "optimizer",
    "gc",
)
P2P = ("forward-send", "forward-recv", "backward-send", "backward-recv")

# op type -> (kind, stream)
OPTYPES: dict[str, tuple[str, str]] = {
    FWD: ("compute", "compute"),
    BWD: ("compute", "compute"),
    OPT: ("compute", "compute"),
    GC: ("other", "compute"),
    "forward-send": ("p2p_send", "pp-forward-send"),
    "forward-recv": ("p2p_recv", "pp-forward-recv"),
    "backward-send": ("p2p_send", "pp-backward-send"),
    "backward-recv": ("p2p_recv", "pp-backward-recv"),
    AG: ("collective", "dp-comm"),
    RS: ("collective", "dp-comm"),
    SEP: ("collective", "dp-comm"),
    LN: ("collective", "mp-comm"),
    EMB: ("collective", "mp-comm"),
    CLIP: ("collective", "mp-comm"),
}
REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")
# Tolerance on timestamps when deciding whether a p2p op belongs to a compute (clock skew), seconds.
_EPS_S = 5e-5


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
        return arr.astype(dtype)

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

    keep = np.ones(table.num_rows, dtype=bool)
    unknown = [lab for lab in labels if lab not in OPTYPES]
    if unknown:
        bad = np.isin(codes, [labels.index(u) for u in unknown])
        counts = {u: int((codes == labels.index(u)).sum()) for u in unknown}
        counts = {u: c for u, c in counts.items() if c}
        if counts:
            warnings.warn(
                f"{where}: skipped {int(bad.sum())} op(s) of unknown type(s) "
                + ", ".join(f"{u!r} ({c})" for u, c in counts.items())
                + " (not in the Megatron dependency model)",
                LaggardWarning,
                stacklevel=2,
            )
        keep &= ~bad
    if not keep.any():
        raise LaggardError(f"{where}: no op of a known type (known: {', '.join(OPTYPES)})")

    # Bad timings poison their whole step (DP collectives tie the ranks of a step together).
    bad_time = ~np.isfinite(start) | ~np.isfinite(dur) | (dur < 0)
    bad_time &= keep
    if bad_time.any():
        bad_steps = np.unique(step[bad_time])
        why = []
        if (~np.isfinite(dur) & keep).any() or (~np.isfinite(start) & keep).any():
            why.append("NaN/inf times")
        if ((dur < 0) & keep).any():
            why.append("negative durations")
        warnings.warn(
            f"{where}: skipped {len(bad_steps)} step(s) with {' and '.join(why)} "
            f"({int(bad_time.sum())} op(s)): steps {fmt_list(bad_steps)}",
            LaggardWarning,
            stacklevel=2,
        )
        keep &= ~np.isin(step, bad_steps)
    if not keep.any():
        raise LaggardError(f"{where}: no step left after skipping ops with invalid times")

    vpp_trace = int(mc[keep].max()) + 1
    lay = resolve_layout(meta_obj, meta_path, path, np.unique(dp[keep]), np.unique(stage[keep]), vpp_trace)
    num_dp, num_pp, vpp = lay.num_dp, lay.num_pp, lay.vpp

    # Each (dp, stage) is one worker with one global rank.
    wid = dp * num_pp + stage
    w_rank = np.full(num_dp * num_pp, -1, dtype=np.int64)
    w_rank[wid[keep]] = rank[keep]
    if (w_rank[wid[keep]] != rank[keep]).any():
        raise LaggardError(f"{where}: a (dp_rank, stage) pair appears with more than one rank")
    if not gmc_present:
        gmc = mc * num_pp + stage

    idx = np.nonzero(keep)[0]
    dp, stage, step, seq, start, dur, mc, gmc, mb, codes = (
        a[idx] for a in (dp, stage, step, seq, start, dur, mc, gmc, mb, codes)
    )
    steps, step_idx = np.unique(step, return_inverse=True)
    num_steps = len(steps)
    inst = step_idx * num_dp + dp  # one pipeline instance per (step, DP rank)

    # Pick the reference instance: the first one whose op set is the most common op set.
    n_codes = len(labels)
    max_seq = int(seq.max()) + 1
    key = (stage * n_codes + codes) * max_seq + seq
    order = np.lexsort((key, inst))
    inst_sorted = inst[order]
    bounds = np.flatnonzero(np.diff(inst_sorted)) + 1
    starts_ = np.concatenate([[0], bounds])
    # signature of an instance: (op count, sum and xor-ish hash of its keys)
    h = (key[order] * 0x9E3779B1) % (2**31 - 1)
    sig = np.stack(
        [np.diff(np.append(starts_, len(order))), np.add.reduceat(key[order], starts_), np.add.reduceat(h * h % 1000003, starts_)],
        axis=1,
    )
    # one 64-bit hash per instance (wrapping arithmetic is fine for telling op sets apart)
    sig64 = sig.astype(np.uint64)
    flat = (sig64[:, 0] * np.uint64(0x9E3779B97F4A7C15) + sig64[:, 1]) * np.uint64(0xBF58476D1CE4E5B9) + sig64[:, 2]
    uniq, inv, cnt = np.unique(flat, return_inverse=True, return_counts=True)
    common = int(np.argmax(cnt))
    ref_pos = int(np.flatnonzero(inv.ravel() == common)[0])
    ref_inst = int(inst_sorted[starts_[ref_pos]])
    sel = inst == ref_inst
    tpl = _build_template(
        stage[sel], codes[sel], seq[sel], start[sel], start[sel] + dur[sel], mc[sel], gmc[sel], mb[sel],
        labels, num_pp, vpp, where,
    )
    num_t = len(tpl.stage)

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
        warnings.warn(
            f"{where}: skipped {len(bad_steps_idx)} of {num_steps} step(s) whose ops do not match the "
            f"pipeline schedule (missing or extra ops; e.g. {detail}): steps {fmt_list(steps[bad_steps_idx])}",
            LaggardWarning,
            stacklevel=2,
        )
        if len(bad_steps_idx) == num_steps:
            raise LaggardError(f"{where}: no complete step left to analyse")
        good_steps = np.setdiff1d(np.arange(num_steps), bad_steps_idx)
    else:
        good_steps = np.arange(num_steps)

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

    inst_step = steps[good_steps].repeat(num_dp)
    columns = template_columns(tpl, inst_step, num_dp, w_rank)
    columns["start_ns"] = start_ns
    columns["dur_ns"] = dur_ns
    out = make_table(columns, num_rows=n)
    job_meta = lay.job_meta(path)
    return Job(table=out, meta=job_meta)


def _build_template(stage, code, seq, start, end, mc, gmc, mb, labels, num_pp, vpp, where) -> Template:
    """Derive the dependency model of one pipeline instance from its observed op order."""
    num_t = len(stage)
    name = [labels[c] for c in code]
    at: dict[tuple[int, str, int], int] = {}
    for t in range(num_t):
        k = (int(stage[t]), name[t], int(seq[t]))
        if k in at:
            raise LaggardError(f"{where}: op {name[t]} seq_id {seq[t]} appears twice on stage {stage[t]} in one step")
        at[k] = t
    deps: list[list[int]] = [[] for _ in range(num_t)]
    scope: list[str | None] = [None] * num_t
    label: list[str | None] = [None] * num_t
    gseq = [-1] * num_t
    peer_stage = [-1] * num_t
    micro = mb.astype(np.int64).copy()

    def sort_key(t: int):
        return (start[t], seq[t], name[t])

    def chain(ts: list[int]) -> None:
        for a, b in zip(ts, ts[1:], strict=False):
            deps[b].append(a)

    has_sep = SEP in name
    total_chunks = vpp * num_pp
    for s in range(num_pp):
        mine = [t for t in range(num_t) if stage[t] == s]
        comp = sorted((t for t in mine if name[t] in (FWD, BWD)), key=sort_key)
        if not comp:
            raise LaggardError(f"{where}: stage {s} has no forward/backward compute ops in the reference step")
        chain(comp)
        # p2p: match each send/recv to its compute, then pair the two ends across stages.
        valid_p2p: dict[str, list[int]] = {}
        for direction in ("forward", "backward"):
            cname = f"{direction}-compute"
            comps = [t for t in comp if name[t] == cname]
            if not comps:
                continue
            last_start = max(start[t] for t in comps)
            first_end = min(end[t] for t in comps)
            for kind in ("send", "recv"):
                oname = f"{direction}-{kind}"
                ops_k = sorted((t for t in mine if name[t] == oname), key=sort_key)
                chain(ops_k)  # one stream per p2p op type
                if kind == "recv":
                    valid = [t for t in ops_k if start[t] <= last_start + _EPS_S]
                else:
                    valid = [t for t in ops_k if end[t] >= first_end - _EPS_S]
                cid = 0
                if len(valid) != len(comps):
                    if s not in (0, num_pp - 1) or not (len(valid) == 0 or len(valid) + 1 == len(comps)):
                        raise LaggardError(
                            f"{where}: stage {s} has {len(valid)} {oname} op(s) for {len(comps)} {cname} op(s)"
                        )
                    if kind == "recv" and len(valid) + 1 == len(comps):
                        cid = 1
                real = []
                for t in valid:
                    c = at.get((s, cname, cid))
                    if c is None:
                        raise LaggardError(f"{where}: stage {s}: no {cname} with seq_id {cid} for {oname} {seq[t]}")
                    delta = 1 if (direction == "forward") == (kind == "send") else -1
                    peer_chunk = int(gmc[c]) + delta
                    micro[t] = mb[c]
                    if kind == "send":
                        deps[t].append(c)
                    else:
                        deps[c].append(t)
                        prev = at.get((s, cname, cid - 1))
                        if prev is not None:
                            deps[t].append(prev)
                    if 0 <= peer_chunk < total_chunks:
                        real.append(t)
                    cid += 1
                valid_p2p[oname] = real
        for oname, real in valid_p2p.items():
            direction, kind = oname.split("-")
            fwd = direction == "forward"
            if kind == "send":
                src, dst = s, (s + (1 if fwd else -1)) % num_pp
            else:
                src, dst = (s - (1 if fwd else -1)) % num_pp, s
            for k, t in enumerate(real):
                scope[t], label[t], gseq[t] = "local", f"p2p-{direction}:pp{src}>pp{dst}", k
                peer_stage[t] = dst if kind == "send" else src
        # the first backward send/recv waits for the second-to-last warm-up forward
        first_bwd = next((i for i, t in enumerate(comp) if name[t] == BWD), None)
        if first_bwd is not None and first_bwd >= 2:
            anchor = comp[first_bwd - 2]
            for oname in ("backward-recv", "backward-send"):
                t0 = at.get((s, oname, 0))
                if t0 is not None:
                    deps[t0].append(anchor)
        # DP communication stream and its links to compute
        dpc = sorted((t for t in mine if name[t] in (AG, RS)), key=sort_key)
        chain(dpc)
        for t in mine:
            if name[t] in (AG, RS, SEP):
                scope[t], label[t], gseq[t] = "dp", f"dp:pp{s}:{name[t]}", int(seq[t])
        ags = sorted((t for t in mine if name[t] == AG), key=lambda t: seq[t])
        done: set[int] = set()
        for t in reversed(ags):
            if mc[t] in done:
                continue
            fw = [c for c in comp if name[c] == FWD and mc[c] == mc[t]]
            if fw:
                deps[min(fw, key=lambda c: start[c])].append(t)
            done.add(int(mc[t]))
        rss = sorted((t for t in mine if name[t] == RS), key=lambda t: seq[t])
        if has_sep:
            done = set()
            for t in rss:
                if mc[t] in done:
                    continue
                bw = [c for c in comp if name[c] == BWD and mc[c] == mc[t]]
                if bw:
                    deps[t].append(max(bw, key=lambda c: end[c]))
                done.add(int(mc[t]))
        # the tail: gc -> layernorm -> embedding -> (grads sync) -> clip -> optimizer
        last_compute = max(comp, key=lambda t: end[t])
        gc_t = at.get((s, GC, 0))
        if gc_t is not None:
            deps[gc_t].append(last_compute)
        head = [gc_t if gc_t is not None else last_compute]
        emb = [at.get((s, EMB, 0))] if s in (0, num_pp - 1) else []
        if has_sep:
            if rss:
                head.append(rss[-1])
            tail = [at.get((s, LN, 0)), *emb, at.get((s, SEP, 0)), at.get((s, CLIP, 0)), at.get((s, OPT, 0))]
        else:
            tail = [at.get((s, LN, 0)), *emb, *rss, at.get((s, CLIP, 0)), at.get((s, OPT, 0))]
        tail = [t for t in tail if t is not None]
        if tail:
            deps[tail[0]].extend(head)
            chain(tail)
        emb_t = at.get((s, EMB, 0))
        if emb_t is not None and s in (0, num_pp - 1):
            scope[emb_t], label[emb_t], gseq[emb_t] = "local", "embedding", 0
        clip_t = at.get((s, CLIP, 0))
        if clip_t is not None:
            scope[clip_t], label[clip_t], gseq[clip_t] = "world", f"world:{CLIP}", 0
    deps = [sorted(set(d)) for d in deps]
    return Template(
        stage=np.asarray(stage, dtype=np.int64),
        name=name,
        kind=[OPTYPES[x][0] for x in name],
        stream=[OPTYPES[x][1] for x in name],
        microbatch=micro,
        vchunk=np.asarray(mc, dtype=np.int64),
        deps=deps,
        scope=scope,
        label=label,
        gseq=gseq,
        peer_stage=peer_stage,
    )
