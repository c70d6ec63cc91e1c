"""Shaped links for the demo job: a slow link made slow in the network, not in Python.

``--inject slow-link:src=S,dst=D,delay_ms=X,shaped=1`` throttles the bandwidth of the link S -> D
so that each transfer on it arrives about X ms late; without ``shaped`` the sender sleeps X ms
before each send, which a profiler sees as the sender's host time, not as a slow transfer.

How (Linux, root, iproute2's ``ip`` and ``tc``): every rank runs in its own network namespace
with one veth to a router namespace; rank r has the address ``10.231.0.{r+1}`` and gloo uses
that veth (``GLOO_SOCKET_IFNAME``). Packets from S to D leave the router on D's veth, where an
HTB class, chosen by a u32 filter on the source address, holds them to the link's rate; every
other packet passes unshaped. The ACKs going back are not shaped, so the link is slow one way,
as a degraded NIC or a congested path is. Link-layer addresses are fixed (no ARP). Everything is
removed when the job ends (deleting the namespaces deletes their veths and qdiscs); a launcher killed
with SIGKILL leaves them behind, named ``lg<pid><4 hex>-r<rank>`` and ``...-rt`` (``ip netns list``;
``ip netns del NAME``). The host's own network namespace is never touched.

The rank processes enter their namespace first thing (``enter``), before any socket exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from laggard.errors import LaggardError

SUBNET = "10.231.0"  # rank r is SUBNET.(r+1): a private range no real network here uses
ROUTER_ADDR = f"{SUBNET}.254"
_CLONE_NEWNET = 0x40000000  # <sched.h>
_NETNS_DIR = "/run/netns"


@dataclass(frozen=True, slots=True)
class ShapedNet:
    """The namespaces of one job: ``prefix-r{rank}`` per rank, ``prefix-rt`` the router."""

    prefix: str
    world: int
    rates_bit_s: dict[tuple[int, int], float] = field(default_factory=dict)

    def rank_ns(self, rank: int) -> str:
        return f"{self.prefix}-r{rank}"

    @property
    def router_ns(self) -> str:
        return f"{self.prefix}-rt"

    @staticmethod
    def addr(rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    @staticmethod
    def ifname(rank: int) -> str:
        return f"lgc{rank}"

    def enter(self, rank: int) -> None:
        """Move the calling process (single-threaded: before torch starts any thread that opens a
        socket) into rank's namespace, and point gloo at its veth."""
        import ctypes

        fd = os.open(f"{_NETNS_DIR}/{self.rank_ns(rank)}", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                raise LaggardError(f"shaped links: cannot enter network namespace {self.rank_ns(rank)} "
                                   f"({os.strerror(ctypes.get_errno())})")
        finally:
            os.close(fd)
        os.environ["GLOO_SOCKET_IFNAME"] = self.ifname(rank)


def unavailable() -> str | None:
    """Why shaped links cannot be had here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "they need root (network namespaces and tc)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"{' and '.join(missing)} not found (Debian's iproute2)"
    return None


def _mac(rank: int, side: int) -> str:
    return f"02:4c:47:{rank // 256:02x}:{rank % 256:02x}:{side:02x}"


def _run(*cmd: str) -> None:
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        raise LaggardError(f"shaped links: `{' '.join(cmd)}` failed: {err[-1] if err else p.returncode}")


def _wire_rank(net: ShapedNet, r: int) -> None:
    """Rank r's namespace, its veth to the router and the routes both ways (static neighbours)."""
    ns, rt, host, dev = net.rank_ns(r), net.router_ns, f"lgh{r}", net.ifname(r)
    _run("ip", "netns", "add", ns)
    _run("ip", "-n", rt, "link", "add", host, "address", _mac(r, 1), "type", "veth",
         "peer", "name", dev, "address", _mac(r, 2), "netns", ns)
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    _run("ip", "-n", ns, "link", "set", dev, "up")
    _run("ip", "-n", rt, "link", "set", host, "up")
    _run("ip", "-n", ns, "addr", "add", f"{net.addr(r)}/32", "dev", dev)
    _run("ip", "-n", ns, "route", "add", f"{ROUTER_ADDR}/32", "dev", dev)
    _run("ip", "-n", ns, "route", "add", "default", "via", ROUTER_ADDR, "dev", dev)
    _run("ip", "-n", ns, "neigh", "replace", ROUTER_ADDR, "lladdr", _mac(r, 1), "dev", dev, "nud", "permanent")
    _run("ip", "-n", rt, "route", "add", f"{net.addr(r)}/32", "dev", host)
    _run("ip", "-n", rt, "neigh", "replace", net.addr(r), "lladdr", _mac(r, 2), "dev", host, "nud", "permanent")


def _shape(net: ShapedNet) -> None:
    """One HTB class per slow link on the router's veth toward its destination; unclassified
    packets (every other link) bypass HTB."""
    by_dst: dict[int, list[tuple[int, float]]] = {}
    for (src, dst), rate in sorted(net.rates_bit_s.items()):
        by_dst.setdefault(dst, []).append((src, rate))
    for dst, links in by_dst.items():
        dev = f"lgh{dst}"
        _run("tc", "-n", net.router_ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb")
        for k, (src, rate) in enumerate(links, start=1):
            _run("tc", "-n", net.router_ns, "class", "add", "dev", dev, "parent", "1:", "classid", f"1:{k}",
                 "htb", "rate", f"{max(int(rate), 8000)}bit")
            _run("tc", "-n", net.router_ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                 "prio", "1", "u32", "match", "ip", "src", f"{net.addr(src)}/32", "flowid", f"1:{k}")


def _remove(net: ShapedNet) -> None:
    for ns in [net.router_ns, *(net.rank_ns(r) for r in range(net.world))]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextmanager
def shaped_network(world: int, rates_bit_s: dict[tuple[int, int], float]) -> Iterator[ShapedNet]:
    """Namespaces for ``world`` ranks with the links ``(src, dst) -> bits/s`` throttled; removed on exit."""
    why = unavailable()
    if why:
        raise LaggardError(f"shaped slow links (shaped=1): {why}")
    net = ShapedNet(prefix=f"lg{os.getpid() % 100000}{uuid.uuid4().hex[:4]}", world=world,
                    rates_bit_s=dict(rates_bit_s))
    try:
        _run("ip", "netns", "add", net.router_ns)
        _run("ip", "-n", net.router_ns, "link", "set", "lo", "up")
        _run("ip", "netns", "exec", net.router_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for r in range(world):
            _wire_rank(net, r)
        _shape(net)
        yield net
    finally:
        _remove(net)
