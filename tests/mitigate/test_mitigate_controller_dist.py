"""The runtime controller on real gloo processes over loopback (one launch of 4 ranks for every case).

The ranks report synthetic compute times (samples x their seconds per sample: no sleeping, so the
decisions do not depend on how busy the machine is) through the real exchange (all_gather on gloo);
the tests check what every rank decided. The math check trains a real model one step.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from laggard.collectives.launch import run_workers  # noqa: E402

pytestmark = pytest.mark.timeout(240)

NUM_RANKS = 4
GLOBAL_BATCH = 64
SLOW = 2


def _run(rank: int, speed_at, num_steps: int, **cfg) -> dict:
    """Drive a Controller: this rank's seconds per sample at step k are ``speed_at(rank, k)``."""
    from laggard.mitigate import ActConfig, Controller

    ctl = Controller(global_batch=GLOBAL_BATCH, dp_rank=rank, dp_size=NUM_RANKS, min_samples=2,
                     config=ActConfig(**cfg))
    trail = []
    for k in range(num_steps):
        n = ctl.counts[rank]
        ctl.record(n * speed_at(rank, k))
        ctl.step(k, step_s=max(c * speed_at(r, k) for r, c in enumerate(ctl.counts)))
        trail.append(list(ctl.counts))
    ctl.close()
    return {"actions": [a.to_json() for a in ctl.actions], "trail": trail}


def _slow_then_recover(rank: int, k: int) -> float:
    return 1.6e-3 if rank == SLOW and k < 30 else 1e-3


def _slow_then_slower(rank: int, k: int) -> float:
    return (1.6e-3 if k < 12 else 2.5e-3) if rank == SLOW else 1e-3


def _math_case(rank: int, counts: list[int]) -> list[float]:
    """One AdamW step of a small model on a 16-sample global batch split as ``counts``; the loss
    weighted by the rank's share, gradients summed: the parameters after the step."""
    import torch.distributed as dist
    from torch import nn

    from laggard.mitigate import Controller

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3)).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g)
    ctl = Controller(global_batch=16, dp_rank=rank, dp_size=NUM_RANKS)
    ctl.counts = list(counts)
    lo, hi = ctl.my_slice()
    loss = nn.functional.cross_entropy(model(x[lo:hi]), y[lo:hi]) * ctl.sample_weight
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def _reference_step() -> list[float]:
    """The same step on one process over the whole global batch (no split at all)."""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3)).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def _worker(rank: int, world: int) -> dict:
    out = {"recover": _run(rank, _slow_then_recover, 70),
           "rate": _run(rank, _slow_then_slower, 60, min_steps_between=20)}
    # the kill switch on one rank only stops every rank
    if rank == 1:
        os.environ["LAGGARD_ACT"] = "0"
    out["killed"] = _run(rank, _slow_then_recover, 25)
    # ... and, switched on while a shift is in place, undoes it at the next window

    def slow(r: int, k: int) -> float:
        if r == 1:
            os.environ["LAGGARD_ACT"] = "0" if k >= 15 else "1"
        return 1.6e-3 if r == SLOW else 1e-3

    out["kill_later"] = _run(rank, slow, 25)
    os.environ.pop("LAGGARD_ACT", None)
    out["math_even"] = _math_case(rank, [4, 4, 4, 4])
    out["math_shifted"] = _math_case(rank, [5, 5, 1, 5])
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_workers(_worker, NUM_RANKS, timeout_s=200)


def test_every_rank_takes_the_same_decisions(results):
    for case in ("recover", "rate", "killed", "kill_later"):
        assert all(r[case] == results[0][case] for r in results), case


def test_a_slow_rank_gets_fewer_samples(results):
    acts = results[0]["recover"]["actions"]
    first = acts[0]
    assert first["kind"] == "rebalance" and first["ranks"] == [SLOW]
    # two windows of 5 steps: decided at the end of step 9, applied from step 10
    assert first["step"] == 9
    counts = first["counts"]
    assert sum(counts) == GLOBAL_BATCH and min(counts) >= 2
    assert counts[SLOW] == min(counts) and counts[SLOW] < GLOBAL_BATCH // NUM_RANKS
    # in proportion to speed (1 / 1.6 of the others'), within a sample
    assert abs(counts[SLOW] - GLOBAL_BATCH / (3 + 1 / 1.6) / 1.6) <= 1
    assert first["step_s_after"] < first["step_s_before"]
    assert "1.60x" in first["reason"]


def test_the_shift_is_undone_when_the_rank_recovers(results):
    acts = results[0]["recover"]["actions"]
    undo = [a for a in acts if a["kind"] == "undo"]
    assert len(undo) == 1 and undo[0]["step"] > 30
    assert undo[0]["counts"] == [16, 16, 16, 16]
    assert results[0]["recover"]["trail"][-1] == [16, 16, 16, 16]


def test_actions_are_rate_limited(results):
    acts = [a for a in results[0]["rate"]["actions"] if a["kind"] != "drain"]
    assert len(acts) >= 2, "the rank got slower: a second split was due"
    assert acts[1]["counts"][SLOW] < acts[0]["counts"][SLOW]
    gaps = [b["step"] - a["step"] for a, b in zip(acts, acts[1:], strict=False)]
    assert min(gaps) >= 20, gaps


def test_the_kill_switch_on_any_rank_stops_every_rank(results):
    assert results[0]["killed"]["actions"] == []
    assert all(c == [16, 16, 16, 16] for c in results[0]["killed"]["trail"])
    acts = results[0]["kill_later"]["actions"]
    assert [a["kind"] for a in acts] == ["rebalance", "undo"]
    assert acts[1]["step"] == 19 and "kill switch" in acts[1]["reason"]
    assert results[0]["kill_later"]["trail"][-1] == [16, 16, 16, 16]


def test_a_shifted_split_with_weighted_gradients_is_the_same_update(results):
    ref = _reference_step()
    for r in results:
        for case in ("math_even", "math_shifted"):
            assert r[case] == pytest.approx(ref, rel=1e-9, abs=1e-12), case
    assert results[0]["math_shifted"] == pytest.approx(results[0]["math_even"], rel=1e-9, abs=1e-12)
