"""Clock alignment through collectives: on a causal simulation, and on three real gloo ranks whose
clocks are offset by known amounts (the ranks are this file run as a script:
``python test_tracer_clock.py RANK PORT OUT``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from laggard.collectives.launch import free_port
from laggard.tracer.clock import offsets_from_collective, resolve_method

pytestmark = pytest.mark.timeout(120)

# rank r's clock reads true time + SKEWS_NS[r]: its offset to rank 0 is -SKEWS_NS[r]
SKEWS_NS = (0, 5_000_000_000, -2_500_000_000)
TOLERANCE_NS = 2_000_000  # holds with 3 processes on a busy 2-core machine (measured: 0.02-0.3 ms)


def _simulate_collectives(rng: np.random.Generator, skews_ns: np.ndarray, rounds: int) -> tuple[np.ndarray, ...]:
    """An independent causal model: ranks enter at scattered times, each completes a fixed latency
    plus an asymmetric, heavy-tailed delay after the last rank entered; readings are skewed."""
    world = len(skews_ns)
    enter_true = np.cumsum(np.full((rounds, world), 5_000_000), axis=0) + rng.integers(0, 300_000, (rounds, world))
    last = enter_true.max(axis=1, keepdims=True)
    delay = 20_000 + rng.exponential(200_000, (rounds, world)).astype(np.int64)
    delay[:, 1] += 300_000  # rank 1 always leaves late
    exit_true = last + delay
    return enter_true + skews_ns, exit_true + skews_ns


def _within(offsets: np.ndarray, skews_ns: np.ndarray, tol_ns: float) -> bool:
    return bool(np.abs(np.asarray(offsets) + skews_ns).max() < tol_ns)


def test_collective_offsets_are_bounded_by_causality() -> None:
    rng = np.random.default_rng(1)
    skews = np.array([0, 7_000_000_000, -3_000_000, 123_456])
    s, e = _simulate_collectives(rng, skews, rounds=48)
    offsets, errors = offsets_from_collective(s, e)
    assert np.all(np.abs(offsets + skews) <= errors + 1)  # the truth lies inside the reported bound
    assert errors.max() < 250_000 and _within(offsets, skews, 200_000)
    assert not _within(np.zeros(4), skews, 200_000)  # a wrong estimator (no correction) fails the check
    # more rounds, tighter bounds: each bound comes from its own least-delayed round
    few = offsets_from_collective(s[:3], e[:3])[1]
    assert few.max() > errors.max()


def test_contradictory_bounds_fall_back_to_the_best_round() -> None:
    rng = np.random.default_rng(2)
    skews = np.array([0, 1_000_000])
    s, e = _simulate_collectives(rng, skews, rounds=10)
    s[5:, 1] += 50_000_000  # rank 1's clock stepped by 50 ms halfway through
    e[5:, 1] += 50_000_000
    offsets, errors = offsets_from_collective(s, e)
    assert errors[1] > 0 and abs(offsets[1] + skews[1]) < 60_000_000


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="same shape"):
        offsets_from_collective(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="before it was entered"):
        offsets_from_collective(np.ones((2, 2)), np.zeros((2, 2)))


def test_auto_uses_collectives_where_p2p_does_not_block_the_host() -> None:
    assert resolve_method("auto", "nccl") == "collective"
    assert resolve_method("auto", "gloo") == "pingpong"
    assert resolve_method("auto", "cpu:gloo,cuda:nccl") == "pingpong"  # CPU tensors go through gloo
    assert resolve_method("barrier", "nccl") == "barrier"
    with pytest.raises(ValueError, match="must be one of"):
        resolve_method("ntp", "gloo")


def test_a_bad_align_method_is_one_clear_error(tmp_path: Path) -> None:
    from laggard.errors import LaggardError
    from laggard.tracer import Tracer

    with pytest.raises(LaggardError, match="align must be one of"):
        Tracer(tmp_path / "t", align="ntp")


# ---------------------------------------------------------------------------- real ranks
def _worker(rank: int, port: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from laggard.tracer import Tracer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(SKEWS_NS))
    skew = SKEWS_NS[rank]
    t = Tracer(out / "trace", align="collective", record_gc=False, clock_ns=lambda: time.perf_counter_ns() + skew)
    with t.step(0), t.op("forward-compute"):
        pass
    t.close()
    dist.destroy_process_group()


def test_collective_alignment_recovers_injected_offsets_on_real_ranks(tmp_path: Path) -> None:
    from tests.rank_procs import finish_ranks, first_failure  # here: the ranks run this file as a script

    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(port), str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(len(SKEWS_NS))]
    bad = first_failure(finish_ranks(procs, 100))
    assert bad is None, bad
    clock = json.loads((tmp_path / "trace" / "job.json").read_text())["extra"]["clock"]
    assert clock["method"] == "collective" and clock["rounds"] == 48
    offsets = np.array(clock["offsets_to_rank0_ns"])
    skews = np.array(SKEWS_NS)
    assert _within(offsets, skews, TOLERANCE_NS), (offsets + skews, clock["error_ns"])
    # the bound is a guarantee (all ranks read one monotonic clock here, so the truth is known)
    assert np.abs(offsets + skews).max() <= clock["error_ns"] + 1
    assert not _within(np.zeros(len(skews)), skews, TOLERANCE_NS)  # no correction fails the check
    assert not _within(-offsets, skews, TOLERANCE_NS)  # nor does the wrong sign
    # one timeline: every rank's shift (alignment + rank 0's epoch anchor) undoes its skew
    shifts = np.array([json.loads((tmp_path / "trace" / f"rank{r}.state.json").read_text())["clock_offset_ns"]
                       for r in range(len(SKEWS_NS))])
    assert _within(shifts - shifts[0], skews, TOLERANCE_NS)

if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
