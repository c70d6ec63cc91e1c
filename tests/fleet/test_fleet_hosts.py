"""The fleet's per-host view (``laggard.fleet.hosts``) on a fleet the test builds: 10 synthetic jobs
(dp 4 x pp 2, two ranks per host) drawn over 12 hosts; ``lemon`` runs in 6 of them and one of its
ranks is slow (2.5x) in 4; ``flaky`` is slow in 1 job; the rest are healthy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from laggard.fleet import run_fleet
from laggard.fleet.config import FleetConfig
from laggard.fleet.hosts import HOSTS_SCHEMA, host_view
from tests.conftest import run_cli

NUM_JOBS = 10
LEMON_JOBS = (0, 2, 5, 7)  # jobs in which lemon is slow
LEMON_IDLE = (3, 8)  # jobs lemon runs in, healthy
FLAKY_JOB = 4


def _make_fleet(root: Path) -> dict[int, list[str]]:
    """The jobs under ``root``; returns job index -> host of each pair of ranks."""
    from laggard.groundtruth.inject import parse_injection
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth
    from laggard.optable.ops import write_native

    rng = np.random.default_rng(28)
    others = [f"node{i:02d}" for i in range(10)]
    placement = {}
    for j in range(NUM_JOBS):
        hosts = list(rng.choice(others, size=4, replace=False))
        inject = []
        if j in LEMON_JOBS or j in LEMON_IDLE:
            slot = int(rng.integers(4))
            hosts[slot] = "lemon"
            if j in LEMON_JOBS:
                inject = [parse_injection(f"slow-worker:rank={2 * slot + int(rng.integers(2))},factor=2.5")]
        elif j == FLAKY_JOB:
            hosts[1] = "flaky"
            inject = [parse_injection("slow-worker:rank=3,factor=2.5")]
        job = synthesize_with_truth(SynthConfig(dp=4, pp=2, microbatches=4, steps=5, seed=100 + j), inject).job
        job.meta.extra["hosts"] = [{"rank": r, "host": hosts[r // 2], "gpu_uuid": f"GPU-{hosts[r // 2]}-{r % 2}"}
                                   for r in range(8)]
        write_native(job, root / f"job{j:02d}")
        placement[j] = hosts
    return placement


@pytest.fixture(scope="module")
def fleet_out(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hosts")
    _make_fleet(root / "jobs")
    run_fleet([root / "jobs"], root / "out", workers=0)
    return root / "out"


def test_the_lemon_is_ranked_first_and_chronic(fleet_out):
    view = host_view(fleet_out / "fleet.parquet", FleetConfig())
    assert view.num_jobs_with_hosts == NUM_JOBS and view.num_jobs_without_hosts == 0
    top = view.hosts[0]
    assert top.host == "lemon" and top.verdict == "chronic"
    assert top.num_jobs == len(LEMON_JOBS) + len(LEMON_IDLE) and top.num_named == len(LEMON_JOBS)
    assert sorted(top.named_jobs) == sorted(str(fleet_out.parent / "jobs" / f"job{j:02d}") for j in LEMON_JOBS)
    assert top.causes == {"worker": len(LEMON_JOBS)} and top.gpus == {"GPU-lemon-0", "GPU-lemon-1"}
    flaky = next(h for h in view.hosts if h.host == "flaky")
    assert flaky.verdict == "one-off" and flaky.num_named == 1 and view.hosts.index(flaky) == 1
    assert top.gpu_hours_cost > 2 * flaky.gpu_hours_cost > 0
    assert all(h.verdict == "clean" and h.gpu_hours_cost == 0 for h in view.hosts[2:])
    # the cost is each job's waste split over its findings: the lemon's is at most its jobs' waste
    rows = pq.read_table(fleet_out / "fleet.parquet", columns=["job", "gpu_hours_wasted"]).to_pylist()
    wasted = sum(r["gpu_hours_wasted"] for r in rows if r["job"] in top.named_jobs)
    assert 0.5 * wasted < top.gpu_hours_cost <= wasted + 1e-12


def test_stricter_chronic_rule_makes_it_occasional(fleet_out):
    view = host_view(fleet_out / "fleet.parquet", FleetConfig(chronic_min_jobs=5))
    assert view.hosts[0].host == "lemon" and view.hosts[0].verdict == "occasional"


def test_cli_writes_hosts_parquet_html_and_summary(fleet_out, tmp_path, capsys):
    jobs = fleet_out.parent / "jobs"
    assert run_cli("fleet", jobs, "--out", tmp_path / "o", "--workers", "0") == 0
    term = capsys.readouterr().out
    t = pq.read_table(tmp_path / "o" / "hosts.parquet")
    assert t.schema.equals(HOSTS_SCHEMA)
    first = t.slice(0, 1).to_pylist()[0]
    assert (first["rank"], first["host"], first["verdict"], first["num_named"]) == (1, "lemon", "chronic", 4)
    html = (tmp_path / "o" / "fleet.html").read_text()
    assert 'id="hosts"' in html and "lemon" in html and "chronic" in html
    summary = json.loads((tmp_path / "o" / "fleet-summary.json").read_text())
    assert summary["hosts"]["hosts"][0]["host"] == "lemon"
    assert "lemon" in term and "chronic" in term


def test_fleet_without_host_names(tmp_path):
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth
    from laggard.optable.ops import write_native

    write_native(synthesize_with_truth(SynthConfig(dp=2, pp=2, microbatches=4, steps=4, seed=1), []).job,
                 tmp_path / "j")
    run_fleet([tmp_path / "j"], tmp_path / "out", workers=0)
    view = host_view(tmp_path / "out" / "fleet.parquet")
    assert view.hosts == [] and view.num_jobs_without_hosts == 1
