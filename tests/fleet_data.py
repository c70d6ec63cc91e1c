"""A synthetic fleet for the fleet tests and benchmark: synthetic 1F1B jobs with injected causes
(truth.json beside each, from the generator), mixed sizes, plus broken jobs with known faults."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from laggard.groundtruth.evaluate import CAUSE_OF_INJECTION

# one injection per kind of job, well above the diagnosis' detection floors (laggard.groundtruth.evaluate.FLOORS)
KINDS: tuple[str | None, ...] = (
    None,
    "slow-worker:rank={rank},factor=2.5",
    "heavy-last-stage:factor=3",
    "seqlen-imbalance:sigma=0.7",
    "gc-pauses:prob=0.1,pause_ms=60",
    "slow-link:src=0,dst=1,delay_ms=15",
    "launch-delay:ms=4",
)
SIZES = ((2, 2), (4, 2), (2, 4), (8, 2), (4, 4))  # (dp, pp)


def make_synthetic(root: Path, num_jobs: int, *, seed: int = 0, steps: tuple[int, int] = (4, 6)) -> dict[str, str]:
    """``num_jobs`` native jobs under ``root``; returns job dir -> expected top cause ('healthy' if clean)."""
    from laggard.groundtruth.inject import parse_injection
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth
    from laggard.optable.ops import write_native
    from laggard.report.jsonout import dump_json

    rng = np.random.default_rng(seed)
    truth: dict[str, str] = {}
    for i in range(num_jobs):
        dp, pp = SIZES[i % len(SIZES)]
        kind = KINDS[i % len(KINDS)]
        if kind and kind.startswith("slow-link"):
            # the diagnosis blames a link when it stands out from the other links of its op type:
            # with 2 DP ranks there is one other link, no peer median to stand out from
            dp = max(dp, 4)
        spec = kind.format(rank=int(rng.integers(dp * pp))) if kind else None
        cfg = SynthConfig(dp=dp, pp=pp, microbatches=4, steps=int(rng.integers(steps[0], steps[1] + 1)),
                          seed=int(rng.integers(1 << 30)))
        res = synthesize_with_truth(cfg, [parse_injection(spec)] if spec else [])
        d = root / f"group{i % 3}" / f"job{i:04d}"
        write_native(res.job, d)
        dump_json(res.truth, d / "truth.json")
        truth[str(d.resolve())] = _expected(res.truth)
    return truth


def _expected(truth: dict) -> str:
    inj = truth["injections"]
    return CAUSE_OF_INJECTION[inj[0]["cause"]] if inj else "healthy"


def make_broken(root: Path, nd_dir: Path, kineto_dir: Path) -> dict[str, str]:
    """Jobs with known faults (and two real traces); returns job id -> expected status and a word of its reason."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth
    from laggard.optable.ops import write_native

    out: dict[str, str] = {}
    good = synthesize_with_truth(SynthConfig(dp=2, pp=2, microbatches=4, steps=4, seed=7), []).job
    d = root / "broken" / "garbage-shard"
    write_native(good, d)
    for shard in d.glob("*.parquet"):
        shard.write_bytes(b"not parquet at all")
    out[str(d.resolve())] = "error:not a readable Parquet file"
    d = root / "broken" / "no-shards"
    write_native(good, d)
    for shard in d.glob("*.parquet"):
        shard.unlink()
    out[str(d.resolve())] = "error:no *.parquet op shards"
    d = root / "broken" / "bad-json"
    write_native(good, d)
    (d / "job.json").write_text("{ truncated")
    out[str(d.resolve())] = "error:not valid JSON"
    d = root / "broken" / "empty-kineto"
    d.mkdir(parents=True)
    (d / "rank0.json").write_text("")
    out[str(d.resolve())] = "error:"
    # one step only: analyzed, rejected
    d = root / "broken" / "one-step"
    write_native(synthesize_with_truth(SynthConfig(dp=2, pp=2, microbatches=4, steps=1, seed=3), []).job, d)
    out[str(d.resolve())] = "rejected:too few steps"
    # a trace whose ops overlap where the dependencies say they cannot (start times squeezed to
    # 60%): the replay takes longer than the traced steps
    d = root / "broken" / "squeezed"
    write_native(good, d)
    for shard in d.glob("*.parquet"):
        t = pq.read_table(shard)
        s = t.column("start_ns").to_numpy()
        i = t.schema.get_field_index("start_ns")
        t = t.set_column(i, "start_ns", pa.array((s.min() + (s - s.min()) * 0.6).astype(np.int64)))
        pq.write_table(t, shard)
    out[str(d.resolve())] = "rejected:replay fidelity"
    # the published NDTimeline trace (a slow last stage) with its metadata, and a real profiler job
    d = root / "real" / "nd"
    d.mkdir(parents=True)
    shutil.copy(nd_dir / "trace-ST.parquet", d)
    shutil.copy(nd_dir / "meta-ST.yaml", d)
    out[str((d / "trace-ST.parquet").resolve())] = "ok:"
    k = root / "real" / "ddp_gloo"
    shutil.copytree(kineto_dir, k)
    out[str(k.resolve())] = "ok:"
    json.dumps(out)
    return out
