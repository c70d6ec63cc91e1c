"""``laggard diff A B``: why run B's step time differs from run A's, attributed by what-if.

B is replayed with A's durations for one part at a time (an op type, narrowed to a stage or a rank
when one carries it) and for every set of parts together; each part's share of the change is its
Shapley value over those replays, so the parts add up to the change B's durations make. What B's
durations cannot account for (a layout, op types or op counts A does not have) is one more part,
"not from durations", so all the shares add up to 1.

*A's durations in B*: every op of B is matched with A's ops of the same op type at the finest
grain both runs share: the same rank when the layouts are the same, the same pipeline stage when
the DP sizes differ, the whole job when the stage counts differ. B's op then takes its duration
times (A's mean / B's mean) over that cell, so B's own variation within a cell (which microbatch,
which step) stays and the level is A's. A part's what-if is therefore a set of ``--scale`` changes
of ``laggard whatif`` (``Contribution.command``), reproducible on B alone.

Untraced host time is modelled as host ops from any gap size (``DiffConfig.gap_share``), in both
runs, so a stall one run has and the other lacks is compared like any op type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from laggard.engine.baseline import Baseline, _batch_size, prepare
from laggard.engine.gaps import GapConfig
from laggard.engine.replay import replay_steps
from laggard.errors import LaggardError
from laggard.optable.ops import Job
from laggard.results.diff import NOT_FROM_DURATIONS, Contribution, DiffResult, RunSummary
from laggard.util.shapley import shapley


@dataclass(kw_only=True, slots=True)
class DiffConfig:
    """Thresholds of ``diff``."""

    # A stage is named for an op type's change (a rank for its stage's) when B with only that
    # stage's ops at A's durations removes this much of what the op type's whole change removes.
    # The diagnosis' fallback names the narrowest carrier near the best the same way; 0.8 leaves
    # room for the replay's non-additivity (a part alone is not exactly its share).
    narrow_share: float = 0.8
    # Parts in the joint (Shapley) game besides "every other op type": 2^(n+1) replays of B (256 at
    # 7), as many players as the diagnosis' joint attribution takes.
    max_parts: int = 7
    # |change| under this is run-to-run noise: the clean real 4-rank jobs of the corpus vary 1-2% in
    # step time between runs. The shares are still given, but of a change that means little: said so.
    min_change: float = 0.02
    # Untraced host gaps become host ops from this share of a step on, in both runs: 0 (every gap),
    # so host time one run spends and the other does not is a compared op type, not left out
    # because it fell under the analysis' 2% in one run only.
    gap_share: float = 0.0
    # An op type is a part of its own when it moves B's step (alone or removed last) by at least this
    # share of the change; smaller ones join "every other op type" rather than list float noise.
    min_part: float = 0.005
    # Two runs compare unlike jobs when fewer than this share of their traced op types (the union of
    # both, host gaps left out) are in both: the job's code changed, not only its durations. Half
    # keeps a run with a few extra op types (a recompute, another optimizer step) comparable.
    min_shared_types: float = 0.5
    # The headline states the part "not from durations" beside the parts named when it carries more
    # than this share of the change: then the named parts explain only the smaller rest.
    structure_share: float = 0.25

    def __post_init__(self) -> None:
        if not 0.0 < self.narrow_share <= 1.0:
            raise LaggardError(f"DiffConfig.narrow_share must be in (0, 1], got {self.narrow_share}")
        if not 1 <= self.max_parts <= 10:
            raise LaggardError(f"DiffConfig.max_parts must be 1-10 (2^(n+1) replays), got {self.max_parts}")
        for name in ("min_shared_types", "structure_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise LaggardError(f"DiffConfig.{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(kw_only=True, slots=True)
class _Match:
    """B's ops matched with A's cells (see the module)."""

    grain: str  # rank | stage | optype
    alt: np.ndarray  # per B op: its duration at A's level (B's own where not comparable)
    comparable: np.ndarray  # per B op: A has its cell
    type_code: np.ndarray  # per B op: op type index into ``types``
    types: list[str]
    factor: np.ndarray  # per B op: A's mean / B's mean over its cell (1 where not comparable)
    not_compared: list[str]
    notes: list[str]


@dataclass(kw_only=True, slots=True)
class _Part:
    selector: str | None
    what: str
    mask: np.ndarray


def diff(job_a: Job, job_b: Job, config: DiffConfig | None = None, *,
         on_progress: Callable[[int, int, str], None] | None = None) -> DiffResult:
    """Compare run B with run A (see the module). ``on_progress(done, total, what)``: the phase under way."""
    cfg = config or DiffConfig()
    report = on_progress or (lambda done, total, what: None)
    gaps = GapConfig(min_share_of_step=cfg.gap_share)
    report(0, 4, "modelling run A")
    base_a = prepare(job_a, gaps)
    report(1, 4, "modelling run B")
    base_b = prepare(job_b, gaps)
    t_a = float(replay_steps(base_a.graph, base_a.measured[:, None]).mean())
    t_b = float(replay_steps(base_b.graph, base_b.measured[:, None]).mean())
    m = match(base_a, base_b)
    if not m.comparable.any():
        raise LaggardError(f"{_where(job_a, 'A')} and {_where(job_b, 'B')} have no op type in common "
                           f"(A: {_few(base_a.names)}; B: {_few(base_b.names)}): nothing to compare")
    game = _Game(base_b, m.alt)
    report(2, 4, "choosing the parts that changed")
    parts = choose_parts(game, m, cfg)
    report(3, 4, "replaying B with A's durations, part by part")
    contributions, t_all = _attribute(game, m, parts, t_a, t_b, job_b)
    report(4, 4, "compared")
    change = t_b / t_a - 1.0 if t_a > 0 else float("nan")
    sum_a, sum_b = _summary(job_a, base_a, t_a), _summary(job_b, base_b, t_b)
    differs, warning = layout_mismatch(sum_a, sum_b, base_a, base_b, cfg)
    structure = sum(c.share for c in contributions if c.what == NOT_FROM_DURATIONS and c.selector is None)
    return DiffResult(
        a=sum_a, b=sum_b, change=change, T_b_as_a_s=t_all,
        grain=m.grain, contributions=sorted(contributions, key=lambda c: -c.share),
        not_compared=m.not_compared, notes=m.notes, within_noise=bool(abs(change) < cfg.min_change),
        layout_mismatch=differs, layout_warning=warning,
        structure_large=bool(abs(structure) > cfg.structure_share),
    )


class _Game:
    """Replays of B with chosen ops at A's level (one weight column per set of ops)."""

    def __init__(self, base: Baseline, alt: np.ndarray) -> None:
        self.base, self.alt = base, alt
        self.T = float(replay_steps(base.graph, base.measured[:, None]).mean())

    def step_time(self, masks: list[np.ndarray]) -> np.ndarray:
        """Mean step time of B with each mask's ops at A's level."""
        g = self.base.graph
        out = np.empty(len(masks))
        batch = _batch_size(g.num_ops, g.num_nodes, max(len(masks), 1))
        for i in range(0, len(masks), batch):
            part = masks[i : i + batch]
            w = np.where(np.stack(part, axis=1), self.alt[:, None], self.base.measured[:, None])
            out[i : i + len(part)] = replay_steps(g, w).mean(axis=0)
        return out

    def effect(self, masks: list[np.ndarray]) -> np.ndarray:
        """What A's level on each mask alone removes from B's step time (s; negative: it adds)."""
        return self.T - self.step_time(masks)


