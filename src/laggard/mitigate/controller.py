"""Runtime mitigation in the training process: measure, decide, act, announce, undo.

``Controller`` runs on every rank of a data-parallel job. Each step the training loop tells it how
long this rank computed (``record``); every ``ActConfig.every_steps`` steps the ranks exchange one
small float64 vector each (one ``all_gather``: compute seconds, samples, step seconds, the kill
switch and the collector's findings) and every rank takes the same decision from the same numbers:

* **a chronically slow DP rank** (compute per sample over the other ranks' median by ``slow_ratio`` for
  ``windows_to_act`` windows): the global batch is split over the DP ranks in proportion to their
  measured speed (``split_samples``: integers, each rank at least ``min_samples``). The global batch is
  the same set of samples; only the split changes. The loop weights each rank's loss by its share
  (``sample_weight``) and sums the gradients, so the update is the global-batch mean, as before.
  It re-measures every window, re-splits when that would pay, and undoes the shift once every rank
  is within ``recover_ratio`` of the median for ``windows_to_undo`` windows.
* **a rank slower than rebalancing can absorb** (over ``drain_ratio``, or held at ``min_samples``
  while still the slowest by ``slow_ratio``): a ``drain`` action with the evidence, to the webhook.
* **the collector's GC finding**: ``planned_gc`` turns on (the loop starts ``PlannedGC``);
  **its sequence-imbalance finding**: ``balanced_packing`` turns on (the loop's sampler balances).

Every action is logged (``logging``, ``actions_path`` as JSON, the collector's action list) with
its step, kind, ranks, reason and the mean step time of the window before and after it; actions
are rate-limited (``min_steps_between``); the kill switch is ``LAGGARD_ACT=0`` on any rank or the
collector's ``{"act": false}``: no new actions, and a shift in place is undone.

On NCCL the exchanged vector lives on the current CUDA device; on gloo on the CPU.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from laggard.mitigate import remote
from laggard.mitigate._errors import check_positive_int, error

log = logging.getLogger("laggard.mitigate.controller")

ENV_KILL = "LAGGARD_ACT"  # "0", "false", "off" or "no" on any rank: no actions (a shift in place is undone)
_FIELDS = 8  # dp_rank, compute_s, samples, step_s, steps, allowed, finding bits, 1 (a live rank)


@dataclass(kw_only=True, slots=True)
class ActConfig:
    """The controller's thresholds, each with the reason for its value."""

    # one all_gather of 8 float64 per rank every 5 steps: invisible next to a gradient all-reduce,
    # and 2 windows of 5 steps act within 10-15 steps
    every_steps: int = 5
    # a rank this much slower per sample than the other ranks' median is worth shifting: the smoothed
    # compute per sample of a healthy rank reached 1.11x on 4 ranks sharing 2 cores at load average 16
    # (1.10 named it beside the slow one); a 1.2x slow worker reads 1.2x against the others
    slow_ratio: float = 1.15
    # recovered below this (under slow_ratio: hysteresis, so a rank near the line does not flap)
    recover_ratio: float = 1.05
    # consecutive windows before acting / undoing: one window can hold a one-off stall
    windows_to_act: int = 2
    windows_to_undo: int = 2
    # at least this many steps between two actions (undo by the kill switch excepted): each action's
    # effect is measured on the next window before the next one is taken
    min_steps_between: int = 10
    # a re-split while shifted only when its predicted step time is this much better than the current
    # split's: on 4 ranks sharing 2 cores one window's compute per sample moves by up to ~10%
    replan_gain: float = 1.10
    # the first shift (from the even split) only needs this predicted gain: the hysteresis above already
    # asked for 2 slow windows, and whole samples leave a 1.2x rank on 2 DP ranks only ~7% to gain
    min_gain: float = 1.03
    # weight of the newest window in each rank's compute per sample (an EWMA over windows: the time per
    # sample does not depend on the split, so older windows stay valid; 0.5 follows a change in 2-3 windows)
    smoothing: float = 0.5
    # a rank this much slower than the median is a sick node, not load to move: rebalancing would
    # leave it a sliver of the batch while it still holds everyone up, so the scheduler should drain it
    drain_ratio: float = 3.0
    # shift samples (False: act on the collector's GC / sequence findings only)
    rebalance: bool = True
    # split the ranks not found slow evenly among themselves (each at their median compute per sample):
    # their differences are under slow_ratio, i.e. noise by this config's own reading, and splitting by
    # them raised the largest share. Measured on the 16-core device machine (dp 4, rank 2 x1.6, 3 runs):
    # first splits of [19, 18, 10, 17], [20, 17, 11, 16], [19, 17, 11, 17] against [18, 18, 11, 17] pooled
    pool_healthy: bool = True

    def __post_init__(self) -> None:
        for k in ("every_steps", "windows_to_act", "windows_to_undo"):
            check_positive_int(getattr(self, k), f"ActConfig.{k}")
        if not 1.0 <= self.recover_ratio < self.slow_ratio:
            raise error(f"ActConfig: need 1 <= recover_ratio < slow_ratio, got {self.recover_ratio}, {self.slow_ratio}")
        if not 0.0 < self.smoothing <= 1.0:
            raise error(f"ActConfig.smoothing must be in (0, 1], got {self.smoothing}")
        if (self.drain_ratio <= self.slow_ratio or min(self.replan_gain, self.min_gain) < 1.0
                or self.min_steps_between < 0):
            raise error("ActConfig: drain_ratio must exceed slow_ratio, replan_gain and min_gain >= 1, "
                        "min_steps_between >= 0")


