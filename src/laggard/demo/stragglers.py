"""The demo job's injected stragglers (``--inject``, ``laggard.groundtruth.inject``), each a real effect
on the rank it touches: extra compute inside the forward and, through autograd, inside the backward
(slow-worker, heavy-stage), untraced host work (host-stall, launch delay), a late transfer
(slow-link), long garbage collections (gc-pauses), uneven sequence lengths (seqlen-imbalance), a
heavier LM head (heavy-last-stage). Used by ``examples/demo_job.py`` in each rank's process."""

from __future__ import annotations

import gc
import time

import numpy as np
import torch


class _ExtraGradWork(torch.autograd.Function):
    """An identity whose backward burns the slow rank's extra backward compute: the autograd engine runs
    it inside ``autograd.backward``, where a larger model's extra layers would run (and where a profiler
    trace's autograd events put it). Work added after ``backward()`` returns would read, in a trace cut by
    op names, as another forward."""

    @staticmethod
    def forward(ctx, x, inj):
        ctx.inj = inj
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.inj.burn_backward()
        return grad, None


class Stragglers:
    """The --inject causes that touch this rank, each a real effect."""

    def __init__(self, injections, rank: int, cfg) -> None:
        self.slow, self.head_factor, self.sigma = 1.0, 0.0, None
        self.gc_prob, self.gc_pause_ms, self.launch_delay_s = 0.0, 0.0, 0.0
        self.link_delay_s: dict[int, float] = {}
        self.stalls: list[tuple[float, int]] = []  # host-stall on this rank: (seconds, every k-th step)
        for inj in injections:
            p = inj.params
            if inj.cause == "slow-worker" and int(p["rank"]) == rank:
                self.slow *= p["factor"]
            elif inj.cause == "heavy-stage" and int(p["stage"]) == rank % cfg.pp:
                # the stage's work is factor x what it was: the same extra compute on each of its
                # ranks (a slow GPU under every replica of a stage looks the same in any trace)
                self.slow *= p["factor"]
            elif inj.cause == "host-stall" and int(p["rank"]) == rank:
                self.stalls.append((p["ms"] / 1e3, int(p["every"])))
            elif inj.cause == "heavy-last-stage":
                self.head_factor = p["factor"]
            elif inj.cause == "seqlen-imbalance":
                self.sigma = p["sigma"]
            elif inj.cause == "gc-pauses":
                self.gc_prob, self.gc_pause_ms = p["prob"], p["pause_ms"]
            elif inj.cause == "slow-link" and int(p["src"]) == rank and not p.get("shaped"):
                # (shaped=1: the network holds the transfer back, laggard.demo.netshape)
                self.link_delay_s[int(p["dst"])] = p["delay_ms"] / 1e3
            elif inj.cause == "launch-delay" and int(p.get("rank", rank)) == rank:
                self.launch_delay_s = p["ms"] / 1e3
        self.compute_s = 0.0  # forward + backward time this step, burn included (what act measures)
        # the backward's burn runs inside autograd (_ExtraGradWork), before the rest of the backward it
        # scales has run: it burns (factor - 1) x this microbatch's forward time x the rank's measured
        # backward/forward ratio (the last backward's own time over its forward's)
        self.forward_s: dict[int, float] = {}  # microbatch -> its forward's own time (burn excluded)
        self.backward_ratio: float | None = None
        self._backward_burn_s = 0.0  # what _ExtraGradWork burned in the backward under way
        self._backward_m = -1  # the microbatch whose backward is under way
        self.rng = np.random.default_rng([cfg.seed, rank, 7])
        self.heap: list = []
        self._burn = torch.randn(64, 64)

    def extra_vocab(self, d_model: int) -> int:
        # a block costs ~12 d^2 multiply-adds per token, the head d x vocab: pad by factor blocks
        return int(round(self.head_factor * 12 * d_model))

    def _spin(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self._burn @ self._burn

    def burn(self, elapsed_s: float, cpu0_s: float) -> None:
        """slow-worker / heavy-stage: real extra compute, (factor - 1) x what the op took. Adds the op's CPU
        time, burn included, to compute_s (CPU time: 4 ranks on 2 cores stretch everyone's wall time alike)."""
        self._spin((self.slow - 1.0) * elapsed_s)
        self.compute_s += time.thread_time() - cpu0_s

    def slow_backward(self, out: torch.Tensor, m: int, forward_s: float) -> torch.Tensor:
        """``out`` with the extra backward compute attached (see _ExtraGradWork); records the forward's time."""
        self.forward_s[m] = forward_s
        if self.slow == 1.0 or not out.requires_grad:
            return out
        return _ExtraGradWork.apply(out, self)

    def burn_backward(self) -> None:
        """Inside autograd: (factor - 1) x the backward expected of this microbatch (none before the first
        backward has been measured: the first is burned after it, as ``burn``)."""
        if self.backward_ratio is None or self._backward_m not in self.forward_s:
            return
        t0 = time.perf_counter()
        self._spin((self.slow - 1.0) * self.backward_ratio * self.forward_s[self._backward_m])
        self._backward_burn_s += time.perf_counter() - t0

    def backward(self, out: torch.Tensor, grad: torch.Tensor | None, m: int) -> None:
        """``autograd.backward`` of microbatch m with its extra compute inside; the measured own time
        (burn excluded) updates the backward/forward ratio."""
        t0, c0 = time.perf_counter(), time.thread_time()
        self._backward_m, self._backward_burn_s = m, 0.0
        torch.autograd.backward(out, grad_tensors=grad)
        own_s = time.perf_counter() - t0 - self._backward_burn_s
        first = self.backward_ratio is None
        forward_s = self.forward_s.pop(m, None)
        if forward_s:
            self.backward_ratio = own_s / forward_s
        if first and self.slow != 1.0:
            self._spin((self.slow - 1.0) * own_s)  # not measured yet: burned after it, this once
        self.compute_s += time.thread_time() - c0

    def host_stall(self, step: int) -> None:
        """host-stall: untraced CPU work on the host (pure Python, so no profiler or tracer op covers it)
        before the step's first compute, in every ``every``-th step."""
        wait_s = sum(s for s, every in self.stalls if step % every == 0)
        if wait_s <= 0:
            return
        end, x = time.perf_counter() + wait_s, 0
        while time.perf_counter() < end:
            for i in range(200):
                x += i * i

    def launch_delay(self) -> None:
        if self.launch_delay_s:
            time.sleep(self.launch_delay_s)  # CPU-side work before the compute starts, not traced

    def prepare_gc(self) -> None:
        """gc-pauses: keep enough live Python objects that a full collection takes about pause_ms."""
        if not self.gc_prob:
            return
        # torch's own objects alone make a full collection take ~150 ms here: freeze them (as
        # planned GC does) so that a collection costs what pause_ms asks for
        gc.freeze()
        while len(self.heap) < 4_000_000:
            self.heap.extend([i] for i in range(max(20_000, len(self.heap) // 2)))
            t0 = time.perf_counter()
            gc.collect()
            if (time.perf_counter() - t0) * 1e3 >= self.gc_pause_ms:
                break

    def maybe_collect(self) -> None:
        if self.gc_prob and self.rng.random() < self.gc_prob:
            cycles = [[] for _ in range(1000)]
            for a, b in zip(cycles, cycles[1:], strict=False):
                a.append(b), b.append(a)  # reference cycles: only the collector can free them
            del cycles
            # this stands for Python's automatic collector, which runs only while it is enabled
            # (planned GC turns it off and collects on every rank at the same step instead)
            if gc.isenabled():
                gc.collect()