def _paths(job: Job) -> list[str]:
    """The paths the job was loaded from (none for a job built in memory)."""
    paths = job.load_args.get("paths") or [job.load_args.get("path")]
    return [str(p) for p in paths if p]


def _where(job: Job, side: str) -> str:
    shown = _paths(job)
    return f"{side} ({', '.join(shown)})" if shown else side


def _few(names: list[str], limit: int = 5) -> str:
    shown = sorted(set(names))
    return ", ".join(shown[:limit]) + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def _summary(job: Job, base: Baseline, t: float) -> RunSummary:
    return RunSummary(
        name=job.meta.name, source=job.meta.source, paths=_paths(job),
        layout=job.meta.parallel_sizes(), num_ranks=len(np.unique(base.rank)),
        num_steps=len(base.graph.steps), num_ops=base.num_traced_ops, T_s=t,
        measured_step_s=float(base.measured_step_s.mean()),
    )


# the sizes of a layout compared between the runs, in the order a layout is written
_SIZES = ("dp", "pp", "tp", "cp", "dsp", "ep", "vpp")


def _layout_words(s: RunSummary) -> str:
    """'dp 4 x pp 2 x tp 2 (16 ranks)': dp and pp, and the other sizes above 1."""
    sizes = [f"{k} {s.layout.get(k)}" for k in _SIZES if k in ("dp", "pp") or (s.layout.get(k) or 1) > 1]
    return " x ".join(sizes) + f" ({s.num_ranks} ranks)"