@dataclass(kw_only=True, slots=True)
class Action:
    """One action, as logged: ``step_s_after`` is filled in when the next window is measured."""

    step: int
    kind: str  # rebalance | undo | drain | planned-gc | balanced-packing
    ranks: list[int]  # the DP ranks it is about
    reason: str
    counts: list[int] | None = None  # samples per DP rank from this step on (rebalance, undo)
    step_s_before: float | None = None  # mean step time (s) over the window before the action
    step_s_after: float | None = None  # ... and over the first full window after it
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def kill_switch_on(env: dict[str, str] | None = None) -> bool:
    """True when ``LAGGARD_ACT`` says no (0, false, off, no)."""
    v = (os.environ if env is None else env).get(ENV_KILL, "").strip().lower()
    return v in ("0", "false", "off", "no")


def split_samples(global_batch: int, time_per_sample: list[float], min_samples: int = 1) -> list[int]:
    """Samples per rank in proportion to speed (1 / time per sample), integers adding up to
    ``global_batch``, each at least ``min_samples``. Deterministic: the same numbers give the same split
    on every rank (largest remainder, ties to the lower rank)."""
    n = len(time_per_sample)
    if n * min_samples > global_batch:
        raise error(f"split_samples: {n} ranks x {min_samples} samples > global batch {global_batch}")
    speed = [1.0 / t if t > 0 and math.isfinite(t) else 0.0 for t in time_per_sample]
    if sum(speed) <= 0:
        return even_split(global_batch, n)
    counts = [min_samples] * n
    free = [True] * n
    # ranks whose proportional share is under the floor stay at the floor; the rest share the remainder
    while True:
        left = global_batch - sum(c for c, f in zip(counts, free, strict=True) if not f)
        total = sum(s for s, f in zip(speed, free, strict=True) if f)
        ideal = [left * s / total if f else 0.0 for s, f in zip(speed, free, strict=True)]
        low = [i for i in range(n) if free[i] and ideal[i] < min_samples]
        if not low:
            break
        for i in low:
            free[i] = False
    whole = [math.floor(x) if free[i] else counts[i] for i, x in enumerate(ideal)]
    rest = global_batch - sum(whole)
    order = sorted((i for i in range(n) if free[i]), key=lambda i: (-(ideal[i] - whole[i]), i))
    for i in order[:rest]:
        whole[i] += 1
    return whole


