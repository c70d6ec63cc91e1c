"""Straggler causes the simulator can inject, in the simulator's own spec syntax.

``KIND:key=value,...``, the spelling of ``laggard synth``/``laggard demo --inject``
(``laggard.groundtruth.inject``), where a rank may be a ``+``-separated list
(``slow-worker:rank=3+9,factor=1.5``):

==================  ==========================================  =========================================
kind                keys (defaults)                             effect in the simulated job
==================  ==========================================  =========================================
slow-worker         rank (0), factor (1.5)                      the device of each rank computes slower
heavy-stage         stage (last), factor (1.5)                  one stage's layers cost ``factor`` x more
seqlen-imbalance    sigma (0.5)                                 lognormal document lengths; attention
                                                                cost grows with their squares
gc-pauses           prob (0.05), pause_ms (50)                  the host pauses mid-forward to collect
slow-link           src (0), dst (1), delay_ms (10)             every transfer from src to dst is late
launch-delay        ms (3)                                      host-side work before each compute launch
==================  ==========================================  =========================================

The simulator's earlier spellings (``ranks=``, ``seq-imbalance``, ``gc``) are still read, each with a
warning. Kept separate from ``laggard.groundtruth.inject`` on purpose (only the spelling is shared): the
simulator is an independent model of a job and shares nothing with the generator the analysis was
built beside.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laggard.errors import LaggardError, LaggardWarning

# the spelling users write (that of ``--inject``) -> the kind and key the simulator uses inside
PUBLIC_KINDS = {"seqlen-imbalance": "seq-imbalance", "gc-pauses": "gc"}
_SPELLED = {v: k for k, v in PUBLIC_KINDS.items()}
_OLD_KEYS = {"ranks": "rank"}  # read with a warning

KINDS: dict[str, dict[str, float | list[int]]] = {
    "slow-worker": {"ranks": [0], "factor": 1.5},
    "heavy-stage": {"stage": -1, "factor": 1.5},
    "seq-imbalance": {"sigma": 0.5},
    "gc": {"prob": 0.05, "pause_ms": 50.0},
    "slow-link": {"src": 0, "dst": 1, "delay_ms": 10.0},
    "launch-delay": {"ms": 3.0},
}
# the cause the diagnosis should name for each kind (laggard's Finding.cause)
DIAGNOSIS_CAUSE = {
    "slow-worker": "worker",
    "heavy-stage": "stage-imbalance",
    "seq-imbalance": "sequence-imbalance",
    "gc": "gc",
    "slow-link": "comm",
    "launch-delay": "launch-delay",
}
_INT_KEYS = {"src", "dst", "stage"}


@dataclass(kw_only=True, slots=True)
class Cause:
    kind: str
    params: dict[str, float | list[int]] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float:
        v = self.params[key]
        assert not isinstance(v, list)
        return v

    @property
    def ranks(self) -> list[int]:
        v = self.params.get("ranks", [])
        assert isinstance(v, list)
        return v

    def spec(self) -> str:
        def fmt(k: str, v: float | list[int]) -> str:
            if isinstance(v, list):
                return "+".join(str(x) for x in v)
            return str(int(v)) if k in _INT_KEYS else f"{v:g}"

        return f"{_SPELLED.get(self.kind, self.kind)}:" + ",".join(
            f"{'rank' if k == 'ranks' else k}={fmt(k, v)}" for k, v in self.params.items())

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "cause": DIAGNOSIS_CAUSE[self.kind], **self.params}


def parse_cause(spec: str) -> Cause:
    """'slow-worker:rank=3+9,factor=1.5' -> Cause; one-line errors for anything else."""
    import warnings

    kind, _, body = spec.strip().partition(":")
    if kind in PUBLIC_KINDS:
        kind = PUBLIC_KINDS[kind]
    elif kind in _SPELLED:
        warnings.warn(f"--inject {spec!r}: {kind!r} is the old spelling of {_SPELLED[kind]!r}", LaggardWarning,
                      stacklevel=2)
    if kind not in KINDS:
        known = ", ".join(_SPELLED.get(k, k) for k in KINDS)
        raise LaggardError(f"--inject {spec!r}: unknown kind {kind!r} (choose from {known})")
    params: dict[str, float | list[int]] = {k: (list(v) if isinstance(v, list) else v) for k, v in KINDS[kind].items()}
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, eq, val = part.partition("=")
        if key == "rank":
            key = "ranks"
        elif key in _OLD_KEYS:
            warnings.warn(f"--inject {spec!r}: {key}= is the old spelling of {_OLD_KEYS[key]}=", LaggardWarning,
                          stacklevel=2)
        if not eq or key not in params:
            keys = ", ".join(f"{'rank' if k == 'ranks' else k}=..." for k in KINDS[kind])
            raise LaggardError(f"--inject {spec!r}: {part!r} is not one of {keys}")
        try:
            if key == "ranks":
                ranks = [int(x) for x in val.split("+")]
                if not ranks or min(ranks) < 0:
                    raise ValueError
                params[key] = sorted(set(ranks))
                continue
            num = float(val)
        except ValueError:
            raise LaggardError(f"--inject {spec!r}: {key}={val!r} is not a valid value") from None
        if key in _INT_KEYS:
            if num != int(num) or (num < 0 and key != "stage"):
                raise LaggardError(f"--inject {spec!r}: {key} must be an integer")
            num = int(num)
        elif num < 0:
            raise LaggardError(f"--inject {spec!r}: {key} must be >= 0")
        params[key] = num
    if "factor" in params and float(params["factor"]) < 1:  # type: ignore[arg-type]
        raise LaggardError(f"--inject {spec!r}: factor must be >= 1")
    if kind == "gc" and not 0 <= float(params["prob"]) <= 1:  # type: ignore[arg-type]
        raise LaggardError(f"--inject {spec!r}: prob must be between 0 and 1")
    if kind == "slow-link" and params["src"] == params["dst"]:
        raise LaggardError(f"--inject {spec!r}: src and dst must differ")
    return Cause(kind=kind, params=params)
