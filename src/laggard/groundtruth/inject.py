"""Straggler causes to inject, one syntax for the real demo job and the synthetic generator.

``--inject CAUSE[:key=value,...]`` (repeatable):

==================  ===================================  =======================================
cause               keys (defaults)                      effect
==================  ===================================  =======================================
slow-worker         rank (0), factor (2.0)               extra compute on one global rank
heavy-last-stage    factor (3.0)                         the loss/logits layer on the last stage
                                                         costs ``factor`` x a normal layer more
seqlen-imbalance    sigma (0.5)                          variable-length microbatches (lognormal
                                                         sequence lengths, cost ~ sum of squares)
gc-pauses           prob (0.05), pause_ms (50)           Python garbage collections that pause a
                                                         rank at random forward passes
slow-link           src (0), dst (1), delay_ms (20),     delayed p2p transfers from src to dst:
                    shaped (0)                           the sender sleeps before each send, or
                                                         with shaped=1 the link's bandwidth is
                                                         throttled (tc, root: demo/netshape.py)
launch-delay        ms (5), rank (every rank)            CPU-side delay before each compute launch,
                                                         on every rank or on the one given (CPU
                                                         contention on its host)
host-stall          rank (0), ms (20), every (1)         untraced host work (a busy Python loop) on
                                                         one rank before the first compute of every
                                                         ``every``-th step: steady (1) or bursty
heavy-stage         stage (0), factor (2.0)              every rank of one pipeline stage computes
                                                         ``factor`` x its normal work
==================  ===================================  =======================================

``slow-worker``, ``slow-link`` and ``host-stall`` may be given more than once (other ranks or links).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laggard.errors import LaggardError

CAUSES: dict[str, dict[str, float]] = {
    "slow-worker": {"rank": 0, "factor": 2.0},
    "heavy-last-stage": {"factor": 3.0},
    "seqlen-imbalance": {"sigma": 0.5},
    "gc-pauses": {"prob": 0.05, "pause_ms": 50.0},
    "slow-link": {"src": 0, "dst": 1, "delay_ms": 20.0},
    "launch-delay": {"ms": 5.0},
    "host-stall": {"rank": 0, "ms": 20.0, "every": 1},
    "heavy-stage": {"stage": 0, "factor": 2.0},
}
_INT_KEYS = {"rank", "src", "dst", "stage", "every", "shaped"}
# keys a cause takes only when given (its spec and trace meta stay as they were without them)
OPTIONAL: dict[str, dict[str, float]] = {"slow-link": {"shaped": 0}, "launch-delay": {"rank": 0}}
_REPEATABLE = {"slow-worker", "slow-link", "host-stall"}


@dataclass(kw_only=True, slots=True)
class Injection:
    cause: str
    params: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float:
        return self.params[key]

    def spec(self) -> str:
        body = ",".join(f"{k}={int(v) if k in _INT_KEYS else v:g}" for k, v in self.params.items())
        return f"{self.cause}:{body}" if body else self.cause

    def to_json(self) -> dict[str, object]:
        return {"cause": self.cause, **self.params}


def parse_injection(spec: str) -> Injection:
    """'slow-worker:rank=3,factor=2' -> Injection; one-line errors for anything else."""
    cause, _, body = spec.strip().partition(":")
    if cause not in CAUSES:
        raise LaggardError(f"--inject {spec!r}: unknown cause {cause!r} (choose from {', '.join(CAUSES)})")
    params = dict(CAUSES[cause])
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, eq, val = part.partition("=")
        known = {**CAUSES[cause], **OPTIONAL.get(cause, {})}
        if not eq or key not in known:
            raise LaggardError(
                f"--inject {spec!r}: {part!r} is not one of {', '.join(f'{k}=...' for k in known)}"
            )
        try:
            num = float(val)
        except ValueError:
            raise LaggardError(f"--inject {spec!r}: {key}={val!r} is not a number") from None
        if key in _INT_KEYS:
            if num != int(num) or num < 0:
                raise LaggardError(f"--inject {spec!r}: {key} must be a non-negative integer")
            num = int(num)
        elif num < 0:
            raise LaggardError(f"--inject {spec!r}: {key} must be >= 0")
        params[key] = num
    if cause in ("slow-worker", "heavy-last-stage", "heavy-stage") and params["factor"] < 1:
        raise LaggardError(f"--inject {spec!r}: factor must be >= 1")
    if cause == "gc-pauses" and not 0 <= params["prob"] <= 1:
        raise LaggardError(f"--inject {spec!r}: prob must be between 0 and 1")
    if cause == "host-stall" and params["every"] < 1:
        raise LaggardError(f"--inject {spec!r}: every must be >= 1 (1: every step; k: every k-th step)")
    if cause == "slow-link" and params["src"] == params["dst"]:
        raise LaggardError(f"--inject {spec!r}: src and dst must differ")
    if cause == "slow-link" and params.get("shaped", 0) not in (0, 1):
        raise LaggardError(f"--inject {spec!r}: shaped must be 0 (the sender sleeps) or 1 (the link is throttled)")
    return Injection(cause=cause, params=params)


def parse_injections(specs: list[str] | None) -> list[Injection]:
    out = [parse_injection(s) for s in specs or []]
    seen = [i.cause for i in out if i.cause not in _REPEATABLE]
    dup = {c for c in seen if seen.count(c) > 1}
    if dup:
        raise LaggardError(f"--inject: {', '.join(sorted(dup))} given more than once")
    return out