def even_split(global_batch: int, n: int) -> list[int]:
    base, extra = divmod(global_batch, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


class Controller:
    """See the module docstring. ``counts``/``offsets``/``my_slice`` say which samples of the
    global batch this DP rank trains on; ``sample_weight`` is its share of the global batch.

    Construct it on every rank after ``init_process_group`` (rank 0 of ``group`` writes the actions
    file and talks to the collector); ``group`` (default: the world) must hold every rank that calls
    ``step``, each passing its DP rank (pipeline stages of one replica pass the same one)."""

    def __init__(self, *, global_batch: int, dp_rank: int, dp_size: int, min_samples: int = 1,
                 config: ActConfig | None = None, group: Any = None, actions_path: str | Path | None = None,
                 collector_url: str | None = None, job_id: str | None = None, token: str | None = None,
                 webhook_url: str | None = None, enabled: bool = True) -> None:
        check_positive_int(global_batch, "global_batch")
        check_positive_int(dp_size, "dp_size")
        if not 0 <= dp_rank < dp_size or dp_size * min_samples > global_batch:
            raise error(f"Controller: dp_rank {dp_rank} of {dp_size}, {min_samples} samples each, global batch "
                        f"{global_batch}")
        self.cfg = config or ActConfig()
        self.global_batch, self.dp_rank, self.dp_size, self.min_samples = global_batch, dp_rank, dp_size, min_samples
        self.group, self.enabled, self.webhook_url = group, enabled, webhook_url
        self.counts = even_split(global_batch, dp_size)
        self.planned_gc = False
        self.balanced_packing = False
        self.actions: list[Action] = []
        self.windows: list[dict[str, Any]] = []  # what the last windows measured (rank 0)
        self._acc = [0.0, 0.0, 0.0, 0]  # compute_s, samples, step_s, steps
        self._slow_windows = self._ok_windows = 0
        self._last_action_step: int | None = None
        self._drained: set[int] = set()
        self._tps: list[float] | None = None  # smoothed compute seconds per sample, per DP rank
        self._leader = _rank(group) == 0
        self.actions_path = Path(actions_path) if actions_path is not None and self._leader else None
        self.link = None
        if collector_url and job_id and self._leader:
            self.link = remote.CollectorLink(collector_url, job_id, token).start()

    # ------------------------------------------------------------------ what the loop reads
    @property
    def shifted(self) -> bool:
        return self.counts != even_split(self.global_batch, self.dp_size)

    @property
    def offsets(self) -> list[int]:
        out, acc = [], 0
        for c in self.counts:
            out.append(acc)
            acc += c
        return out

    def my_slice(self, dp_rank: int | None = None) -> tuple[int, int]:
        """[lo, hi) of the global batch's samples for a DP rank (this one by default)."""
        d = self.dp_rank if dp_rank is None else dp_rank
        lo = self.offsets[d]
        return lo, lo + self.counts[d]

    @property
    def sample_weight(self) -> float:
        """Scale this rank's mean loss by this, then sum the gradients over DP ranks (not average):
        the update is the mean over the whole global batch, however it is split."""
        return self.counts[self.dp_rank] / self.global_batch

    # ------------------------------------------------------------------ per step
    def record(self, compute_s: float, num_samples: int | None = None) -> None:
        """This rank's compute time in the current step (forward + backward, no waits)."""
        self._acc[0] += float(compute_s)
        self._acc[1] += float(self.counts[self.dp_rank] if num_samples is None else num_samples)

    def step(self, step: int, step_s: float | None = None) -> list[Action]:
        """End of a step (every rank, same place): every ``every_steps`` steps the exchange and the
        decision. Returns the actions taken now (the same on every rank); they apply from the next step."""
        if step_s is not None:
            self._acc[2] += float(step_s)
            self._acc[3] += 1
        if not self.enabled or (step + 1) % self.cfg.every_steps:
            return []
        rows = self._exchange()
        self._acc = [0.0, 0.0, 0.0, 0]
        window = _summarise(rows, self.dp_size)
        if window is None:
            return []
        window["step"] = step
        self._smooth(window)
        self._fill_after(window)
        new = self._decide(step, window)
        if self._leader:
            self.windows = [*self.windows[-99:], window]  # the last 100
            for a in new:
                log.info("laggard act: step %d %s ranks %s: %s%s", a.step, a.kind, a.ranks, a.reason,
                         f" (samples per DP rank {a.counts})" if a.counts else "")
            if new or window.get("filled"):
                self._publish(new)
        return new

    def close(self) -> None:
        if self.link is not None:
            self.link.stop()
        if self.actions_path is not None:
            self._write()

    # ------------------------------------------------------------------ internals
    def _exchange(self) -> list[list[float]]:
        import torch
        import torch.distributed as dist

        allowed = 0.0 if kill_switch_on() or (self.link is not None and not self.link.act) else 1.0
        bits = float(self.link.bits) if self.link is not None else 0.0
        c, n, s, k = self._acc
        mine = [float(self.dp_rank), c, n, s, float(k), allowed, bits, 1.0]
        if not dist.is_available() or not dist.is_initialized():
            return [mine]
        device = "cpu"
        if dist.get_backend(self.group) == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        t = torch.tensor(mine, dtype=torch.float64, device=device)
        out = [torch.empty_like(t) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(out, t, group=self.group)
        return [x.cpu().tolist() for x in out]

    def _smooth(self, w: dict[str, Any]) -> None:
        a, raw = self.cfg.smoothing, w["time_per_sample"]
        self._tps = (list(raw) if self._tps is None
                     else [a * x + (1 - a) * p for x, p in zip(raw, self._tps, strict=True)])
        w["raw_time_per_sample"] = raw
        w["time_per_sample"], w["ratio"] = list(self._tps), _ratios(self._tps)

    def _rate_ok(self, step: int) -> bool:
        return self._last_action_step is None or step - self._last_action_step >= self.cfg.min_steps_between

    def _act(self, step: int, window: dict[str, Any], kind: str, ranks: list[int], reason: str,
             counts: list[int] | None = None, **evidence: Any) -> Action:
        a = Action(step=step, kind=kind, ranks=ranks, reason=reason, counts=counts,
                   step_s_before=window["step_s"], evidence=evidence)
        if counts is not None:
            self.counts = list(counts)
        if kind != "drain":
            self._last_action_step = step
        self.actions.append(a)
        return a

    def _decide(self, step: int, w: dict[str, Any]) -> list[Action]:
        out: list[Action] = []
        if not w["allowed"]:
            self._slow_windows = self._ok_windows = 0
            if self.shifted:  # the kill switch: back to the even split, at once
                out.append(self._act(step, w, "undo", list(range(self.dp_size)), "kill switch (LAGGARD_ACT=0 or the "
                                     "collector's act: false): back to the even split",
                                     even_split(self.global_batch, self.dp_size)))
            return out
        if w["bits"] & remote.FINDING_GC and not self.planned_gc and self._rate_ok(step):
            self.planned_gc = True
            out.append(self._act(step, w, "planned-gc", list(range(self.dp_size)),
                                 "the collector's finding: GC pauses; planned GC on every rank"))
        if w["bits"] & remote.FINDING_SEQUENCE and not self.balanced_packing and self._rate_ok(step):
            self.balanced_packing = True
            out.append(self._act(step, w, "balanced-packing", list(range(self.dp_size)),
                                 "the collector's finding: sequence imbalance; the sampler packs by cost"))
        if self.cfg.rebalance and not out:
            out += self._rebalance(step, w)
        return out

    def _rebalance(self, step: int, w: dict[str, Any]) -> list[Action]:
        cfg, t, ratio = self.cfg, w["time_per_sample"], w["ratio"]
        slow = [d for d in range(self.dp_size) if ratio[d] > cfg.slow_ratio]
        out: list[Action] = []
        ev = {"time_per_sample_ms": [round(x * 1e3, 4) for x in t], "ratio_to_median": [round(x, 3) for x in ratio]}
        if max(ratio) < cfg.recover_ratio:
            self._ok_windows += 1
            self._slow_windows = 0
            if self.shifted and self._ok_windows >= cfg.windows_to_undo and self._rate_ok(step):
                out.append(self._act(step, w, "undo", list(range(self.dp_size)),
                                     f"every DP rank within {cfg.recover_ratio}x of the other ranks' median compute "
                                     f"per sample for {self._ok_windows} windows: back to the even split",
                                     even_split(self.global_batch, self.dp_size), **ev))
            return out
        self._ok_windows = 0
        self._slow_windows = self._slow_windows + 1 if slow else 0
        sick = [d for d in range(self.dp_size) if ratio[d] > cfg.drain_ratio and d not in self._drained]
        if (self._slow_windows < cfg.windows_to_act and not self.shifted) or not self._rate_ok(step):
            return out
        new = split_samples(self.global_batch, _pooled(t, slow) if cfg.pool_healthy else t, self.min_samples)
        pred_now = max(c * x for c, x in zip(self.counts, t, strict=True))
        pred_new = max(c * x for c, x in zip(new, t, strict=True))
        if new != self.counts and pred_now > (cfg.replan_gain if self.shifted else cfg.min_gain) * pred_new:
            names = ", ".join(f"DP rank {d} {ratio[d]:.2f}x" for d in slow) or "rates changed"
            out.append(self._act(step, w, "rebalance", slow or list(range(self.dp_size)),
                                 f"compute per sample over the other ranks' median ({names}) for {self._slow_windows} "
                                 "windows: samples split by measured speed, predicted step compute "
                                 f"{pred_now * 1e3:.1f} -> {pred_new * 1e3:.1f} ms", new, **ev))
        floored = [d for d in slow if self.counts[d] == self.min_samples and ratio[d] * self.min_samples >
                   cfg.slow_ratio * self.global_batch / self.dp_size and d not in self._drained]
        for d in sorted(set(sick) | set(floored)):
            self._drained.add(d)
            out.append(self._act(step, w, "drain", [d], f"DP rank {d} is {ratio[d]:.2f}x the other ranks' median "
                                 "compute per sample: more than moving samples can absorb; drain its node", **ev))
            self._post_drain(out[-1])
        return out

    def _post_drain(self, a: Action) -> None:
        if self._leader and self.webhook_url:
            remote.post_webhook(self.webhook_url, {"action": "drain", **a.to_json()})

    def _fill_after(self, w: dict[str, Any]) -> None:
        """The first full window after an action gives its ``step_s_after``."""
        for a in self.actions:
            if a.step_s_after is None and a.step < w["step"]:
                a.step_s_after = w["step_s"]
                w["filled"] = True

    def _publish(self, new: list[Action]) -> None:
        docs = [a.to_json() for a in self.actions]
        if self.actions_path is not None:
            self._write()
        if self.link is not None:
            self.link.post_actions(docs)

    def _write(self) -> None:
        assert self.actions_path is not None
        self.actions_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.actions_path.with_suffix(".tmp")
        tmp.write_text(json.dumps([a.to_json() for a in self.actions], indent=1))
        tmp.replace(self.actions_path)


def _rank(group: Any) -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0
    except ImportError:
        return 0


def _summarise(rows: list[list[float]], dp_size: int) -> dict[str, Any] | None:
    """Per DP rank: compute seconds per sample (the slowest of its members, e.g. pipeline stages);
    the ratio to the median; the mean step time; the kill switch (all must allow) and findings."""
    per: list[float] = [0.0] * dp_size
    for r in rows:
        d, c, n = int(r[0]), r[1], r[2]
        if n > 0:
            per[d] = max(per[d], c / n)
    if any(x <= 0 for x in per):
        return None  # a rank measured nothing this window (it is starting)
    steps = sum(r[4] for r in rows)
    return {"time_per_sample": per,
            "step_s": sum(r[3] for r in rows) / steps if steps else None,
            "allowed": all(r[5] > 0 for r in rows), "bits": int(rows[0][6])}


def _pooled(tps: list[float], slow: list[int]) -> list[float]:
    """Times per sample with the ranks not in ``slow`` set to their median (two or more of them)."""
    healthy = [d for d in range(len(tps)) if d not in slow]
    if len(healthy) < 2:
        return tps
    m = _median([tps[d] for d in healthy])
    return [tps[d] if d in slow else m for d in range(len(tps))]


def _ratios(tps: list[float]) -> list[float]:
    """Each rank's time per sample over the median of the *other* ranks' (with 2 ranks the median of
    both is their mean: a 1.2x rank would read 1.09x)."""
    if len(tps) < 2:
        return [1.0] * len(tps)
    return [x / _median(tps[:d] + tps[d + 1:]) for d, x in enumerate(tps)]


def _median(xs: list[float]) -> float:
    s, n = sorted(xs), len(xs)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
