"""``sequence-imbalance``: microbatch times vary within a step, forward and backward of the same
microbatch together (and follow the sum of squared sequence lengths when the trace has them)."""

from __future__ import annotations

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, compact, weights_of
from laggard.diagnose.findings import Candidate
from laggard.results.diagnosis import Finding
from laggard.whatif.custom import Change


def detect(ctx: Ctx, cfg: DiagnoseConfig, slow_workers: list[int] | None = None) -> list[Candidate]:
    fm = ctx.fwd & (ctx.mb >= 0)
    bm = ctx.bwd & (ctx.mb >= 0)
    if fm.sum() < cfg.seq_min_ops or bm.sum() < cfg.seq_min_ops:
        return []
    kf, kb = ctx.microbatch_keys(fm), ctx.microbatch_keys(bm)
    common, i_f, i_b = np.intersect1d(kf, kb, return_indices=True)
    if len(common) < cfg.seq_min_ops:
        return []
    f = ctx.w[fm][i_f]
    b = ctx.w[bm][i_b]
    rs = common // (int(ctx.mb.max()) + 2)  # (rank, step)
    _, inv = np.unique(rs, return_inverse=True)
    cnt = np.bincount(inv)
    fmean = (np.bincount(inv, weights=f) / cnt)[inv]
    bmean = (np.bincount(inv, weights=b) / cnt)[inv]
    rf, rb = f / np.maximum(fmean, 1e-12) - 1, b / np.maximum(bmean, 1e-12) - 1
    spread = float(np.std(rf))
    if spread < cfg.seq_spread or np.std(rb) == 0 or np.std(rf) == 0:
        return []
    # rank correlation: a few forwards stalled by a GC pause (tens of ms, backward untouched) must
    # not hide how every other microbatch's forward and backward move together
    corr = float(np.corrcoef(_ranks(rf), _ranks(rb))[0, 1])
    fit = fit_seq_cost(ctx, fm)
    if fit is not None and fit < cfg.seq_min_r2:
        return []  # the trace has the lengths and they do not explain the times: something else moves them
    if corr < cfg.seq_corr and (fit is None or fit < cfg.seq_fit_alone_r2):
        return []
    evidence = (
        f"microbatch times vary within steps (spread {100 * spread:.0f}%), forward and backward of the same "
        f"microbatch {'together' if corr >= cfg.seq_corr else 'less so'} (correlation {corr:.2f})"
    )
    if fit is not None:
        evidence += f"; forward time follows a*sum(len^2) + b*sum(len) (R^2={fit:.2f})"
    # balanced: every microbatch of a stage costs the step's mean
    comp = ctx.fwd | ctx.bwd
    ref, _ = ctx.group_mean(comp, [ctx.step, ctx.pp, ctx.name])
    changes = _balance(ctx, [ctx.names[int(c)] for c in np.unique(ctx.name[comp])], slow_workers or [])
    hot_steps = np.unique(ctx.step[fm][np.abs(ctx.w[fm] / np.maximum(ref[fm], 1e-12) - 1) > 2 * spread])
    finding = Finding(
        cause="sequence-imbalance",
        steps=[int(ctx.base.graph.steps[s]) for s in hot_steps[:12]],
        evidence=evidence,
        fix=(
            "balance sequences across microbatches and DP ranks by attention cost: "
            "`laggard.mitigate.balance(lengths, num_bins, method='wlb')` "
            "(with `laggard fit-cost TRACE` for the cost model)"
        ),
    )
    return [Candidate(finding=finding, changes=changes, weights=weights_of(ctx, changes))]


def _balance(ctx: Ctx, optypes: list[str], slow_workers: list[int]) -> list[Change]:
    """``--even`` per op type over the stage's DP replicas, the slow workers (``worker``) balanced
    on their own: evened out with the others, a slow GPU's excess would be spread over its stage's
    replicas and taken away by this fix (it is the worker finding's), and it would not be the
    sequences' either way."""
    from laggard.diagnose.context import existing

    out = []
    for t in optypes:
        out.append(Change(action="even", selector=",".join([f"optype={t},kind=compute"]
                                                           + [f"rank!={r}" for r in slow_workers])))
        out += [Change(action="even", selector=s) for s in existing(ctx, [f"optype={t},kind=compute,rank={r}"
                                                                          for r in slow_workers])]
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x))
    out[np.argsort(x, kind="stable")] = np.arange(len(x))
    return out


def seq_features(ctx: Ctx, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(rows, sum of len^2, sum of len) of the ops in ``mask`` that carry sequence lengths (None
    when fewer than 8 do). The sums of every op that has lengths are computed once per job
    (``ctx.memo``: the worker and sequence detectors both ask, 0.4 s each at 4,096 workers); each
    op's sums are the same numbers whichever ops are asked for with it."""
    if "sequence.features" not in ctx.memo:
        ctx.memo["sequence.features"] = _all_features(ctx)
    every = ctx.memo["sequence.features"]
    if every is None:
        return None
    valid_rows, sq, lin = every
    sel = mask[valid_rows]
    if int(sel.sum()) < 8:
        return None
    return valid_rows[sel].astype(np.int64), sq[sel], lin[sel]


def _all_features(ctx: Ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``seq_features`` of every op with sequence lengths (rows int32 where they fit: kept for the
    job's lifetime)."""
    from laggard.optable.ops import to_numpy, valid_mask

    col = ctx.base.job.table.column("seq_lens")
    if col.null_count == len(col):
        return None
    lens = col.combine_chunks()
    rows = np.flatnonzero(valid_mask(lens))
    offsets = to_numpy(lens.offsets).astype(np.int64)
    values = to_numpy(lens.values).astype(np.float64)
    starts, ends = offsets[rows], offsets[rows + 1]
    owner = np.repeat(np.arange(len(rows)), ends - starts)
    idx = np.repeat(starts - np.concatenate([[0], np.cumsum(ends - starts)[:-1]]), ends - starts) + np.arange(
        int((ends - starts).sum()))
    sq = np.bincount(owner, weights=values[idx] ** 2, minlength=len(rows))
    lin = np.bincount(owner, weights=values[idx], minlength=len(rows))
    rows = compact(rows, len(ctx.w))
    return rows, sq, lin


def fit_seq_cost(ctx: Ctx, fm: np.ndarray) -> float | None:
    """R^2 of forward time against a*sum(len^2) + b*sum(len) + c (None without sequence lengths)."""
    feats = seq_features(ctx, fm)
    if feats is None:
        return None
    rows, sq, lin = feats
    y = ctx.w[rows]
    # per-stage scale: fit y / stage mean against normalised features
    pp = ctx.pp[rows]
    smean = (np.bincount(pp, weights=y) / np.maximum(np.bincount(pp), 1))[pp]
    y = y / np.maximum(smean, 1e-12)
    X = np.stack([sq / max(sq.mean(), 1e-12), lin / max(lin.mean(), 1e-12), np.ones(len(rows))], axis=1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    pred = X @ coef
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else None
