"""``comm``: transfers on one link or group far slower than the same transfers elsewhere; or the
same slow tail on every link (ranks waiting for peers that run late: CPU contention, a congested
fabric), or slow links that reach every rank of the job, which are reported as such and blamed on
no one link."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.diagnose import noise
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, existing, group_median, peer_median, rows_mask, to_peers, weights_of
from laggard.diagnose.findings import Candidate
from laggard.results.diagnosis import Consistency, Finding
from laggard.whatif.custom import Change


@dataclass(slots=True, eq=False)  # numpy arrays: a generated == could only raise (no truth value)
class _Keys:
    """The communication ops (``rows``, indices into the job's ops) by key: a link (rank, peer) for
    point-to-point, (rank, op type) for collectives, and per key what the detector weighs."""

    rows: np.ndarray
    src: np.ndarray  # per row: the sending rank (a collective's: its rank)
    dst: np.ndarray  # per row: the receiving rank (a collective's: -1)
    is_p2p: np.ndarray  # per row
    tmed: np.ndarray  # per op of the job: its op type's median over the communication ops
    uniq: np.ndarray  # the keys (link * (op types + 1) + op type)
    inv: np.ndarray  # per row: its key's index
    first: np.ndarray  # per key: its first row
    excess: np.ndarray  # per key: seconds over the op type's median, summed
    med: np.ndarray  # per key: its median transfer
    mx: np.ndarray  # per key: its longest transfer
    base_med: np.ndarray  # per key: the same op type's median on the other links (``_elsewhere``)
    type_of: np.ndarray  # per key: its op type
    key_p2p: np.ndarray  # per key: a point-to-point link's
    nn: int  # op types + 1: a key's multiplier of its link


def _keys(ctx: Ctx, comm: np.ndarray) -> _Keys:
    """The ``comm`` ops by key, with each key's statistics."""
    # every per-op array here is of the communication ops only (``rows``), not of all ops (7.7M at
    # 4,096 workers)
    rows = np.flatnonzero(comm)
    is_p2p = ctx.kind_is("p2p_send", "p2p_recv")[rows]
    recv = ctx.kind_is("p2p_recv")[rows]
    rank, peer = ctx.rank[rows], ctx.peer[rows]
    src = np.where(recv, peer, rank)
    dst = np.where(recv, rank, peer)
    del recv, peer
    link = np.where(is_p2p, np.minimum(src, dst) * (int(ctx.rank.max()) + 2) + np.maximum(src, dst), -(rank + 1))
    w, name = ctx.w[rows], ctx.name[rows]
    # each op type's median over the communication ops (0 for a type none of them has; the last
    # code, one past the names, is the job's sentinel: its ops weigh against 0)
    type_med = group_median(w, name.astype(np.int64), len(ctx.names) + 1)
    tmed = np.append(type_med[:-1], 0.0)[ctx.name]
    nn = len(ctx.names) + 1
    key = link * nn + name
    del link
    uniq, inv = np.unique(key, return_inverse=True)
    del key
    excess = np.bincount(inv, weights=np.maximum(w - tmed[rows], 0.0), minlength=len(uniq))
    mx = np.zeros(len(uniq))
    np.maximum.at(mx, inv, w)
    med = group_median(w, inv, len(uniq))
    type_of = uniq % nn
    first = np.full(len(uniq), len(rows), dtype=np.int64)  # each key's first op (no second sort)
    np.minimum.at(first, inv, np.arange(len(rows)))
    key_p2p = is_p2p[first]
    base_med = _elsewhere(med, type_of, type_med[type_of], key_p2p)
    return _Keys(rows=rows, src=src, dst=dst, is_p2p=is_p2p, tmed=tmed, uniq=uniq, inv=inv, first=first,
                 excess=excess, med=med, mx=mx, base_med=base_med, type_of=type_of, key_p2p=key_p2p, nn=nn)


def detect(ctx: Ctx, cfg: DiagnoseConfig) -> list[Candidate]:
    comm = ctx.synced & ~ctx.compute
    if comm.sum() < cfg.comm_min_ops:
        return []
    k = _keys(ctx, comm)
    med_slow = k.med > cfg.comm_median_x * k.base_med  # slow in its median, not only in its tail
    tail = (med_slow | (k.mx > cfg.comm_max_x * k.base_med)) & (k.excess > 0)
    tail &= k.excess >= cfg.comm_excess_of_top * k.excess.max()
    # a bad link stands out from the other links of its op type; when they all have the same slow
    # tail (hosts short of CPU, a congested fabric), no one link is to blame
    slow = tail & (k.excess > cfg.comm_stands_out * peer_median(k.excess, k.type_of))
    # a link is named only when its transfers stand out from the job's noise, steadily or now and then
    judged = link_consistency(ctx, cfg, k, slow)
    slow &= np.isin(np.arange(len(k.uniq)), [i for i, c in judged.items() if noise.stands_out(c)])
    # ... and slow only in their tail, it must gain what one such link must (``comm_tail_min_gain``)
    floor = cfg.comm_tail_min_gain if not med_slow[tail].any() else None
    if not slow.any() or slow.mean() > cfg.comm_everywhere:
        return _everywhere(ctx, k, tail, floor)
    bad = slow[k.inv]  # of ``rows``
    shared = shared_end(k.src[k.first], k.dst[k.first], slow)
    if len(ctx.ranks) >= 3 and shared is None and np.isin(ctx.ranks, np.concatenate([k.src[bad], k.dst[bad]])).all():
        # slow links that reach every rank of the job are not one link's or one host's fault either: a
        # heavy stage keeps its neighbours' transfers and the job-wide collectives waiting on it, so
        # many keys read slow, and naming their ranks would name every rank
        return _everywhere(ctx, k, slow, floor, reach_all=True)
    # a link slow only in its tail (no slow key's median over comm_median_x) must gain more to be named
    tail_only = not med_slow[slow].any()
    return [_named_links(ctx, cfg, k, slow, judged, shared, cfg.comm_tail_min_gain if tail_only else None)]


def _named_links(ctx: Ctx, cfg: DiagnoseConfig, k: _Keys, slow: np.ndarray, judged: dict[int, Consistency],
                 shared: int | None, min_gain: float | None) -> Candidate:
    """The finding on the ``slow`` keys: their ranks (or the one rank they all share), the worst one's
    transfers as the evidence, and their fix."""
    bad = slow[k.inv]  # of ``rows``
    bad_rows = k.rows[bad]
    # a slow link's transfers are set to the other links' of their stage, not to a mean over every link:
    # that mean holds the slow link itself, so with few links the "fix" keeps much of the slowness and
    # what remains can hide a second cause behind it; collectives stay ``--fix``
    changes = to_peers(ctx, _link_fixes(ctx, k, slow), ctx.kind_is("p2p_send", "p2p_recv"))
    i0 = int(np.argmax(np.where(slow, k.excess, -1)))
    at = np.flatnonzero(k.inv == i0)  # of ``rows``
    rws = k.rows[at]
    r_a, r_b = int(k.src[at[0]]), int(k.dst[at[0]])
    nm = ctx.names[int(k.type_of[i0])]
    n_slow = int((ctx.w[rws] > cfg.comm_median_x * k.base_med[i0]).sum())
    where = f"from rank {r_a} to rank {r_b}" if k.is_p2p[at[0]] else f"of rank {int(ctx.rank[rws[0]])}"
    ev = (
        f"{nm} transfers {where} take {1e3 * k.med[i0]:.2f} ms (median, max {1e3 * k.mx[i0]:.2f} ms) vs "
        f"{1e3 * k.base_med[i0]:.2f} ms elsewhere; {n_slow} of {len(rws)} are slow"
    )
    ends = np.unique(np.concatenate([k.src[bad], k.dst[bad]]))
    ranks = ends[ends >= 0].tolist()
    if shared is not None:
        ranks = [shared]
        ev += f"; every slow link has rank {shared} at one end"
    finding = Finding(
        cause="comm",
        workers=[ctx.worker_of[r] for r in ranks if r in ctx.worker_of][:16],
        steps=ctx.steps_of(rows_mask(len(ctx.w), bad_rows) & (ctx.w > cfg.comm_median_x * k.tmed)),
        evidence=ev,
        fix=_fix_text(shared, bool(k.is_p2p[at[0]]), r_a, r_b, int(ctx.rank[rws[0]])),
        targets=[judged[i0]] + [judged[int(i)] for i in np.flatnonzero(slow) if i != i0],
    )
    return Candidate(finding=finding, changes=changes, weights=weights_of(ctx, changes), min_gain=min_gain)


def _fix_text(shared: int | None, p2p: bool, r_a: int, r_b: int, rank: int) -> str:
    """What on-call checks: the rank every slow link shares, a point-to-point link's two ends, or a
    collective's rank."""
    if shared is not None:
        return (f"check rank {shared}'s node: its NIC, and its host (a host short of CPU serves every transfer "
                "late); drain it if the slow transfers persist")
    if p2p:
        return (f"check the link/NIC between rank {r_a} and rank {r_b} (flapping port, bad cable, congested switch); "
                "drain one of the two nodes or route around it")
    return f"check the network of rank {rank}'s node; drain it if the slow collectives persist"


def shared_end(src: np.ndarray, dst: np.ndarray, slow: np.ndarray) -> int | None:
    """The one rank every slow link has at one end (``src``/``dst``: each key's, from its first op),
    when there are two links or more (a collective's key is its rank's): their common end is what is
    slow, its NIC or its host (a rank short of CPU serves every one of its links' transfers late, and
    naming each slow link's two ends would name its healthy neighbours too). None for one link, whose
    two ends cannot be told apart, or no common end."""
    ends = {tuple(sorted({int(x) for x in (a, b) if x >= 0})) for a, b in zip(src[slow], dst[slow], strict=True)}
    if len(ends) < 2:
        return None
    common = set.intersection(*(set(e) for e in ends))
    return common.pop() if len(common) == 1 else None


def _elsewhere(med_link: np.ndarray, type_of: np.ndarray, med_type: np.ndarray, p2p: np.ndarray) -> np.ndarray:
    """Per (link, op type) key, the same transfers elsewhere: for a point-to-point link, the median
    of the other links' medians of its op type, not the type's median over every op: with two links,
    half the ops are the slow link's, so that median lies halfway between the two, and however slow
    the link it stands at under 2x it. A collective (a rank's key) keeps its type's median: half the
    ranks of a group wait in it for the other half, and against the fast half those waits would pass
    for a slow link; so does a key alone in its type."""
    others = p2p & (np.bincount(type_of)[type_of] > 1)
    return np.where(others, peer_median(med_link, type_of), med_type)


def link_consistency(ctx: Ctx, cfg: DiagnoseConfig, k: _Keys, slow: np.ndarray) -> dict[int, Consistency]:
    """Per slow (link, op type) key (index into ``k.uniq``): per step, its mean transfer over the
    median of the other links of its op type in that step, judged against the step-to-step spread of
    the same ratio for the links that are not slow (``laggard.diagnose.noise``)."""
    rows, inv, uniq, nn = k.rows, k.inv, k.uniq, k.nn
    nr = int(ctx.rank.max()) + 2
    ns = int(ctx.step.max()) + 1
    cell = inv * ns + ctx.step[rows]
    tot = np.bincount(cell, weights=ctx.w[rows], minlength=len(uniq) * ns).reshape(len(uniq), ns)
    cnt = np.bincount(cell, minlength=len(uniq) * ns).reshape(len(uniq), ns)
    mean = np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
    ref = np.full(mean.shape, np.nan)
    # every (key, step) cell against the other keys of its op type in that step, in one sort (a cell
    # alone in its (step, op type) gets 0 from peer_median: no reference)
    ki, si = np.nonzero(np.isfinite(mean))
    pm = peer_median(mean[ki, si], si * nn + uniq[ki] % nn)
    ref[ki, si] = np.where(pm > 0, pm, np.nan)
    ratio = noise.ratios(mean, ref)
    steps = ctx.step_numbers()[:ns]
    out = {}
    for i in np.flatnonzero(slow).tolist():
        link, name = divmod(int(uniq[i]), nn)
        label = f"link {link // nr}-{link % nr}" if link >= 0 else f"rank {-link - 1}"
        job = noise.noise_for(ratio, i, cfg, ~slow)
        out[i] = noise.judge(f"{label} ({ctx.names[name]})", "transfer", ratio[i], mean[i] - ref[i], steps, job, cfg)
    return out


def _link_fixes(ctx: Ctx, k: _Keys, chosen: np.ndarray) -> list[Change]:
    """``--fix`` selectors for the transfers of the chosen (link, op type) keys: a p2p link in both
    directions (rank and peer), a collective on its rank."""
    nn, nr = k.nn, int(ctx.rank.max()) + 2
    out: list[str] = []
    for key, p2p in zip(k.uniq[chosen].tolist(), k.key_p2p[chosen].tolist(), strict=True):
        nm, link = ctx.names[key % nn], key // nn
        if p2p:
            lo, hi = divmod(link, nr)
            out += [f"optype={nm},rank={lo},peer={hi}", f"optype={nm},rank={hi},peer={lo}"]
        else:
            out.append(f"optype={nm},rank={-link - 1}")
    return [Change(action="fix", selector=s) for s in existing(ctx, out)]


def _everywhere(ctx: Ctx, k: _Keys, tail: np.ndarray, min_gain: float | None,
                reach_all: bool = False) -> list[Candidate]:
    """Transfers with the same slow tail on the ``tail`` keys, several links and ranks alike, or
    (``reach_all``) slow keys that stand out but reach every rank: not one link's fault;
    ``min_gain``: its own speed-up floor."""
    bad = tail[k.inv]  # of ``rows``
    bad_rows = k.rows[bad]
    ranks = np.unique(ctx.rank[bad_rows])
    links = np.unique((k.uniq // k.nn)[tail])
    if len(links) < 2 or len(ranks) < 2:
        return []
    changes = _link_fixes(ctx, k, tail)
    slow_ops = ctx.w[bad_rows] > 3 * k.tmed[bad_rows]
    ms = 1e3 * ctx.w[bad_rows]
    what = "point-to-point transfers" if k.is_p2p[bad].all() else "transfers"
    head = (f"slow {what} on {len(links)} links reach all {len(ctx.ranks)} ranks" if reach_all
            else f"{what} on {len(links)} links over {len(ranks)} ranks share the same slow tail")
    ev = (
        f"{head}: median {float(np.median(ms)):.2f} ms, p90 {float(np.percentile(ms, 90)):.2f} ms, "
        f"{int(slow_ops.sum())} of {len(bad_rows)} over 3x their op type's median"
        + ("" if reach_all else "; no link stands out from the others")
    )
    finding = Finding(
        cause="comm",
        # job-wide: naming every rank would have on-call drain healthy nodes (the evidence counts them)
        workers=[],
        steps=ctx.steps_of(rows_mask(len(ctx.w), bad_rows[slow_ops])),
        evidence=ev,
        fix="not one bad link: ranks wait for peers that run late. Look for CPU contention on the hosts (more busy "
        "processes or threads than cores, data-loader workers, noisy neighbours) or fabric-wide congestion",
    )
    return [Candidate(finding=finding, changes=changes, weights=weights_of(ctx, changes), min_gain=min_gain)]