def _traced_types(base: Baseline) -> set[str]:
    """The op types of the trace (host ops of untraced gaps are named by position, which a layout moves)."""
    return {base.names[c] for c in np.unique(base.name_code[~base.is_host()]).tolist()}


def layout_mismatch(a: RunSummary, b: RunSummary, base_a: Baseline, base_b: Baseline,
                    cfg: DiffConfig) -> tuple[list[str], str | None]:
    """What differs between the two jobs ("ranks", "dp", "tp", ..., "op types") and the warning that
    says so (None when they are alike)."""
    differs = ["ranks"] if a.num_ranks != b.num_ranks else []
    differs += [k for k in _SIZES if (a.layout.get(k) or 1) != (b.layout.get(k) or 1)]
    types_a, types_b = _traced_types(base_a), _traced_types(base_b)
    union, shared = len(types_a | types_b), len(types_a & types_b)
    if union and shared < cfg.min_shared_types * union:
        differs.append("op types")
    if not differs:
        return [], None
    what = [f"A is {_layout_words(a)}, B is {_layout_words(b)}"] if differs != ["op types"] else []
    if "op types" in differs:
        what.append(f"only {shared} of their {union} op types are in both runs")
    return differs, "; ".join(what) + ": the attribution compares unlike jobs"


# ---------------------------------------------------------------- matching B's ops with A's


def _workers(base: Baseline) -> set[tuple[int, int, int]]:
    return set(zip(base.rank.tolist(), base.dp_rank.tolist(), base.pp_rank.tolist(), strict=True))


def _shape(base: Baseline) -> str:
    return f"dp {len(np.unique(base.dp_rank))} x pp {len(np.unique(base.pp_rank))}, {len(np.unique(base.rank))} ranks"


def grain_of(base_a: Baseline, base_b: Baseline) -> tuple[str, list[str]]:
    """The finest cell both runs share, and a note when it is not the rank."""
    if _workers(base_a) == _workers(base_b):
        return "rank", []
    if set(np.unique(base_a.pp_rank).tolist()) == set(np.unique(base_b.pp_rank).tolist()):
        return "stage", [f"the layouts differ (A: {_shape(base_a)}; B: {_shape(base_b)}): each op type is "
                         "compared per pipeline stage, as its mean duration per op (ranks are not matched)"]
    return "optype", [f"the pipelines differ (A: {_shape(base_a)}; B: {_shape(base_b)}): each op type is "
                      "compared over the whole job, as its mean duration per op (stages and ranks are not matched)"]


def _cell_keys(base: Baseline, code: np.ndarray, grain: str, num_stages: int, num_ranks: int) -> np.ndarray:
    st = base.pp_rank if grain in ("rank", "stage") else np.zeros_like(base.pp_rank)
    rk = base.rank if grain == "rank" else np.zeros_like(base.rank)
    return (code * num_stages + st) * num_ranks + rk


