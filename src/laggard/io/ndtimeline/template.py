"""The dependency model of one NDTimeline pipeline instance (all stages of one DP rank in one step),
derived from its observed op order by the 1F1B rules listed in :mod:`laggard.io.ndtimeline.load`.

One builder per instance; each concept is a method: the compute stream and its p2p ops
(``compute_and_p2p``), the DP communication stream (``dp_comm``) and the step's tail
(``tail``: gc, layernorm / embedding all-reduces, gradient sync, clip, optimizer).
"""

from __future__ import annotations

import numpy as np

from laggard.errors import LaggardError
from laggard.optable.template import Template

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
# Tolerance on timestamps when deciding whether a p2p op belongs to a compute (clock skew), seconds.
_EPS_S = 5e-5




def build_template(stage, code, seq, start, end, mc, gmc, mb, labels, num_pp, vpp, where) -> Template:
    """Derive the dependency model of one pipeline instance from its observed op order."""
    b = _Builder(stage, [labels[c] for c in code], seq, start, end, mc, gmc, mb, num_pp * vpp, where)
    for s in range(num_pp):
        comp = b.compute_and_p2p(s, num_pp)
        rss = b.dp_comm(s, comp)
        b.tail(s, comp, rss, num_pp)
    return b.template()


class _Builder:
    """Dependencies and communication groups of one instance's ops, filled stage by stage."""

    def __init__(self, stage, name, seq, start, end, mc, gmc, mb, total_chunks: int, where: str) -> None:
        num_t = len(stage)
        self.stage, self.name, self.total_chunks, self.where = stage, name, total_chunks, where
        # the loops below read one op at a time: Python lists, not numpy scalars (several times faster)
        self.seq, self.start, self.end = seq.tolist(), start.tolist(), end.tolist()
        self.mc, self.gmc, self.mb = mc.tolist(), gmc.tolist(), mb.tolist()
        self.at: dict[tuple[int, str, int], int] = {}
        self.by_stage: dict[int, list[int]] = {}  # each stage's ops, in order
        for t, (st, sq) in enumerate(zip(stage.tolist(), self.seq, strict=True)):
            k = (st, name[t], sq)
            if k in self.at:
                raise LaggardError(f"{where}: op {name[t]} seq_id {sq} appears twice on stage {st} in one step")
            self.at[k] = t
            self.by_stage.setdefault(st, []).append(t)
        self.deps: list[list[int]] = [[] for _ in range(num_t)]
        self.scope: list[str | None] = [None] * num_t
        self.label: list[str | None] = [None] * num_t
        self.gseq = [-1] * num_t
        self.peer_stage = [-1] * num_t
        self.micro = mb.astype(np.int64).copy()
        self.has_sep = SEP in name

    def _sort_key(self, t: int):
        return (self.start[t], self.seq[t], self.name[t])

    def _chain(self, ts: list[int]) -> None:
        for a, b in zip(ts, ts[1:], strict=False):
            self.deps[b].append(a)

    def _mine(self, s: int) -> list[int]:
        return list(self.by_stage.get(s, []))

    def compute_and_p2p(self, s: int, num_pp: int) -> list[int]:
        """Stage ``s``'s compute stream in observed order, its p2p ops tied to their computes and
        paired across stages; returns the computes."""
        name, start, end, seq, at, deps = self.name, self.start, self.end, self.seq, self.at, self.deps
        where, total_chunks = self.where, self.total_chunks
        mine = self._mine(s)
        comp = sorted((t for t in mine if name[t] in (FWD, BWD)), key=self._sort_key)
        if not comp:
            raise LaggardError(f"{where}: stage {s} has no forward/backward compute ops in the reference step")
        self._chain(comp)
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
                ops_k = sorted((t for t in mine if name[t] == oname), key=self._sort_key)
                self._chain(ops_k)  # one stream per p2p op type
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
                    peer_chunk = int(self.gmc[c]) + delta
                    self.micro[t] = self.mb[c]
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
                self.scope[t], self.label[t], self.gseq[t] = "local", f"p2p-{direction}:pp{src}>pp{dst}", k
                self.peer_stage[t] = dst if kind == "send" else src
        # the first backward send/recv waits for the second-to-last warm-up forward
        first_bwd = next((i for i, t in enumerate(comp) if name[t] == BWD), None)
        if first_bwd is not None and first_bwd >= 2:
            anchor = comp[first_bwd - 2]
            for oname in ("backward-recv", "backward-send"):
                t0 = at.get((s, oname, 0))
                if t0 is not None:
                    deps[t0].append(anchor)
        return comp

    def dp_comm(self, s: int, comp: list[int]) -> list[int]:
        """Stage ``s``'s DP communication stream and its links to compute; returns the
        reduce-scatters in seq order."""
        name, mc, start, end, deps, seq = self.name, self.mc, self.start, self.end, self.deps, self.seq
        mine = self._mine(s)
        dpc = sorted((t for t in mine if name[t] in (AG, RS)), key=self._sort_key)
        self._chain(dpc)
        for t in mine:
            if name[t] in (AG, RS, SEP):
                self.scope[t], self.label[t], self.gseq[t] = "dp", f"dp:pp{s}:{name[t]}", int(seq[t])
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
        if self.has_sep:
            done = set()
            for t in rss:
                if mc[t] in done:
                    continue
                bw = [c for c in comp if name[c] == BWD and mc[c] == mc[t]]
                if bw:
                    deps[t].append(max(bw, key=lambda c: end[c]))
                done.add(int(mc[t]))
        return rss

    def tail(self, s: int, comp: list[int], rss: list[int], num_pp: int) -> None:
        """The step's tail: gc -> layernorm -> embedding -> (grads sync) -> clip -> optimizer."""
        at, deps = self.at, self.deps
        last_compute = max(comp, key=lambda t: self.end[t])
        gc_t = at.get((s, GC, 0))
        if gc_t is not None:
            deps[gc_t].append(last_compute)
        head = [gc_t if gc_t is not None else last_compute]
        emb = [at.get((s, EMB, 0))] if s in (0, num_pp - 1) else []
        if self.has_sep:
            if rss:
                head.append(rss[-1])
            tail = [at.get((s, LN, 0)), *emb, at.get((s, SEP, 0)), at.get((s, CLIP, 0)), at.get((s, OPT, 0))]
        else:
            tail = [at.get((s, LN, 0)), *emb, *rss, at.get((s, CLIP, 0)), at.get((s, OPT, 0))]
        tail = [t for t in tail if t is not None]
        if tail:
            deps[tail[0]].extend(head)
            self._chain(tail)
        emb_t = at.get((s, EMB, 0))
        if emb_t is not None and s in (0, num_pp - 1):
            self.scope[emb_t], self.label[emb_t], self.gseq[emb_t] = "local", "embedding", 0
        clip_t = at.get((s, CLIP, 0))
        if clip_t is not None:
            self.scope[clip_t], self.label[clip_t], self.gseq[clip_t] = "world", f"world:{CLIP}", 0

    def template(self) -> Template:
        return Template(
            stage=np.asarray(self.stage, dtype=np.int64),
            name=self.name,
            kind=[OPTYPES[x][0] for x in self.name],
            stream=[OPTYPES[x][1] for x in self.name],
            microbatch=self.micro,
            vchunk=np.asarray(self.mc, dtype=np.int64),
            deps=[sorted(set(d)) for d in self.deps],
            scope=self.scope,
            label=self.label,
            gseq=self.gseq,
            peer_stage=self.peer_stage,
        )
