"""What the diagnosis reports, as plain data: findings (causes with evidence, share and gain) and the
verdict, with their JSON (``to_json``). Detectors in ``laggard.diagnose`` produce them; rendering
lives in ``laggard.report``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laggard.results.onestep import OneStep

# laggard commands that carry a fix out, and what they do: a detector names one (``fix_tool``);
# where the trace is known the analysis writes it out in full (``fix_command``)
FIX_TOOLS = {"partition": "proposes the split"}


def finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def step_spans(steps: list[int]) -> str:
    """``[7, 8, 9, 15]`` -> ``'7-9 and 15'``: runs of consecutive steps."""
    runs: list[list[int]] = []
    for s in sorted(steps):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# a ratio this large says the reference's time is a sliver of the target's (a rank that sleeps in a
# pass whose peers compute for well under a millisecond); its spread is then as large as it is, and the
# time the target adds per step is what a reader can weigh, so that is what the text gives
RATIO_SHOWN_BELOW = 5.0
REFERENCE_OF = {"compute": "its peers'", "transfer": "the other links'"}


@dataclass(kw_only=True, slots=True)
class Consistency:
    """How consistent one named target's excess is over the job's steps, against the job's own noise
    (``laggard.diagnose.noise``). Per step: the target's time (compute, transfer or host time) over
    its reference (its stage peers', the other stages', its op type's other links'); for host time
    (``basis`` "host") the ratio is the rank's step lengthened by its excess: 1 + excess / ideal step;
    for its own effect on the step (``basis`` "step") the replay with only its ops measured over the
    all-ideal one (``laggard.diagnose.impact``)."""

    target: str  # "rank 3", "stage 1", "link 2->3 (backward-recv)"
    basis: str  # compute | transfer | host | extra (work its peers do not do) | step
    pattern: str  # consistent | transient | noise (within the job's noise: not named) | unjudged (no reference)
    steps_total: int  # steps judged
    slow_steps: list[int]  # the steps where it exceeds its reference beyond the noise
    ratio: float  # median per-step ratio (over the slow steps when transient)
    ratio_spread: float  # 1.4826 x MAD of those ratios (a robust sigma)
    noise: float  # the job's per-step noise (sigma of the same ratio for the other targets)
    excess_s: float  # median per-step excess over the reference, seconds (same steps as ``ratio``)
    # transient as one contiguous run of slow steps, healthy outside it (a straggler that recovers or
    # starts late), not in scattered bursts
    run: bool = False
    # judged over windows of this many consecutive steps (``steps_total`` and ``slow_steps`` count the
    # windows, each by its first step): a steady cost that lands in bursts every few steps
    window_steps: int = 1
    # transient in slow steps evenly spaced this many steps apart (0: not so): work every N-th step
    period: int = 0

    @property
    def text(self) -> str:
        """E.g. "rank 3: slow in 23 of 24 steps, 1.31x ± 0.04 (job noise ± 0.02)"."""
        return f"{self.what} ({self.noise_text})"

    @property
    def what(self) -> str:
        """The text without the noise: "rank 3: slow in 23 of 24 steps, 1.31x ± 0.04"."""
        n, k = self.steps_total, len(self.slow_steps)
        if self.pattern == "unjudged":
            return f"{self.target}: nothing to compare its steps with"
        if self.basis in ("host", "extra"):
            what = "host time" if self.basis == "host" else "work its peers do not do"
            size = f"+{1e3 * self.excess_s:.1f} ms of {what} per step ({100 * (self.ratio - 1):.0f}% of the step)"
        elif self.basis in REFERENCE_OF and self.ratio >= RATIO_SHOWN_BELOW and self.excess_s > 0:
            size = f"+{1e3 * self.excess_s:.1f} ms per step, {self.ratio:.0f}x {REFERENCE_OF[self.basis]} time"
        else:
            size = f"{self.ratio:.2f}x ± {self.ratio_spread:.2f}"
        if self.pattern == "transient":
            every = f"every {self.period} steps, " if self.period else ""
            spans = step_spans(self.slow_steps)
            where = f"slow in step{'s' if k > 1 else ''} {spans} ({every}{k} of {n}), {size} there"
        elif self.window_steps > 1:
            where = f"slow in {k} of {n} windows of {self.window_steps} steps, {size}"
        else:
            where = f"slow in {k} of {n} steps, {size}"
        return f"{self.target}: {where}" + (" (within noise)" if self.pattern == "noise" else "")

    @property
    def noise_text(self) -> str:
        if self.basis in ("host", "extra"):
            return f"job noise ± {100 * self.noise:.1f}% of the step"
        return f"job noise ± {self.noise:.2f}"

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "basis": self.basis, "pattern": self.pattern,
                "steps_slow": len(self.slow_steps), "steps_total": self.steps_total,
                "slow_steps": self.slow_steps, "ratio": finite(self.ratio),
                "ratio_spread": finite(self.ratio_spread), "noise": finite(self.noise),
                "excess_s": finite(self.excess_s), "run": self.run, "window_steps": self.window_steps,
                "period_steps": self.period}


@dataclass(kw_only=True, slots=True)
class Finding:
    cause: str
    workers: list[dict[str, int]] = field(default_factory=list)
    stages: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    evidence: str = ""
    score: float = 0.0  # share of the slowdown that fixing only this removes (from the measured job)
    share: float = 0.0  # its part of the slowdown in the joint attribution (Shapley; the shares add up)
    gain: float = 1.0  # speed-up of fixing only this
    fix: str = ""
    fix_tool: str = ""  # the laggard command that carries the fix out (a key of FIX_TOOLS)
    fix_command: str = ""  # that command for this trace, in words (``laggard.analysis.partition``)
    # a partition fix where the layer count is known: the speed-up of the whole-layer split `laggard
    # partition` proposes (``gain`` is then the bound of a continuous split) and that split
    # (decoder layers per stage now and proposed, the layout, step times, the command)
    gain_layers: float | None = None
    layers_plan: dict[str, Any] | None = None
    whatif: list[str] = field(default_factory=list)  # the `laggard whatif` flags whose speed-up is `gain`
    command: str = ""  # the whole command, with the trace and the flags it was loaded with
    # "high": a detector read the cause's signature; "low": no signature fitted and this is the largest
    # carrier of the residual (its what-if says how much fixing it would give, not why it is slow)
    confidence: str = "high"
    # named only when the detectors ran again on the job with the first findings fixed: a straggler
    # those findings hid (its signature was within their noise)
    hidden: bool = False
    # a hidden finding on the job with the findings it hid behind fixed: its fix's speed-up there
    # ("gain") and the share of that job's slowdown it removes ("share"); its ``share`` above is of the
    # measured slowdown, mostly the stronger causes' (None: not hidden)
    once_fixed: dict[str, float] | None = None
    # how consistent each named target's excess is (worst first); empty for causes that name no
    # target of their own (sequence imbalance, GC, a tail on every link, the launch overhead)
    targets: list[Consistency] = field(default_factory=list)
    # why the fix gains more than the job's slowdown S (empty where it does not): one line, e.g. the fix
    # removes time the pooled ideal also pays (``laggard.diagnose.beyond``)
    beyond_s: str = ""

    @property
    def localized(self) -> bool:
        """Whether it names a rank, a stage or a link (a link's finding names its two ranks); a job-wide
        finding (the launch overhead every rank pays, a tail every link shares) names none."""
        return bool(self.workers or self.stages)

    @property
    def everywhere(self) -> bool:
        """Whether it is a cost every rank pays alike (the launch overhead, a transfer tail every link
        shares): no straggler. One rank's own host time is a launch delay naming that rank, a straggler;
        garbage collection and sequence imbalance name no rank, yet strike ranks unevenly: stragglers."""
        return self.cause in ("launch-delay", "comm") and not self.localized

    @property
    def steps_slow(self) -> int | None:
        return len(self.targets[0].slow_steps) if self.targets else None

    @property
    def steps_total(self) -> int | None:
        return self.targets[0].steps_total if self.targets else None

    @property
    def ratio(self) -> float | None:
        return self.targets[0].ratio if self.targets else None

    @property
    def ratio_spread(self) -> float | None:
        return self.targets[0].ratio_spread if self.targets else None

    @property
    def transient_steps(self) -> list[int]:
        """The slow steps of the first target when it is a transient straggler (empty otherwise)."""
        t = self.targets[0] if self.targets else None
        return list(t.slow_steps) if t is not None and t.pattern == "transient" else []

    @property
    def consistency_text(self) -> str:
        """The first targets' consistency, "; "-joined, with the job's noise once (empty when none)."""
        if not self.targets:
            return ""
        shown = self.targets[:4]
        more = f"; and {len(self.targets) - 4} more" if len(self.targets) > 4 else ""
        return "; ".join(t.what for t in shown) + more + f" ({shown[0].noise_text})"

    @property
    def gain_is_bound(self) -> bool:
        """Whether ``gain`` is the bound of a continuous fix (a stage rebalance moves whole layers)."""
        return self.fix_tool == "partition"

    @property
    def shown_gain(self) -> float:
        """The gain to show: the whole-layer one where known, else ``gain``."""
        return self.gain if self.gain_layers is None else self.gain_layers

    @property
    def fix_text(self) -> str:
        """The fix, with the command that carries it out where there is one."""
        if self.fix_command:
            return f"{self.fix}; {self.fix_command}"
        if self.fix_tool:
            return f"{self.fix} (`laggard {self.fix_tool}` {FIX_TOOLS[self.fix_tool]})"
        return self.fix

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "workers": self.workers,
            "stages": self.stages,
            "steps": self.steps,
            "evidence": self.evidence,
            "score": finite(self.score),
            "share": finite(self.share),
            "gain": finite(self.gain),
            # where the fix moves whole layers: "gain" is the continuous bound ("gain_bound" true) and
            # "gain_layers" the speed-up of `laggard partition`'s split (null: the layer count is unknown)
            "gain_bound": self.gain_is_bound,
            "gain_layers": finite(self.gain_layers),
            "layers_plan": self.layers_plan,
            "fix": self.fix_text,
            "whatif": self.command,
            "confidence": self.confidence,
            "hidden": self.hidden,
            "once_fixed": None if self.once_fixed is None else {k: finite(v) for k, v in self.once_fixed.items()},
            # how consistent the excess is (new keys; null where the finding names no target)
            "steps_slow": self.steps_slow,
            "steps_total": self.steps_total,
            "ratio": finite(self.ratio),
            "ratio_spread": finite(self.ratio_spread),
            "transient_steps": self.transient_steps,
            "consistency": self.consistency_text,
            "targets": [t.to_json() for t in self.targets],
            "beyond_slowdown": self.beyond_s,  # why the gain exceeds S ("" where it does not)
        }


@dataclass(kw_only=True, slots=True)
class Diagnosis:
    # healthy | straggling | not enough to judge | cannot judge (the replay does not model the job) | one step
    # only / few steps only (too few to judge: each step read on its own, ``one_step``)
    verdict: str
    threshold: float
    findings: list[Finding]
    reason: str = ""  # why a job could not be judged (verdicts "not enough to judge" and "cannot judge")
    combined_share: float = 0.0  # the slowdown removed by fixing every finding together
    combined_gain: float = 1.0
    interaction: float = 0.0  # combined share minus the sum of the findings' own scores
    unexplained: float = 0.0  # 1 - combined share
    unexplained_by: list[dict[str, Any]] = field(default_factory=list)  # the attributions that carry it
    note: str = ""  # how a straggling verdict was reached when S alone would not show it (diagnose.unseen)
    # too few steps to judge: what each step says on its own (verdict "one step only" / "few steps only":
    # laggard.diagnose.onestep); empty otherwise
    one_step: list[OneStep] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "healthy_threshold": self.threshold,
            "findings": [f.to_json() for f in self.findings],
        }
        if self.reason:
            out["reason"] = self.reason
        if self.note:
            out["note"] = self.note
        if self.one_step:
            out["one_step"] = [x.to_json() for x in self.one_step]
        if self.verdict == "straggling":
            out["combined"] = {"share": finite(self.combined_share), "gain": finite(self.combined_gain),
                               "interaction": finite(self.interaction), "unexplained": finite(self.unexplained),
                               "unexplained_by": self.unexplained_by}
        return out


__all__ = ["FIX_TOOLS", "Consistency", "Diagnosis", "Finding", "finite", "step_spans"]
