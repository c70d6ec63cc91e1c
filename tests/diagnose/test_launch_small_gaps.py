"""A rank named for many small untraced gaps (``laggard.diagnose.launch``) only where its untraced host
time as a whole stands out, on jobs from the synthetic generator (``laggard.groundtruth.synth``: the
truth is what it injects, not what the diagnosis reads).

One rank pays a launch delay before each of its computes, each gap too small to be modelled as a host
op (under 2% of a step): it is named. The same rank with the same small gaps while every other rank
pays as much untraced time per step in one long gap each (a host op the model holds): every rank
spends the same untraced time, and none is named; the launch delay is job-wide. The small gaps alone
(the rule before) name that rank: on a busy host it is how a rank descheduled in small gaps a few ms
more than its peers read as a stall of its own.
"""

from __future__ import annotations

import warnings

import pytest

from laggard.analysis.pipeline import analyze
from laggard.errors import LaggardWarning
from laggard.groundtruth.inject import parse_injections
from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

SLOW = 1
COMPUTES_PER_STEP = 16  # a forward and a backward for each of the 8 microbatches


def _launch_findings(dp: int, pp: int, specs: list[str]) -> list:
    cfg = SynthConfig(dp=dp, pp=pp, steps=12, microbatches=8, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = analyze(synthesize_with_truth(cfg, parse_injections(specs)).job)
    return [f for f in res.diagnosis.findings if f.cause == "launch-delay" and not f.hidden]


def _as_much_elsewhere(dp: int, pp: int, ms: float) -> list[str]:
    """One long untraced gap per step on every other rank, as long as the slow rank's small ones together."""
    return [f"host-stall:rank={r},ms={COMPUTES_PER_STEP * ms:g}" for r in range(dp * pp) if r != SLOW]


@pytest.mark.parametrize(("dp", "pp"), [(4, 1), (2, 2)])
@pytest.mark.parametrize("ms", [1.0, 2.5])
def test_small_gaps_on_one_rank_name_it(dp: int, pp: int, ms: float) -> None:
    found = _launch_findings(dp, pp, [f"launch-delay:rank={SLOW},ms={ms:g}"])
    assert [[w["rank"] for w in f.workers] for f in found] == [[SLOW]], [f.evidence for f in found]


@pytest.mark.parametrize(("dp", "pp"), [(4, 1), (2, 2)])
@pytest.mark.parametrize("ms", [1.0, 2.5])
def test_small_gaps_beside_as_much_untraced_time_elsewhere_name_no_rank(dp: int, pp: int, ms: float) -> None:
    found = _launch_findings(dp, pp, [f"launch-delay:rank={SLOW},ms={ms:g}", *_as_much_elsewhere(dp, pp, ms)])
    assert found, "the untraced time every rank pays is found"
    assert all(not f.workers for f in found), [(f.workers, f.evidence) for f in found]


def test_judged_on_the_small_gaps_alone_the_rank_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from laggard.diagnose import launch

    monkeypatch.setattr(launch, "_untraced_stands_out", lambda *a, **k: True)  # the rule off
    found = _launch_findings(2, 2, [f"launch-delay:rank={SLOW},ms=1", *_as_much_elsewhere(2, 2, 1.0)])
    assert any([w["rank"] for w in f.workers] == [SLOW] for f in found), [f.evidence for f in found]
