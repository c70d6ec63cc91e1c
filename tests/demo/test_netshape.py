"""Shaped slow links (``slow-link:...,shaped=1``): the link is slow in the network, not in Python.

Measured from outside the analysis: bytes pushed through a real socket between two rank namespaces
take about bytes / rate one way and go at full speed the other way; a real demo job run on a shaped
link has its transfers on that link late in the receiver's recv, not in the sender's host time
(which is what a sleep before the send gives a profiler). Needs root and iproute2 (the set-up's
machine has both); skipped with the reason elsewhere.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from laggard.demo.launch import JobConfig, run_job, shaped_link_rates
from laggard.demo.netshape import ShapedNet, shaped_network, unavailable
from laggard.errors import LaggardError
from laggard.groundtruth.inject import parse_injection, parse_injections

pytestmark = pytest.mark.timeout(300)
WHY = unavailable()
needs_shaping = pytest.mark.skipif(WHY is not None, reason=f"shaped links: {WHY}")

PAYLOAD = 1_000_000  # bytes
RATE = 80e6  # bits/s: 100 ms for the payload


def test_the_shaped_key_is_optional_and_checked() -> None:
    assert parse_injection("slow-link:src=0,dst=1").spec() == "slow-link:src=0,dst=1,delay_ms=20"
    assert parse_injection("slow-link:src=0,dst=1,shaped=1").params["shaped"] == 1
    with pytest.raises(LaggardError, match="shaped must be 0"):
        parse_injection("slow-link:src=0,dst=1,shaped=2")
    with pytest.raises(LaggardError, match="shaped=..."):
        parse_injection("slow-link:src=0,dst=1,rate=3")


def test_the_rate_carries_one_microbatch_in_the_delay() -> None:
    cfg = JobConfig.quick(dp=1, pp=2, injections=parse_injections(["slow-link:src=1,dst=0,delay_ms=40,shaped=1",
                                                                  "slow-link:src=0,dst=1,delay_ms=40"]))
    bits = cfg.batch_size * cfg.seq_len * cfg.d_model * 4 * 8
    assert shaped_link_rates(cfg) == {(1, 0): pytest.approx(bits / 0.040)}


def _sink(net: ShapedNet, ready, port: int) -> None:  # noqa: ANN001
    net.enter(1)
    with socket.socket() as srv:
        srv.bind((net.addr(1), port))
        srv.listen()
        ready.set()
        conn, _ = srv.accept()
        with conn:
            got = 0
            while got < PAYLOAD:
                got += len(conn.recv(1 << 20))
            conn.sendall(b"k" + b"x" * PAYLOAD)


@needs_shaping
def test_a_shaped_link_is_slow_one_way_only() -> None:
    with shaped_network(2, {(0, 1): RATE}) as net:
        ctx = mp.get_context("fork")
        ready = ctx.Event()
        port = 7000 + int(time.time()) % 1000
        p = ctx.Process(target=_sink, args=(net, ready, port))
        p.start()
        assert ready.wait(30)
        q = ctx.Queue()
        child = ctx.Process(target=_measure, args=(net, port, q))  # (entering a namespace is for good)
        child.start()
        forward_s, back_s = q.get(timeout=60)
        child.join(30)
        p.join(30)
    expected_s = PAYLOAD * 8 / RATE
    assert 0.8 * expected_s < forward_s < 3 * expected_s, (forward_s, expected_s)
    assert back_s < 0.5 * expected_s, (back_s, expected_s)


def _measure(net: ShapedNet, port: int, q) -> None:  # noqa: ANN001
    net.enter(0)
    with socket.create_connection((net.addr(1), port), timeout=30) as s:
        t0 = time.perf_counter()
        s.sendall(b"y" * PAYLOAD)
        s.recv(1)  # the sink answers once it has every byte
        t1 = time.perf_counter()
        got = 0
        while got < PAYLOAD:
            got += len(s.recv(1 << 20))
        q.put((t1 - t0, time.perf_counter() - t1))


@needs_shaping
def test_the_namespaces_are_gone_after_the_job(tmp_path: Path) -> None:
    import subprocess

    with shaped_network(2, {(1, 0): RATE}) as net:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert net.rank_ns(0) in names and net.router_ns in names
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.prefix not in names


@needs_shaping
def test_a_real_job_on_a_shaped_link_waits_in_the_receivers_recv(tmp_path: Path) -> None:
    """dp 1 x pp 2, forward activations 0 -> 1 shaped to arrive 40 ms late: rank 1's forward-recv
    (read from the raw Tracer shard) takes ~40 ms, its backward-send and rank 0's forward-send do not."""
    from laggard.io import load_job

    cfg = JobConfig.quick(dp=1, pp=2, steps=6, trace_dir=str(tmp_path / "trace"),
                          injections=parse_injections(["slow-link:src=0,dst=1,delay_ms=40,shaped=1"]))
    res = run_job(cfg)
    assert res.ok, res.failures
    t = load_job(cfg.trace_dir).table
    name, rank = np.array(t.column("name").to_pylist()), t.column("rank").to_numpy()
    dur_ms = t.column("dur_ns").to_numpy() / 1e6
    recv = dur_ms[(name == "forward-recv") & (rank == 1)]
    send = dur_ms[(name == "forward-send") & (rank == 0)]
    assert recv.size == send.size == cfg.steps * cfg.microbatches
    assert 25 < np.median(recv) < 120, np.median(recv)
    assert np.median(send) < 10, np.median(send)  # the sender is not held: the network is


def test_without_root_a_shaped_link_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import laggard.demo.netshape as netshape

    monkeypatch.setattr(netshape, "unavailable", lambda: "they need root (network namespaces and tc)")
    cfg = JobConfig.quick(dp=1, pp=2, steps=2,
                          injections=parse_injections(["slow-link:src=0,dst=1,delay_ms=40,shaped=1"]))
    with pytest.raises(LaggardError, match=r"shaped slow links \(shaped=1\): they need root"):
        run_job(cfg)
