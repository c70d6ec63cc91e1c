"""Check a real corpus's truth files against the raw Tracer shards (pyarrow only, none of laggard's
analysis): is each injected cause in the trace where and as strong as truth.json says?

    python benchmarks/corpus_check.py out/corpus [job003 job007 ...]

Per cause, measured from the op rows (median over the traced steps):
* slow-worker / heavy-stage: forward + backward compute per step of the target ranks over that of
  their peers (the other DP replicas of the stage; with dp 1 the other stages), and over the same
  rank in the corpus's clean jobs of the same layout; and the CPU time per step the job measured
  itself (truth.json) over the peers' (expected: the factor; with more ranks than cores the peers'
  traced compute is stretched by waiting for a core, which CPU time is not);
* host-stall: idle time before the rank's first forward of a step (stalled vs other steps; expected: ms);
* slow-link: the link's sends and its receives against the others' (expected: delay_ms more, in the sends for a
  sleep before each send, in the receives for a link shaped in the network);
* launch-delay: idle time before each compute op (expected: ms);
* gc-pauses: traced gc ops over 5 ms, their count and median (expected: pause_ms at prob x forwards);
* seqlen-imbalance: max / min tokens of a forward pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

COLUMNS = ["rank", "step", "name", "kind", "start_ns", "dur_ns", "microbatch", "peer", "num_tokens"]


def load_ops(trace_dir: Path) -> dict[str, np.ndarray]:
    tables = [pq.read_table(f, columns=COLUMNS) for f in sorted(trace_dir.glob("ops-rank*.parquet"))]
    t = pa.concat_tables(tables)
    out = {c: t.column(c).to_numpy() for c in ("rank", "step", "start_ns", "dur_ns", "microbatch", "peer")}
    out["name"] = np.asarray(pc.cast(t.column("name"), pa.string()).to_numpy(zero_copy_only=False))
    out["kind"] = np.asarray(pc.cast(t.column("kind"), pa.string()).to_numpy(zero_copy_only=False))
    out["num_tokens"] = t.column("num_tokens").fill_null(0).to_numpy()
    return out


def compute_ms(ops: dict) -> dict[int, float]:
    """Median over steps of each rank's forward + backward compute (ms per step), less the GC pauses
    the tracer recorded inside them (a collection runs inside the forward pass it interrupts)."""
    fb = np.isin(ops["name"], ["forward-compute", "backward-compute"])
    gc = ops["name"] == "gc"
    end = ops["start_ns"] + ops["dur_ns"]
    out = {}
    for r in np.unique(ops["rank"]):
        m, g = fb & (ops["rank"] == r), np.flatnonzero(gc & (ops["rank"] == r))
        dur = ops["dur_ns"][m].astype(float)
        starts, ends = ops["start_ns"][m], end[m]
        order = np.argsort(starts)
        k = np.searchsorted(starts[order], ops["start_ns"][g], side="right") - 1  # the compute op a pause is in
        inside = (k >= 0) & (end[g] <= ends[order][np.maximum(k, 0)])
        np.subtract.at(dur, order[k[inside]], ops["dur_ns"][g][inside])
        steps, inv = np.unique(ops["step"][m], return_inverse=True)
        out[int(r)] = float(np.median(np.bincount(inv, weights=dur))) / 1e6
    return out


def idle_before_ms(ops: dict, sel: np.ndarray) -> np.ndarray:
    """For each selected op: time since the end of the last op of its rank and step that ended before it."""
    end = ops["start_ns"] + ops["dur_ns"]
    out = []
    for i in np.flatnonzero(sel):
        same = (ops["rank"] == ops["rank"][i]) & (ops["step"] == ops["step"][i]) & (end <= ops["start_ns"][i])
        out.append((ops["start_ns"][i] - end[same].max()) / 1e6 if same.any() else np.nan)
    return np.array(out)


def _ratio(comp: dict[int, float], ranks: list[int], peers: list[int]) -> float:
    return float(np.median([comp[r] for r in ranks]) / np.median([comp[r] for r in peers])) if peers else float("nan")


def check_cause(c: dict, ops: dict, truth: dict, clean_comp: dict[int, float] | None) -> str:
    dp, pp = truth["layout"]["dp"], truth["layout"]["pp"]
    cause, t = c["cause"], c["target"]
    if cause in ("slow-worker", "heavy-stage"):
        comp = compute_ms(ops)
        ranks = t["ranks"]
        stages = {r % pp for r in ranks}
        peers = [r for r in comp if r not in ranks and (dp == 1 or r % pp in stages)]
        vs_clean = _ratio(comp, ranks, []) if not clean_comp else float(
            np.median([comp[r] / clean_comp[r] for r in ranks]))
        cpu = {int(r): v for r, v in truth["measured"]["cpu_ms_by_rank"].items()}
        return (f"expected x{c['factor']:.3f}: traced compute x{_ratio(comp, ranks, peers):.3f} of its peers {peers} "
                f"(x{vs_clean:.3f} of the same rank in clean jobs of the layout); CPU time per step (the job's own "
                f"thread_time) x{_ratio(cpu, ranks, peers):.3f} of the peers'")
    if cause == "host-stall":
        r, every = t["ranks"][0], c["every"]
        first = (ops["rank"] == r) & (ops["name"] == "forward-compute") & (ops["microbatch"] == 0)
        idle = idle_before_ms(ops, first)
        stalled = ops["step"][first] % every == 0
        other = np.median(idle[~stalled]) if (~stalled).any() else float("nan")
        return (f"expected {c['spec'].split('ms=')[1].split(',')[0]} ms every {every} step(s): idle before the first "
                f"forward {np.median(idle[stalled]):.1f} ms in {int(stalled.sum())} stalled steps, {other:.1f} ms in "
                f"{int((~stalled).sum())} others")
    if cause == "slow-link":
        src, dst = t["link"]
        params = dict(kv.split("=") for kv in c["spec"].split(":", 1)[1].split(","))
        sends, recvs = ops["kind"] == "p2p_send", ops["kind"] == "p2p_recv"
        on = sends & (ops["rank"] == src) & (ops["peer"] == dst)
        on_r = recvs & (ops["rank"] == dst) & (ops["peer"] == src)
        ms = {k: np.median(ops["dur_ns"][m]) / 1e6 for k, m in
              (("send", on), ("other sends", sends & ~on), ("recv", on_r), ("other recvs", recvs & ~on_r))}
        # a sleep before the send shows in the sender's send; a link shaped in the network (shaped=1) in
        # the receiver's recv
        return (f"expected +{params['delay_ms']} ms{' (shaped)' if params.get('shaped') == '1' else ''}: sends "
                f"{src}->{dst} {ms['send']:.1f} ms (median of {int(on.sum())}), "
                f"other sends {ms['other sends']:.1f} ms; "
                f"receives {dst}<-{src} {ms['recv']:.1f} ms, other receives {ms['other recvs']:.1f} ms")
    if cause == "launch-delay":
        idle = idle_before_ms(ops, ops["kind"] == "compute")
        return f"expected {c['spec'].split('ms=')[1]} ms: idle before a compute op {np.nanmedian(idle):.1f} ms (median)"
    if cause == "gc-pauses":
        gc = (ops["name"] == "gc") & (ops["dur_ns"] > 5e6)
        fwd = int((ops["name"] == "forward-compute").sum())
        med = np.median(ops["dur_ns"][gc]) / 1e6 if gc.any() else float("nan")
        return f"expected {c['spec']}: {int(gc.sum())} gc ops over 5 ms in {fwd} forwards, median {med:.1f} ms"
    if cause == "seqlen-imbalance":
        tok = ops["num_tokens"][ops["name"] == "forward-compute"]
        return f"expected lengths spread (sigma {c['spec'].split('=')[1]}): tokens per forward {tok.min()}-{tok.max()}"
    return "no check"


def main(argv: list[str]) -> int:
    corpus, only = Path(argv[0]), set(argv[1:])
    truths = {p.parent.name: json.loads(p.read_text()) for p in sorted(corpus.glob("job*/truth.json"))}
    clean_by_layout: dict[str, list[dict[int, float]]] = {}
    for job, tr in truths.items():
        if tr["clean"]:
            clean_by_layout.setdefault(tr["layout"]["name"], []).append(compute_ms(load_ops(corpus / job / "trace")))
    for job, tr in truths.items():
        if only and job not in only:
            continue
        ops = load_ops(corpus / job / "trace")
        comp = compute_ms(ops)
        cleans = clean_by_layout.get(tr["layout"]["name"])
        ref = {r: float(np.median([c[r] for c in cleans])) for r in comp} if cleans else None
        print(f"{job} {tr['layout']['name']}: compute ms per step by rank "
              + ", ".join(f"{r}: {v:.0f}" for r, v in comp.items())
              + f"; wall step ms {tr['measured']['step_ms_by_rank']}")
        for c in tr["causes"] or [{"cause": "clean", "spec": "clean"}]:
            print(f"  {c['spec']}: " + (check_cause(c, ops, tr, ref) if c["cause"] != "clean" else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
