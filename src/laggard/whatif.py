"""What-if analysis: replay the job with parts of it idealised and measure what each part costs.

Following Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis"
(OSDI '25): the *ideal* duration of an op is the mean (compute) or the median (communication
transfer) of its op type, pooled over all workers, steps and microbatches. The straggler slowdown
is S = T / T_ideal, where T is the replayed step time with measured durations (launch gaps
removed) and T_ideal the replayed step time with every op idealised. Attributions keep one part
(an op type, a DP rank, a stage) as measured and everything else ideal.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.errors import GraphCycleError
from laggard.gaps import HOST_KIND, GapConfig, GapSummary, host_attribution_type, insert_host_gaps
from laggard.graph import Graph, build_graph, group_sizes_check
from laggard.ops import COMM_KINDS, Job, JobMeta, LaggardError, LaggardWarning, is_gc_name
from laggard.replay import replay, replay_steps, wall_step_times
from laggard.replay_chain import chained_wall_step_times, plan_chain

if TYPE_CHECKING:
    from laggard.diagnose.findings import Diagnosis
    from laggard.symmetry import DPReduction

TOP_WORKER_SHARE = 0.03
# above this many DP ranks, per-DP-rank what-ifs replay a two-rank equivalent job (laggard.symmetry)
DP_REDUCTION_MIN = 8
_NS = 1e-9
# Scenarios replayed together in one pass (weights + node values, float64): at least 16 (rows
# of whole cache lines per node), more while a pass stays within _PASS_BYTES (a pass costs a
# Python step per graph segment, whatever its width: small graphs with many what-ifs, e.g. a
# Kineto job with hundreds of op types, replay them all in a few passes), never more than
# _MAX_BATCH_BYTES.
_MAX_BATCH_BYTES = 1536 * 2**20
_PASS_BYTES = 64 * 2**20
_MIN_BATCH = 16


def _batch_size(num_ops: int, num_nodes: int, num_scenarios: int) -> int:
    per_scenario = max(8 * (num_ops + 2 * num_nodes), 1)
    wide = max(_MIN_BATCH, _PASS_BYTES // per_scenario)
    return max(1, min(num_scenarios, wide, _MAX_BATCH_BYTES // per_scenario))


@dataclass(kw_only=True, slots=True)
class Baseline:
    """The measured job, ready for replays: graph, measured and ideal weights, op labels."""

    job: Job
    graph: Graph
    start_s: np.ndarray
    end_s: np.ndarray
    measured: np.ndarray  # replay weight per op: duration, or transfer duration for group members
    ideal: np.ndarray
    name_code: np.ndarray
    names: list[str]
    kind_code: np.ndarray
    kinds: list[str]
    attr_code: np.ndarray  # op type for attribution (p2p send/recv pairs merged)
    attr_names: list[str]
    rank: np.ndarray
    dp_rank: np.ndarray
    pp_rank: np.ndarray
    measured_step_s: np.ndarray  # per step: last end - first start, as traced
    wall_step_s: np.ndarray  # per step: last end - the previous step's last end (wall clock)
    gaps: GapSummary  # untraced host time per rank, and what of it became host ops
    traced: Job | None = None  # the job as loaded, before host ops (a what-if may model gaps anew)

    def is_comm(self) -> np.ndarray:
        comm = np.array([k in COMM_KINDS for k in self.kinds], dtype=bool)
        return comm[self.kind_code] if len(comm) else np.zeros(len(self.kind_code), dtype=bool)

    def is_host(self) -> np.ndarray:
        """Host ops: untraced time modelled as ops of its rank (``laggard.gaps``)."""
        host = np.array([k == HOST_KIND for k in self.kinds], dtype=bool)
        return host[self.kind_code] if len(host) else np.zeros(len(self.kind_code), dtype=bool)


def attribution_type(name: str, kind: str) -> str:
    """The op type an attribution reports: the two ends of a p2p transfer count as one type."""
    if kind == HOST_KIND:
        return host_attribution_type(name)
    if kind in ("p2p_send", "p2p_recv"):
        for suffix in ("-send", "-recv"):
            if name.endswith(suffix):
                return name.removesuffix(suffix) + "-pp-comm"
        return "p2p"
    return name


def transfer_durations(graph: Graph, start_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
    """Per group member: observed end minus the latest start among the group's participants.

    Negative values (a send that completed before its peer arrived, or clock skew) become 0.
    """
    td = end_s - start_s
    if graph.num_groups:
        members = graph.group_ops
        gmax = np.maximum.reduceat(start_s[members], graph.group_ptr[:-1])
        owner = np.repeat(np.arange(graph.num_groups), np.diff(graph.group_ptr))
        td[members] = np.maximum(end_s[members] - gmax[owner], 0.0)
    return td


def ideal_weights(measured: np.ndarray, name_code: np.ndarray, is_comm_op: np.ndarray, num_names: int) -> np.ndarray:
    """Mean per op type for compute, median per op type for communication (and ``is_comm_op``'s
    other ops: untraced host time)."""
    counts = np.bincount(name_code, minlength=num_names)
    mean = np.bincount(name_code, weights=measured, minlength=num_names) / np.maximum(counts, 1)
    comm_name = np.zeros(num_names, dtype=bool)
    comm_name[name_code[is_comm_op]] = True
    if not comm_name.any():
        return mean[name_code]
    rows = np.flatnonzero(comm_name[name_code])
    order = rows[np.argsort(name_code[rows], kind="stable")]  # by op type; np.median needs no order within
    bounds = np.searchsorted(name_code[order], np.arange(num_names + 1))
    median = mean.copy()
    for c in np.flatnonzero(comm_name):
        median[c] = np.median(measured[order[bounds[c] : bounds[c + 1]]])
    return np.where(comm_name, median, mean)[name_code]


def prepare(job: Job, gaps: GapConfig | None = None) -> Baseline:
    """Add host ops for untraced gaps, build the graph, drop steps the replay cannot model,
    compute measured and ideal weights."""
    gap_cfg = gaps or GapConfig()
    traced = job
    with_gaps, gap_summary = insert_host_gaps(job, gap_cfg)
    try:
        graph = build_graph(with_gaps)
    except GraphCycleError:
        if with_gaps is job or not gap_cfg.wait_for_busy:
            raise
        gap_cfg = dataclasses.replace(gap_cfg, wait_for_busy=False)
        with_gaps, gap_summary = insert_host_gaps(job, gap_cfg)
        graph = build_graph(with_gaps)
    job = with_gaps
    bad = group_sizes_check(job, graph)
    if len(bad):
        import pyarrow as pa

        if len(bad) == len(graph.steps):
            raise LaggardError("every step has a collective with missing participants; nothing to analyse")
        keep = pa.array(~np.isin(job.column("step"), bad))
        job = Job(table=job.table.filter(keep), meta=job.meta, warnings=job.warnings)
        graph = build_graph(job)
    start_ns = job.column("start_ns")
    dur_ns = job.column("dur_ns")
    if (dur_ns < 0).any():
        raise LaggardError(f"{int((dur_ns < 0).sum())} op(s) have negative durations")
    start_s = (start_ns - start_ns.min()) * _NS
    end_s = start_s + dur_ns * _NS
    name_code, names = job.codes("name")
    kind_code, kinds = job.codes("kind")
    comm_kind = np.array([k in COMM_KINDS for k in kinds], dtype=bool)
    td = transfer_durations(graph, start_s, end_s)
    measured = np.where(graph.op_group >= 0, td, dur_ns * _NS)
    # untraced host time is idealised to its peers' median, like communication (sporadic stalls)
    median_kind = comm_kind | np.array([k == HOST_KIND for k in kinds], dtype=bool)
    ideal = ideal_weights(measured, name_code, median_kind[kind_code], len(names))
    # GC pauses traced as their own ops occur on some workers in some steps; at their mean they
    # would stay in the ideal run exactly where they stalled the job. The ideal job does not stop
    # the world mid-step (planned GC moves collections out of the step): they are idealised to 0.
    gc_name = np.array([is_gc_name(n) for n in names], dtype=bool)
    if gc_name.any():
        ideal = np.where(gc_name[name_code], 0.0, ideal)
    # attribution types
    pair_kind = {}
    for c, nm in enumerate(names):
        ks = np.unique(kind_code[name_code == c])
        pair_kind[c] = attribution_type(nm, kinds[int(ks[0])]) if len(ks) else nm
    attr_names = sorted(set(pair_kind.values()))
    lut = np.array([attr_names.index(pair_kind[c]) for c in range(len(names))], dtype=np.int64)
    attr_code = lut[name_code]
    so = graph.step_order
    sb = graph.step_bounds[:-1]
    step_end = np.maximum.reduceat(end_s[so], sb)
    measured_step = step_end - np.minimum.reduceat(start_s[so], sb)
    return Baseline(
        job=job,
        graph=graph,
        start_s=start_s,
        end_s=end_s,
        measured=measured,
        ideal=ideal,
        name_code=name_code.astype(np.int64),
        names=names,
        kind_code=kind_code.astype(np.int64),
        kinds=kinds,
        attr_code=attr_code,
        attr_names=attr_names,
        rank=job.column("rank").astype(np.int64),
        dp_rank=job.column("dp_rank").astype(np.int64),
        pp_rank=job.column("pp_rank").astype(np.int64),
        measured_step_s=measured_step,
        wall_step_s=wall_step_times(graph.steps, step_end, measured_step),
        gaps=gap_summary,
        traced=traced,
    )


def replay_mixed(
    base: Baseline, *blocks: tuple[np.ndarray, np.ndarray], keep_measured: bool = True
) -> list[np.ndarray]:
    """Replay scenarios in as few passes as memory allows.

    Each block ``(labels, values)`` asks for one scenario per value v: ops with ``labels == v``
    measured and the rest ideal (``keep_measured=False``: the reverse). A block's ``labels`` may
    also be None for the all-measured (v=1) / all-ideal (v=0) runs. Returns, per block, the step
    times of shape (num_steps, len(values)).
    """
    scen = [(bi, labels, v) for bi, (labels, values) in enumerate(blocks) for v in np.asarray(values).tolist()]
    batch = _batch_size(base.graph.num_ops, base.graph.num_nodes, len(scen))
    cols = np.empty((len(base.graph.steps), len(scen)), dtype=np.float64)
    a_w, b_w = (base.measured, base.ideal) if keep_measured else (base.ideal, base.measured)
    for i in range(0, len(scen), batch):
        part = scen[i : i + batch]
        w = np.empty((base.graph.num_ops, len(part)), dtype=np.float64)
        j = 0
        while j < len(part):  # runs of scenarios from one block are built in one vectorised call
            bi, labels = part[j][0], part[j][1]
            e = j
            while e < len(part) and part[e][0] == bi:
                e += 1
            vs = np.array([p[2] for p in part[j:e]])
            if labels is None:
                w[:, j:e] = np.where(vs[None, :] != 0, a_w[:, None], b_w[:, None])
            else:
                _fill_block(w[:, j:e], labels, vs, a_w, b_w)
            j = e
        cols[:, i : i + len(part)] = replay_steps(base.graph, w)
    out, k = [], 0
    for _, values in blocks:
        m = len(np.asarray(values))
        out.append(cols[:, k : k + m])
        k += m
    return out


def _fill_block(w: np.ndarray, labels: np.ndarray, vs: np.ndarray, a_w: np.ndarray, b_w: np.ndarray) -> None:
    """``w[:, c] = a_w where labels == vs[c] else b_w``, writing each op's ``a_w`` once (an op
    has one label) instead of comparing every op with every scenario."""
    order = np.argsort(vs, kind="stable")
    sv = vs[order]
    if len(sv) <= 8 or (sv[1:] == sv[:-1]).any():  # few scenarios (or a value asked twice): compare
        w[:] = np.where(labels[:, None] == vs[None, :], a_w[:, None], b_w[:, None])
        return
    w[:] = b_w[:, None]
    pos = np.minimum(np.searchsorted(sv, labels), len(sv) - 1)
    rows = np.flatnonzero(sv[pos] == labels)
    w[rows, order[pos[rows]]] = a_w[rows]


@dataclass(kw_only=True, slots=True)
class Explained:
    """How much of the slowdown a set of ops explains (the paper's M_W / M_S)."""

    removed: float  # (T - T_rem) / (T - T_ideal): fix only these ops in the measured run
    added: float  # (T_add - T_ideal) / (T - T_ideal): keep only these ops measured in the ideal run
    T_rem_s: float
    T_add_s: float

    def to_json(self) -> dict[str, float | None]:
        return {k: _num(getattr(self, k)) for k in ("removed", "added", "T_rem_s", "T_add_s")}


@dataclass(kw_only=True, slots=True)
class Analysis:
    """The result of ``analyze``; ``to_json`` is the contract later tools rely on."""

    meta: JobMeta
    T_s: float
    T_ideal_s: float
    slowdown: float
    launch_slowdown: float
    # wall-clock step time / the same from a replay of the steps back to back (laggard.replay_chain;
    # 1: the replay is the job, above 1: time the trace does not show)
    replay_fidelity: float
    steps: list[int]
    step_measured_s: list[float]
    step_simulated_s: list[float]
    step_ideal_s: list[float]
    step_wall_s: list[float]
    step_replayed_wall_s: list[float]  # per step, from the replay of the steps back to back
    by_optype: dict[str, float]
    # S_t of every compute op together and of every communication op together (the fleet's split
    # of the waste by op kind); replayed in the same pass as the other attributions
    by_opkind: dict[str, float]
    by_dp_rank: dict[int, float]
    by_stage: dict[int, float]
    by_worker: list[dict[str, Any]]
    per_step: dict[int, float]
    M_W: float
    M_S: float
    M_W_detail: Explained
    M_S_detail: Explained
    fixed_workers: list[int]
    num_workers: int
    num_ops: int
    warnings: list[str] = field(default_factory=list)
    # further results keyed by their JSON name (e.g. "arrivals" from the Kineto importer)
    extras: dict[str, Any] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    base: Baseline | None = None
    # per step (rows, in ``steps`` order): step time with only one DP rank (columns: ``by_dp_rank``'s
    # keys, sorted) or only one stage (``by_stage``'s keys, sorted) measured; the report's per-worker
    # x per-step heatmap reads them (None when not kept, e.g. an analysis rebuilt from JSON)
    step_by_dp_s: np.ndarray | None = field(default=None, compare=False)
    step_by_stage_s: np.ndarray | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        d = self.diagnosis
        verdict = d.verdict if d is not None else "not diagnosed"
        top = f", top finding {d.findings[0].cause} ({d.findings[0].gain:.2f}x)" if d is not None and d.findings else ""
        return (f"<Analysis {self.meta.name!r}: {self.num_workers} workers, {len(self.steps)} steps, "
                f"S={self.slowdown:.3f}, waste {100 * self.waste:.1f}%, {verdict}{top}>")

    def _repr_html_(self) -> str:
        """Notebook display: the headline and the findings (``to_html`` writes the full report)."""
        from html import escape

        d = self.diagnosis
        rows = "".join(f"<li><b>{escape(f.cause)}</b>: {100 * f.share:.0f}% of the slowdown, {f.gain:.2f}x "
                       f"faster fixed<br><small>{escape(f.evidence)}</small></li>" for f in (d.findings if d else []))
        verdict = escape(d.verdict) if d is not None else "not diagnosed"
        return (f"<div><b>laggard</b> {escape(self.meta.name)}: {self.num_workers} workers, {len(self.steps)} steps; "
                f"straggler slowdown <b>S = {self.slowdown:.3f}</b> (waste {100 * self.waste:.1f}%); "
                f"verdict: <b>{verdict}</b>" + (f"<ol>{rows}</ol>" if rows else "") + "</div>")

    def to_html(self, path: str | Path, *, perfetto: str | Path | None = None) -> Path:
        """Write the self-contained HTML report to ``path``; returns the path. It links the Perfetto
        trace ``perfetto`` (written by you), else one it writes beside it (NAME.perfetto.json.gz)."""
        from laggard.report.html import write_report

        return write_report(self, path, perfetto=perfetto)[0]

    def timelines(self) -> tuple[np.ndarray, np.ndarray]:
        """Replayed op end times (step-relative) with measured and with ideal durations."""
        assert self.base is not None
        ends, _ = replay(self.base.graph, np.stack([self.base.measured, self.base.ideal], axis=1))
        return ends[:, 0], ends[:, 1]

    @property
    def waste(self) -> float:
        return 1.0 - 1.0 / self.slowdown if self.slowdown > 0 else 0.0

    @property
    def gpu_hours(self) -> float | None:
        if self.meta.world_size is None:
            return None
        return self.meta.num_gpus * float(np.sum(self.step_measured_s)) / 3600.0

    def to_json(self) -> dict[str, Any]:
        gh = self.gpu_hours
        return {
            "slowdown": _num(self.slowdown),
            "waste": _num(self.waste),
            "T_s": _num(self.T_s),
            "T_ideal_s": _num(self.T_ideal_s),
            "launch_slowdown": _num(self.launch_slowdown),
            "replay_fidelity": _num(self.replay_fidelity),
            "num_workers": self.num_workers,
            "num_steps": len(self.steps),
            "num_ops": self.num_ops,
            "num_gpus": self.meta.num_gpus if self.meta.world_size is not None else None,
            "gpu_hours": _num(gh),
            "gpu_hours_wasted": _num(gh * self.waste) if gh is not None else None,
            "by_optype": {k: _num(v) for k, v in self.by_optype.items()},
            "by_opkind": {k: _num(v) for k, v in self.by_opkind.items()},
            "by_dp_rank": {str(k): _num(v) for k, v in self.by_dp_rank.items()},
            "by_stage": {str(k): _num(v) for k, v in self.by_stage.items()},
            "by_worker": [{**w, "slowdown": _num(w["slowdown"])} for w in self.by_worker],
            "per_step": {str(s): _num(v) for s, v in self.per_step.items()},
            "M_W": _num(self.M_W),
            "M_S": _num(self.M_S),
            "M_W_detail": {**self.M_W_detail.to_json(), "fixed_ranks": self.fixed_workers},
            "M_S_detail": self.M_S_detail.to_json(),
            "step_time_measured": {str(s): _num(v) for s, v in zip(self.steps, self.step_measured_s, strict=True)},
            "step_time_simulated": {str(s): _num(v) for s, v in zip(self.steps, self.step_simulated_s, strict=True)},
            "step_time_ideal": {str(s): _num(v) for s, v in zip(self.steps, self.step_ideal_s, strict=True)},
            "step_time_wall": {str(s): _num(v) for s, v in zip(self.steps, self.step_wall_s, strict=True)},
            "step_time_replayed_wall": {str(s): _num(v)
                                        for s, v in zip(self.steps, self.step_replayed_wall_s, strict=True)},
            "meta": {"name": self.meta.name, "source": self.meta.source, **self.meta.parallel_sizes(),
                     **({"layout": self.meta.extra["layout"]} if "layout" in self.meta.extra else {})},
            "warnings": list(self.warnings),
            **(self.diagnosis.to_json() if self.diagnosis is not None else {}),
            **self.extras,
        }


def _num(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return num.mean(axis=0) / den.mean(axis=0)


def _explain(base: Baseline, mask: np.ndarray, T: float, T_ideal: float) -> Explained:
    # removal: these ops ideal, the rest measured; addition: these ops measured, the rest ideal
    st_rem, st_add = replay_mixed(base, (mask, [False]), (mask, [True]))
    return _explained(float(st_rem.mean()), float(st_add.mean()), T, T_ideal)


def _explained(t_rem: float, t_add: float, T: float, T_ideal: float) -> Explained:
    gap = T - T_ideal
    return Explained(
        removed=(T - t_rem) / gap if gap > 0 else float("nan"),
        added=(t_add - T_ideal) / gap if gap > 0 else float("nan"),
        T_rem_s=t_rem,
        T_add_s=t_add,
    )


def analyze(job: Job, *, gaps: GapConfig | None = None) -> Analysis:
    """The what-if analysis of a job (see the module docstring); its diagnosis is added one level
    up, by ``laggard.analysis.analyze``. ``gaps``: when untraced host time becomes host ops
    (``GapConfig(enabled=False)``: the published method, gaps left out)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        base = prepare(job, gaps)
        res = _analyze(base)
        from laggard.arrivals import job_extras

        res.extras.update(job_extras(base.job))
        res.extras["untraced_gaps"] = base.gaps.to_json()
    for w in caught:
        if issubclass(w.category, LaggardWarning):
            res.warnings.append(str(w.message))
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    res.warnings = list(job.warnings) + [w for w in res.warnings if w not in job.warnings]
    return res


def _analyze(base: Baseline) -> Analysis:
    g = base.graph
    # measured and ideal runs; then op types and stages with only that part measured
    dps, stages = np.unique(base.dp_rank), np.unique(base.pp_rank)
    attr_vals = np.arange(len(base.attr_names))
    reduction = _dp_reduction(base) if len(dps) > DP_REDUCTION_MIN else None
    last_stage = base.pp_rank == stages.max()
    blocks = [(None, [1, 0]), (base.attr_code, attr_vals), (base.pp_rank, stages), (last_stage, [False, True]),
              (base.is_comm(), [False, True])]
    if reduction is None:
        blocks.append((base.dp_rank, dps))
    st_base, st_type, st_pp, st_ms, st_kind, *rest = replay_mixed(base, *blocks)
    st_meas, st_ideal = st_base[:, 0], st_base[:, 1]
    T, T_ideal = float(st_meas.mean()), float(st_ideal.mean())
    slowdown = T / T_ideal
    by_optype = dict(zip(base.attr_names, _ratio(st_type, st_ideal[:, None]).tolist(), strict=True))
    by_opkind = dict(zip(("compute", "comm"), _ratio(st_kind, st_ideal[:, None]).tolist(), strict=True))
    st_dp = rest[0] if reduction is None else by_dp_rank_step_times(base, dps, reduction)
    by_dp = dict(zip(dps.tolist(), _ratio(st_dp, st_ideal[:, None]).tolist(), strict=True))
    by_stage = dict(zip(stages.tolist(), _ratio(st_pp, st_ideal[:, None]).tolist(), strict=True))
    # workers: S_w = min(S_dp, S_stage); M_W fixes the top 3% of them
    ranks, first = np.unique(base.rank, return_index=True)
    w_dp, w_pp = base.dp_rank[first], base.pp_rank[first]
    s_w = np.minimum([by_dp[int(d)] for d in w_dp], [by_stage[int(p)] for p in w_pp])
    order = np.lexsort((ranks, -s_w))
    by_worker = [
        {"dp_rank": int(w_dp[i]), "stage": int(w_pp[i]), "rank": int(ranks[i]), "slowdown": float(s_w[i])}
        for i in order
    ]
    num_fix = max(1, math.ceil(len(ranks) * TOP_WORKER_SHARE))
    fixed = ranks[order[:num_fix]]
    mw = _explain(base, np.isin(base.rank, fixed), T, T_ideal)
    ms = _explained(float(st_ms[:, 0].mean()), float(st_ms[:, 1].mean()), T, T_ideal)
    per_step = dict(zip(g.steps.tolist(), (st_meas / st_ideal).tolist(), strict=True))
    replayed_wall = replayed_wall_step_times(base)
    return Analysis(
        meta=base.job.meta,
        T_s=T,
        T_ideal_s=T_ideal,
        slowdown=slowdown,
        launch_slowdown=float(base.measured_step_s.mean()) / T,
        replay_fidelity=float(base.wall_step_s.mean() / replayed_wall.mean()),
        steps=g.steps.tolist(),
        step_measured_s=base.measured_step_s.tolist(),
        step_simulated_s=st_meas.tolist(),
        step_ideal_s=st_ideal.tolist(),
        step_wall_s=base.wall_step_s.tolist(),
        step_replayed_wall_s=replayed_wall.tolist(),
        by_optype=by_optype,
        by_opkind=by_opkind,
        by_dp_rank=by_dp,
        by_stage=by_stage,
        by_worker=by_worker,
        per_step=per_step,
        M_W=mw.removed,
        M_S=ms.removed,
        M_W_detail=mw,
        M_S_detail=ms,
        fixed_workers=[int(r) for r in fixed],
        num_workers=len(ranks),
        num_ops=g.num_ops,
        base=base,
        step_by_dp_s=np.asarray(st_dp, dtype=np.float64),
        step_by_stage_s=np.asarray(st_pp, dtype=np.float64),
    )


def replayed_wall_step_times(base: Baseline) -> np.ndarray:
    """Per step, the wall-clock time of the measured job replayed with its steps back to back."""
    stream, _ = base.job.codes("stream")
    plan = plan_chain(base.graph, base.rank, stream.astype(np.int64), base.is_host(), base.start_s)
    return chained_wall_step_times(base.graph, plan, base.measured)[0]


def _dp_reduction(base: Baseline) -> DPReduction | None:
    from laggard.symmetry import reduce_dp

    return reduce_dp(base.job, base.graph)


def by_dp_rank_step_times(base: Baseline, dps: np.ndarray, reduction: DPReduction | None = None) -> np.ndarray:
    """Step times with one DP rank measured and every other op ideal, for each DP rank.

    With a ``reduction`` (DP ranks interchangeable, see ``laggard.symmetry``) each what-if replays a
    two-DP-rank job instead of the whole job; the result is the same.
    """
    if reduction is None:
        return replay_mixed(base, (base.dp_rank, dps))[0]
    from laggard.symmetry import per_dp_weights

    rows = np.searchsorted(reduction.dp_values, dps)
    batch = _batch_size(reduction.graph.num_ops, reduction.graph.num_nodes, len(rows))
    out = np.empty((len(base.graph.steps), len(dps)), dtype=np.float64)
    for i in range(0, len(rows), batch):
        w = per_dp_weights(reduction, base.measured, base.ideal, rows[i : i + batch])
        out[:, i : i + batch] = replay_steps(reduction.graph, w)
    return out


__all__ = ["Analysis", "Baseline", "analyze", "prepare"]