def _means(keys: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    uniq, inv = np.unique(keys, return_inverse=True)
    n = np.bincount(inv, minlength=len(uniq))
    return uniq, inv, np.bincount(inv, weights=w, minlength=len(uniq)) / np.maximum(n, 1)


def match(base_a: Baseline, base_b: Baseline) -> _Match:
    """Each op of B with A's mean over its cell (see the module)."""
    grain, notes = grain_of(base_a, base_b)
    types = sorted(set(base_a.names) | set(base_b.names))
    code_a = np.array([types.index(n) for n in base_a.names], dtype=np.int64)[base_a.name_code]
    code_b = np.array([types.index(n) for n in base_b.names], dtype=np.int64)[base_b.name_code]
    num_stages = int(max(base_a.pp_rank.max(), base_b.pp_rank.max())) + 1
    num_ranks = int(max(base_a.rank.max(), base_b.rank.max())) + 1
    keys_a = _cell_keys(base_a, code_a, grain, num_stages, num_ranks)
    keys_b = _cell_keys(base_b, code_b, grain, num_stages, num_ranks)
    uniq_a, _, mean_a = _means(keys_a, base_a.measured)
    uniq_b, inv_b, mean_b = _means(keys_b, base_b.measured)
    pos = np.minimum(np.searchsorted(uniq_a, uniq_b), len(uniq_a) - 1)
    found = uniq_a[pos] == uniq_b
    # a cell B spends no time in (zero-length ops) keeps its zeros: A's level of nothing is nothing
    factor_cell = np.where(found & (mean_b > 0), mean_a[pos] / np.where(mean_b > 0, mean_b, 1.0), 1.0)
    # to the 6 digits a --scale flag prints, so a part's command replays exactly what was attributed
    factor = np.array([float(f"{x:.6g}") for x in factor_cell.tolist()])[inv_b]
    comparable = found[inv_b]
    not_compared = _not_compared(types, code_a, code_b, comparable, grain)
    notes += _count_notes(types, code_a, code_b, base_a, base_b)
    return _Match(grain=grain, alt=base_b.measured * factor, comparable=comparable, type_code=code_b,
                  types=types, factor=factor, not_compared=not_compared, notes=notes)


def _not_compared(types: list[str], code_a: np.ndarray, code_b: np.ndarray, comparable: np.ndarray,
                  grain: str) -> list[str]:
    """Op types (or cells of them) one run has and the other lacks, in words, the most ops first
    (two unrelated jobs lack hundreds of each other's types: a reader sees the ones that weigh).
    Types that differ only by a trailing index (``host:backward-compute[3]``, one per pass) are one
    line: ``host:backward-compute[*]`` with their number."""
    import re

    cell = "rank" if grain == "rank" else "stage"
    in_a, in_b = set(np.unique(code_a).tolist()), set(np.unique(code_b).tolist())
    groups: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for side, codes, code in (("only in B", sorted(in_b - in_a), code_b), ("only in A", sorted(in_a - in_b), code_a)):
        for c in codes:
            key = (side, re.sub(r"\[\d+\]$", "[*]", types[c]))
            groups.setdefault(key, []).append((types[c], int((code == c).sum())))
    for c in sorted(in_a & in_b):
        lost = int((~comparable & (code_b == c)).sum())
        if lost:
            groups.setdefault((f"ops of B on a {cell} where A has none", types[c]), []).append((types[c], lost))
    out = []
    for (side, name), members in groups.items():
        n = sum(k for _, k in members)
        what = members[0][0] if len(members) == 1 else f"{name} ({len(members)} types)"
        if side.startswith("only"):
            out.append((n, f"{what}: {side} ({n:,} ops)"))
        else:
            out.append((n, f"{what}: {n:,} {side}"))
    return [text for _, text in sorted(out, key=lambda x: -x[0])]


def _count_notes(types: list[str], code_a: np.ndarray, code_b: np.ndarray, base_a: Baseline,
                 base_b: Baseline) -> list[str]:
    """Op types B runs more or fewer of per step and rank than A: a structural change (more
    microbatches, another schedule) that durations do not carry."""
    def per_step_rank(code: np.ndarray, base: Baseline) -> np.ndarray:
        n = np.bincount(code, minlength=len(types)).astype(np.float64)
        return n / (len(base.graph.steps) * len(np.unique(base.rank)))

    na, nb = per_step_rank(code_a, base_a), per_step_rank(code_b, base_b)
    both = (na > 0) & (nb > 0) & (np.abs(nb - na) > 1e-9 * np.maximum(na, nb))
    diffs = [f"{types[c]} ({na[c]:.3g} -> {nb[c]:.3g})" for c in np.flatnonzero(both).tolist()]
    if not diffs:
        return []
    shown = ", ".join(diffs[:6]) + (f" and {len(diffs) - 6} more" if len(diffs) > 6 else "")
    return [f"ops per step and rank differ (A -> B): {shown}; what more or fewer ops cost is not a duration "
            "change and counts as 'not from durations'"]


# ---------------------------------------------------------------- parts and their shares


def choose_parts(game: _Game, m: _Match, cfg: DiffConfig) -> list[_Part]:
    """The op types whose A level changes B's step most (alone or removed last), each narrowed to
    a stage, then a rank, that carries ``narrow_share`` of it; the rest is one part more."""
    codes = np.unique(m.type_code[m.comparable])
    masks = [m.comparable & (m.type_code == c) for c in codes.tolist()]
    alone = game.effect(masks)
    t_all = float(game.step_time([m.comparable])[0])
    last = game.step_time([m.comparable & ~mk for mk in masks]) - t_all
    strength = np.maximum(np.abs(alone), np.abs(last))
    floor = max(cfg.min_part * abs(game.T - t_all), 1e-9 * game.T)
    top = [i for i in np.argsort(-strength, kind="stable")[: cfg.max_parts].tolist() if strength[i] > floor]
    parts = [_Part(selector=f"optype={m.types[codes[i]]}", what=m.types[codes[i]], mask=masks[i]) for i in top]
    if m.grain != "optype":
        parts = [_narrow(game, p, e, "stage", game.base.pp_rank, cfg) for p, e in zip(parts, alone[top], strict=True)]
    if m.grain == "rank":  # within the stage named, or over the whole job (one stage: data parallel)
        parts = [_as_link(game.base, _narrow(game, p, None, "rank", game.base.rank, cfg)) for p in parts]
    named = np.zeros(len(m.alt), dtype=bool)
    for p in parts:
        named |= p.mask
    rest = m.comparable & ~named
    if (rest & (m.alt != game.base.measured)).any():
        num_types = len(np.unique(m.type_code[rest]))
        parts.append(_Part(selector=None, what=f"every other op type or place ({num_types} op types)", mask=rest))
    return parts


def _narrow(game: _Game, part: _Part, whole: float | None, key: str, labels: np.ndarray,
            cfg: DiffConfig) -> _Part:
    """``part`` on the one ``key`` value (stage or rank) that carries ``narrow_share`` of its change."""
    values = np.unique(labels[part.mask])
    if len(values) < 2:
        return part
    if whole is None:
        whole = float(game.effect([part.mask])[0])
    if abs(whole) <= 1e-12:
        return part
    masks = [part.mask & (labels == v) for v in values.tolist()]
    eff = game.effect(masks) * np.sign(whole)
    best = int(np.argmax(eff))
    if eff[best] < cfg.narrow_share * abs(whole):
        return part
    v = int(values[best])
    name = part.what.split(" on ")[0]
    sel = part.selector.split(",stage=")[0] if key == "rank" and part.selector else part.selector
    return _Part(selector=f"{sel},{key}={v}", what=f"{name} on {key} {v}", mask=masks[best])


def _as_link(base: Baseline, part: _Part) -> _Part:
    """A rank's point-to-point ops with one peer are a link: said so, and its selector names the peer."""
    if part.selector is None or ",rank=" not in part.selector:
        return part
    kinds = {base.kinds[int(k)] for k in np.unique(base.kind_code[part.mask])}
    peers = np.unique(base.job.column("peer")[part.mask])
    if not kinds <= {"p2p_send", "p2p_recv"} or len(kinds) != 1 or len(peers) != 1 or peers[0] < 0:
        return part
    rank, peer = int(part.selector.rsplit("=", 1)[1]), int(peers[0])
    src, dst = (rank, peer) if kinds == {"p2p_send"} else (peer, rank)
    name = part.what.split(" on ")[0]
    return _Part(selector=f"{part.selector},peer={peer}", what=f"{name} on link {src} -> {dst}", mask=part.mask)


def _attribute(game: _Game, m: _Match, parts: list[_Part], t_a: float, t_b: float,
               job_b: Job) -> tuple[list[Contribution], float]:
    """Shapley shares of the parts over every subset replayed, plus 'not from durations'."""
    n = len(parts)
    subsets = [_union(parts, s) for s in range(1, 1 << n)]
    t_sub = np.concatenate([[game.T], game.step_time(subsets)]) if n else np.array([game.T])
    v = game.T - t_sub  # v[S]: what A's level on the parts of S removes from B's step
    phi = shapley(v.tolist(), list(range(n)))
    delta = t_b - t_a
    t_all = float(t_sub[(1 << n) - 1]) if n else game.T

    def share(x: float) -> float:
        return x / delta if delta != 0 else 0.0

    out = []
    for i, p in enumerate(parts):
        flags = _scale_flags(game.base, m, p) if p.selector is not None else []
        out.append(Contribution(
            selector=p.selector, what=p.what, share=share(phi[i]), alone=share(float(v[1 << i])),
            delta_s=phi[i], num_ops=int(p.mask.sum()), changes=flags, duration_change=_duration_change(game, p.mask),
            command=_command(job_b, flags) if flags else None))
    residual = t_all - t_a
    if abs(residual) > 1e-9 * max(t_a, t_b):
        out.append(Contribution(
            selector=None, what=NOT_FROM_DURATIONS,
            share=share(residual) if delta != 0 else 0.0, alone=float("nan"), delta_s=residual,
            num_ops=int((~m.comparable).sum())))
    return out, t_all


def _duration_change(game: _Game, mask: np.ndarray) -> float:
    at_a = float(game.alt[mask].sum())
    return float(game.base.measured[mask].sum()) / at_a - 1.0 if at_a > 0 else float("nan")


def _union(parts: list[_Part], subset: int) -> np.ndarray:
    mask = np.zeros(len(parts[0].mask), dtype=bool)
    for i, p in enumerate(parts):
        if subset >> i & 1:
            mask |= p.mask
    return mask


def _scale_flags(base: Baseline, m: _Match, part: _Part) -> list[str]:
    """The ``--scale`` flags that put ``part``'s ops at A's level: one per rank (or stage) cell."""
    if m.grain == "optype":
        f = np.unique(m.factor[part.mask])
        return ["--scale", f"{part.selector}:{float(f[0]):.6g}"] if len(f) == 1 else []
    key = base.rank if m.grain == "rank" else base.pp_rank
    word = "rank" if m.grain == "rank" else "stage"
    sel = (part.selector or "").split(",")[0]
    flags = []
    for v in np.unique(key[part.mask]).tolist():
        f = np.unique(m.factor[part.mask & (key == v)])
        if len(f) != 1:
            return []
        if f[0] == 1.0:  # A's level is B's: nothing to change
            continue
        flags += ["--scale", f"{sel},{word}={v}:{float(f[0]):.6g}"]
    return flags


def _command(job_b: Job, flags: list[str]) -> str:
    from laggard.whatif.custom import whatif_command

    return whatif_command(job_b.load_args, flags + ["--gap-share", "0"])


__all__ = ["DiffConfig", "choose_parts", "diff", "grain_of", "layout_mismatch", "match"]
