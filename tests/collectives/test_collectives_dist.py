"""StragglAR, the p2p ring and the adaptive AllReduce on real gloo processes over loopback.

Every case of one group size runs inside one process-group launch (spawning is the slow part).
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from laggard.collectives.launch import WorkerError, run_workers  # noqa: E402

SIZES = (1, 2, 5, 7, 13, 64, 1001)  # fewer elements than chunks, not divisible by n-1, ...
DTYPES = ("float32", "float64", "int64", "int32")


def _data(rank: int, numel: int, dtype):
    x = torch.arange(numel, dtype=torch.int64) * (rank + 1) - 3 * rank + 7
    return x.to(dtype) if not dtype.is_floating_point else (x.to(dtype) / 8)  # /8: exact in binary floats


def _expected(world: int, numel: int, dtype, op: str = "sum"):
    parts = torch.stack([_data(r, numel, dtype) for r in range(world)])
    return parts.sum(0).to(dtype) if op == "sum" else parts.max(0).values


def _correctness_worker(rank: int, world: int, dtypes: tuple[str, ...]) -> list[tuple]:
    import torch.distributed as dist

    from laggard.collectives.ring import ring_allreduce
    from laggard.collectives.stragglar import PhaseTimes, stragglar_allreduce
    from laggard.errors import LaggardError

    failures: list[tuple] = []
    num_checked = 0
    for dt_name in dtypes:
        dt = getattr(torch, dt_name)
        for numel in SIZES:
            exp = _expected(world, numel, dt)
            for strag in range(world):  # every rank as the straggler
                y = _data(rank, numel, dt)
                stragglar_allreduce(y, straggler=strag)
                num_checked += 1
                if not torch.equal(y, exp):
                    failures.append(("stragglar", dt_name, numel, strag))
            z = _data(rank, numel, dt)
            ring_allreduce(z)
            num_checked += 1
            if not torch.equal(z, exp):
                failures.append(("ring", dt_name, numel))
    # a wrong guess: rank 1 is really late, rank world-1 is named; still exact, phases timed
    for numel in (1001, 4096):
        exp = _expected(world, numel, torch.float32)
        y = _data(rank, numel, torch.float32)
        if rank == 1:
            time.sleep(0.2)
        times = PhaseTimes()
        stragglar_allreduce(y, straggler=world - 1, times=times)
        num_checked += 1
        if not torch.equal(y, exp) or not times.start_s <= times.phase1_end_s <= times.end_s:
            failures.append(("wrong guess", numel))
    # floats with rounding: every rank gets the same bits (each chunk finalised by a commutative add)
    g = torch.Generator().manual_seed(rank)
    r = torch.randn(999, generator=g, dtype=torch.float32)
    stragglar_allreduce(r, straggler=2)
    gathered = [torch.empty_like(r) for _ in range(world)]
    dist.all_gather(gathered, r)
    ref = torch.stack([torch.randn(999, generator=torch.Generator().manual_seed(q)) for q in range(world)]).sum(0)
    num_checked += 1
    if not all(torch.equal(t, gathered[0]) for t in gathered) or not torch.allclose(r, ref, atol=1e-4):
        failures.append(("float bits",))
    # non-contiguous 2-D tensor, MAX, and a sub-group
    base = _data(rank, 60, torch.int64).view(6, 10)
    nc = base.t()
    exp_nc = _expected(world, 60, torch.int64).view(6, 10).t()
    stragglar_allreduce(nc, straggler=0)
    num_checked += 1
    if not torch.equal(nc, exp_nc) or not torch.equal(base.t(), exp_nc):
        failures.append(("non-contiguous",))
    m = _data(rank, 33, torch.float64)
    stragglar_allreduce(m, straggler=1, op=dist.ReduceOp.MAX)
    num_checked += 1
    if not torch.equal(m, _expected(world, 33, torch.float64, "max")):
        failures.append(("max",))
    sub_ranks = list(range(1, world))
    sub = dist.new_group(sub_ranks)
    if rank in sub_ranks:
        s = torch.full((17,), float(rank))
        stragglar_allreduce(s, straggler=0, group=sub)  # group rank 0 = global rank 1
        num_checked += 1
        if not torch.equal(s, torch.full((17,), float(sum(sub_ranks)))):
            failures.append(("subgroup",))
    else:  # not a member: a no-op, as torch's collectives
        s = torch.full((17,), 5.0)
        stragglar_allreduce(s, straggler=0, group=sub)
        ring_allreduce(s, group=sub)
        if not torch.equal(s, torch.full((17,), 5.0)):
            failures.append(("non-member",))
    # user mistakes
    for bad in (-1, world, "x"):
        try:
            stragglar_allreduce(torch.zeros(4), straggler=bad)
            failures.append(("no error", bad))
        except LaggardError:
            pass
    try:
        stragglar_allreduce(torch.zeros(4), op=dist.ReduceOp.BAND)
        failures.append(("no error", "op"))
    except LaggardError:
        pass
    dist.barrier()
    return [("checked", num_checked)] + failures


def _adaptive_worker(rank: int, world: int) -> dict:
    from laggard.collectives.adaptive import AdaptiveAllReduce, stragglar_share
    from laggard.collectives.cost import CostParams

    slow = 2
    params = CostParams(alpha_s=1e-5, beta_s_per_byte=1e-9)  # small d*: a 150 ms delay is worth it
    out: dict = {}
    for eager in (False, True):
        ar = AdaptiveAllReduce(params=params, eager=eager, min_calls=2, smoothing=0.5)
        decisions, ok = [], True
        for _ in range(5):
            x = _data(rank, 3001, torch.float64)
            if rank == slow:
                time.sleep(0.15)
            d = ar(x)
            ok &= bool(torch.equal(x, _expected(world, 3001, torch.float64)))
            decisions.append((d.algorithm, d.straggler))
        out[f"eager={eager}"] = {"ok": ok, "decisions": decisions, "share": stragglar_share(ar.history)}
    # latency-bound model: StragglAR never pays off, stay native
    never = AdaptiveAllReduce(params=CostParams(alpha_s=1.0, beta_s_per_byte=0.0), min_calls=1)
    for _ in range(3):
        x = _data(rank, 10, torch.int64)
        if rank == slow:
            time.sleep(0.05)
        never(x)
    out["never"] = [d.algorithm for d in never.history]
    return out


def _check(results: list) -> None:
    for rank, res in enumerate(results):
        assert res[0][0] == "checked" and res[0][1] > 100
        assert res[1:] == [], f"rank {rank}: {res[1:]}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("world", "dtypes"), [(4, DTYPES), (8, ("float32", "int64"))])
def test_stragglar_and_ring_exact_on_gloo(world, dtypes):
    _check(run_workers(_correctness_worker, world, dtypes, timeout_s=220))


@pytest.mark.timeout(180)
def test_adaptive_switches_to_stragglar_for_a_persistent_straggler():
    res = run_workers(_adaptive_worker, 4, timeout_s=160)
    for r in res:
        assert r == res[0]  # every rank made the same decisions
    for key in ("eager=False", "eager=True"):
        got = res[0][key]
        assert got["ok"]
        algos = [a for a, _ in got["decisions"]]
        assert algos[:2] == ["native", "native"]  # no history yet (min_calls=2)
        assert algos[2:] == ["stragglar"] * 3
        assert all(s == 2 for a, s in got["decisions"] if a == "stragglar")
    assert res[0]["never"] == ["native"] * 3


def _failing_worker(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("boom")


@pytest.mark.timeout(120)
def test_worker_errors_surface():
    with pytest.raises(WorkerError, match="boom"):
        run_workers(_failing_worker, 2, timeout_s=60)


@pytest.mark.timeout(180)
def test_bench_small_run_reports_all_algorithms():
    from laggard.collectives.bench import PHASE_ALLREDUCE, PHASE_CALIBRATE, BenchConfig, run_bench

    seen: list[tuple[int, int | None, str | None]] = []
    res = run_bench(BenchConfig(num_ranks=3, size_mb=0.25, delay_ms=50, repeats=2, straggler=1),
                    on_progress=lambda done, total, what: seen.append((done, total, what)))
    # rank 0's progress reaches the parent as it goes: the calibration (no count yet), then every
    # all-reduce (3 warm-up + 3 x 2 timed), in order, the phase named where it changes
    assert seen[:2] == [(0, None, PHASE_CALIBRATE), (0, 9, PHASE_ALLREDUCE)]
    assert seen[-1] == (9, 9, None) and [d for d, _, _ in seen[1:]] == list(range(10))
    assert res["correct"] is True
    assert set(res["algorithms"]) == {"stragglar", "ring", "torch"}
    for s in res["algorithms"].values():
        assert len(s["samples_s"]) == 2 and s["median_s"] > 0
    assert res["params"]["alpha_s"] > 0 and res["params"]["beta_s_per_byte"] > 0
    assert 0 < res["predicted"]["textbook"]["ratio_vs_ring"] < 2
    assert res["straggler"] == 1 and 0 <= res["phase1_hidden_fraction"] <= 1
