"""A slow input pipeline in a PyTorch-profiler trace: a real 2-rank DDP job (gloo, ``tests/kineto_ddp.py``)
whose rank 1's DataLoader sleeps 40 ms in its collate function every batch. torch.profiler records each
``next()`` as an ``enumerate(DataLoader)#...`` annotation; the importer makes it a ``data-wait`` op, as
the Tracer names the same wait, so the diagnosis says "slow input pipeline", not "slow worker". The
truth is the program's own sleep, not anything the analysis computed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kineto_ddp import make_traces_in_subprocess

pytestmark = pytest.mark.timeout(300)
DELAY_MS = 40.0


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_traces_in_subprocess(tmp_path_factory.mktemp("loader") / "prof", world=2, slow_rank=1, steps=6,
                                     extra_matmuls=0, loader_delay_ms=DELAY_MS)


def test_dataloader_fetches_become_data_wait_ops(trace: Path) -> None:
    from laggard.io import load_job

    t = load_job(trace).table.to_pydict()
    per: dict[int, list[float]] = {0: [], 1: []}
    for r, n, k, d in zip(t["rank"], t["name"], t["kind"], t["dur_ns"], strict=True):
        if n == "data-wait":
            assert k == "other"
            per[r].append(d / 1e6)
    assert len(per[0]) == len(per[1]) == 6, per  # one fetch per profiled step on each rank
    # rank 1's every fetch holds its sleep; rank 0's typical one none (one of its fetches may be
    # descheduled on a busy host, so its median is what is held to the bar)
    assert min(per[1]) >= DELAY_MS and sorted(per[0])[len(per[0]) // 2] < DELAY_MS / 4, per


def test_a_slow_loader_is_named_as_the_input_pipeline(trace: Path) -> None:
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    d = analyze(load_job(trace)).diagnosis
    top = d.findings[0]
    assert top.cause == "data-loading", [(f.cause, f.workers) for f in d.findings]
    assert [w["rank"] for w in top.workers] == [1]
