"""The demo job's mitigation switches, end to end on real ranks (correctness, never timings):
planned GC collects on every rank at the same steps, an explicit split puts the blocks where it
says, and sequence balancing deals the same sequences over microbatches of more even cost."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from laggard.demo.launch import JobConfig, load_example, run_jobs
from laggard.groundtruth.inject import parse_injections

pytestmark = pytest.mark.timeout(90)

STEPS = 6


def _cost(lens: list[int], d: int) -> float:
    return float(sum(2.0 * n * n + 12.0 * d * n for n in lens))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from laggard.io import load_job

    base = tmp_path_factory.mktemp("mitigate-demo")
    cfgs = {
        "gc": JobConfig.quick(injections=parse_injections(["gc-pauses:prob=0.3,pause_ms=20"]), planned_gc=2),
        "split": JobConfig.quick(injections=parse_injections(["heavy-last-stage:factor=2"]), layers_per_stage=[3, 1]),
        "balance": JobConfig.quick(injections=parse_injections(["seqlen-imbalance:sigma=0.8"]),
                                   balance_sequences=True),
    }
    for name, cfg in cfgs.items():
        cfg.steps, cfg.trace_dir = STEPS, str(base / name)
    results = run_jobs(list(cfgs.values()))
    out = {}
    for (name, cfg), res in zip(cfgs.items(), results, strict=True):
        assert res.ok, (name, res.failures)
        out[name] = {"cfg": cfg, "result": res, "job": load_job(Path(cfg.trace_dir))}
    return out


def test_planned_gc_collects_on_every_rank_at_the_same_steps(runs: dict) -> None:
    res, job = runs["gc"]["result"], runs["gc"]["job"]
    plans = [res.ranks[r]["planned_gc"] for r in range(4)]
    assert all(p["collection_steps"] == plans[0]["collection_steps"] for p in plans)
    assert all(p["frozen"] and p["num_unplanned"] == 0 for p in plans)  # no rank collected alone
    # in the trace: gc ops on every rank, at the same steps (every 2nd step after the warm-up's freeze)
    t = job.table
    names, ranks, steps = (np.asarray(t.column(c).to_pylist()) for c in ("name", "rank", "step"))
    by_rank = {int(r): sorted(set(steps[(names == "gc") & (ranks == r)].tolist())) for r in range(4)}
    assert by_rank[0], "no collection was traced"
    assert all(v == by_rank[0] for v in by_rank.values()), by_rank
    assert job.meta.extra["planned_gc"] == 2


def test_layers_per_stage_places_the_blocks(runs: dict) -> None:
    res, job = runs["split"]["result"], runs["split"]["job"]
    assert [res.ranks[r]["num_blocks"] for r in range(4)] == [3, 1, 3, 1]  # rank = dp * pp + stage
    assert job.meta.extra["layers_per_stage"] == [3, 1]


def test_balanced_microbatches_hold_the_same_sequences_at_more_even_cost(runs: dict) -> None:
    cfg, job = runs["balance"]["cfg"], runs["balance"]["job"]
    t = job.table
    sel = [i for i, (n, p) in enumerate(zip(t.column("name").to_pylist(), t.column("pp_rank").to_pylist(),
                                            strict=True)) if n == "forward-compute" and p == 0]
    rows = t.take(sel).select(["step", "dp_rank", "microbatch", "seq_lens", "num_tokens"]).to_pylist()
    balanced: dict[int, list[list[int]]] = defaultdict(list)
    for r in rows:
        assert sum(r["seq_lens"]) == r["num_tokens"]  # one packed row of exactly those sequences
        balanced[r["step"]].append(r["seq_lens"])
    # the same steps without balancing: microbatch (dp, mb) holds batch_size sequences of one length
    data = load_example().Batches(cfg, 0.8)
    data.balanced = False
    assert len(balanced) == STEPS
    for step, mbs in balanced.items():
        assert len(mbs) == cfg.dp * cfg.microbatches
        in_order = [[data.seq_len(step, d, m)] * cfg.batch_size for d in range(cfg.dp) for m in range(cfg.microbatches)]
        assert sorted(n for mb in mbs for n in mb) == sorted(n for mb in in_order for n in mb)  # each once
        before = [_cost(mb, cfg.d_model) for mb in in_order]
        after = [_cost(mb, cfg.d_model) for mb in mbs]
        assert max(after) / np.mean(after) <= max(before) / np.mean(before) + 1e-9
        # within 15% of the mean, or of the one sequence too long to share a microbatch
        assert max(after) <= 1.15 * max(np.mean(after), max(_cost([n], cfg.d_model) for mb in mbs for n in mb))
