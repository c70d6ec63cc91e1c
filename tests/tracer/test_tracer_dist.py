"""The tracer on two real gloo ranks: clock alignment, collectives and p2p matched across ranks,
asynchronous ops, and SIGTERM while a rank is stuck inside a collective.

The ranks are this file run as a script (``python test_tracer_dist.py RANK PORT OUT``).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from laggard.collectives.launch import free_port

SKEW_NS = 5_000_000_000  # rank 1's clock runs 5 s ahead


def _worker(rank: int, port: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from laggard.tracer import Tracer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    skew = SKEW_NS if rank == 1 else 0
    peer = 1 - rank
    sub = dist.new_group([0, 1])
    t = Tracer(out / "trace", dp_rank=rank, pp_rank=0, clock_ns=lambda: time.perf_counter_ns() + skew)
    x, y = torch.ones(1000), torch.zeros(1000)
    for step in range(3):
        with t.step(step):
            with t.op("forward-compute", microbatch=0):
                time.sleep(0.002)
            t.all_reduce(x, name="grads-all-reduce")
            t.all_reduce(x, group=sub, name="sub-all-reduce")
            if rank == 0:
                t.send(x, 1, name="forward-send", microbatch=0)
                t.recv(y, 1, name="backward-recv", microbatch=0)
            else:
                t.recv(y, 0, name="forward-recv", microbatch=0)
                t.send(x, 0, name="backward-send", microbatch=0)
            w = t.isend(x, 1, name="forward-send", microbatch=1) if rank == 0 else \
                t.irecv(y, 0, name="forward-recv", microbatch=1)
            with t.op("overlapped", kind="other"):
                time.sleep(0.001)
            w.wait()
            with t.op("after-wait", kind="other"):
                pass
            ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]
            for work in t.batch_isend_irecv(ops, names=["exchange-send", "exchange-recv"]):
                work.wait()
            t.broadcast(x, 0, name="params-broadcast")
    dist.barrier()
    (out / f"mark{rank}").write_text(str(t.now_ns()))  # both ranks leave the barrier together
    t.close()

    # a rank stuck in a receive that never completes, then SIGTERM: the tracer must still flush
    t2 = Tracer(out / "stuck", dp_rank=rank, pp_rank=0, flush_interval_s=1e6)
    if rank == 0:
        with t2.step(0), t2.op("forward-compute"):
            pass
        print("blocked", flush=True)
        dist.recv(y, 1)  # rank 1 never sends
    else:
        print("sleeping", flush=True)
        time.sleep(120)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    from tests.rank_procs import line_from  # here: the ranks run this file as a script

    out = tmp_path_factory.mktemp("dist")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(port), str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        line = line_from(procs, 0, 60)
        assert line == "blocked", procs[0].stderr.read() if procs[0].stderr else line
        time.sleep(0.5)
        t0 = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        code = procs[0].wait(timeout=30)
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert code == 128 + signal.SIGTERM, code  # ended by the watcher, not by a Python handler
    assert waited < 15
    return out, code


pytestmark = pytest.mark.timeout(120)


def _table(path: Path) -> list[dict]:
    from laggard.io import load_job

    return load_job(path).table.to_pylist()


def test_clocks_are_aligned_across_ranks(two_ranks: tuple[Path, int]) -> None:
    out, _ = two_ranks
    clock = json.loads((out / "trace" / "job.json").read_text())["extra"]["clock"]
    assert clock["method"] == "pingpong"
    # rank 1's readings are 5 s ahead: its offset to rank 0 is -5 s (to within the error bound)
    assert abs(clock["offsets_to_rank0_ns"][1] + SKEW_NS) < max(clock["error_ns"], 1) + 2_000_000
    marks = [int((out / f"mark{r}").read_text()) for r in range(2)]
    assert abs(marks[0] - marks[1]) < 20_000_000  # one timeline: same instant, same time (barrier skew)


def test_job_json_names_every_ranks_host(two_ranks: tuple[Path, int]) -> None:
    out, _ = two_ranks
    hosts = json.loads((out / "trace" / "job.json").read_text())["extra"]["hosts"]
    assert hosts == [{"rank": r, "host": socket.gethostname()} for r in range(2)]  # gathered at start-up


def test_collectives_and_p2p_match_across_ranks(two_ranks: tuple[Path, int]) -> None:
    out, _ = two_ranks
    rows = _table(out / "trace")
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["group"] is not None:
            groups[(r["step"], r["group"], r["seq"])].append(r)
    assert groups and all(sorted(m["rank"] for m in g) == [0, 1] for g in groups.values())
    labels = {k[1] for k in groups}
    assert {"world", "pg:0,1", "p2p:0>1", "p2p:1>0"} <= labels
    for (_, label, _), members in groups.items():
        kinds = sorted(m["kind"] for m in members)
        if label.startswith("p2p:"):
            src, dst = (int(x) for x in label[4:].split(">"))
            send = next(m for m in members if m["kind"] == "p2p_send")
            recv = next(m for m in members if m["kind"] == "p2p_recv")
            assert kinds == ["p2p_recv", "p2p_send"] and send["rank"] == src and recv["rank"] == dst
            assert send["peer"] == dst and recv["peer"] == src and send["size_bytes"] == recv["size_bytes"] == 4000
            assert send["name"].removesuffix("-send") == recv["name"].removesuffix("-recv")
        else:
            assert kinds == ["collective", "collective"] and len({m["name"] for m in members}) == 1
    # per step: two collectives on the world group (all-reduce, broadcast), one on the sub-group
    step0 = [k for k in groups if k[0] == 0]
    assert sorted(k[1] for k in step0).count("world") == 2 and sorted(k[1] for k in step0).count("pg:0,1") == 1


def test_async_ops_depend_on_their_issue_point_and_are_joined(two_ranks: tuple[Path, int]) -> None:
    out, _ = two_ranks
    rows = [r for r in _table(out / "trace") if r["rank"] == 0 and r["step"] == 1]
    by_id = {r["op_id"]: r for r in rows}
    isend = next(r for r in rows if r["name"] == "forward-send" and r["microbatch"] == 1)
    assert isend["stream"] == "async" and by_id[isend["deps"][0]]["name"] == "backward-recv"
    after = next(r for r in rows if r["name"] == "after-wait")
    assert isend["op_id"] in after["deps"]  # the op after wait() waits for the transfer
    assert by_id[after["deps"][0]]["name"] == "overlapped"  # and for the op before it on the stream


def test_the_two_rank_trace_analyses_cleanly(two_ranks: tuple[Path, int]) -> None:
    import warnings

    from laggard.analysis.pipeline import analyze
    from laggard.errors import LaggardWarning
    from laggard.io import load_job

    with warnings.catch_warnings():
        warnings.simplefilter("error", LaggardWarning)
        res = analyze(load_job(out_dir := two_ranks[0] / "trace"))
    assert res.num_workers == 2 and len(res.steps) == 3
    assert 0.8 < res.launch_slowdown < 1.5
    from laggard.tracer import check_trace

    assert check_trace(out_dir) == []


def test_sigterm_flushes_a_rank_stuck_in_a_collective(two_ranks: tuple[Path, int]) -> None:
    out, _ = two_ranks
    stuck = out / "stuck"
    state = json.loads((stuck / "rank0.state.json").read_text())
    assert state["status"] == "terminated" and state["num_ops_written"] == 2
    assert [r["name"] for r in _table(stuck) if r["rank"] == 0] == ["forward-compute", "gc"]  # gc: none happened


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
