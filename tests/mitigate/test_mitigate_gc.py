"""PlannedGC in one process (the multi-rank agreement is in test_mitigate_dist.py)."""

from __future__ import annotations

import gc
import warnings

import pytest

from laggard.errors import LaggardError, LaggardWarning
from laggard.mitigate import PlannedGC
from laggard.mitigate.gc import REASON_COUNT, REASON_FREEZE, REASON_GUARD, rss_bytes

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _restore_gc():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def _garbage(n: int) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)  # a cycle: only the collector frees it


def test_fixed_interval_freeze_timing_and_hook():
    calls = []
    was = gc.isenabled()
    plan = PlannedGC(interval_steps=3, freeze_after_steps=1, on_collect=lambda *a: calls.append(a)).start()
    assert not gc.isenabled()
    for _ in range(10):
        _garbage(100)
        plan.step()
    plan.stop()
    assert gc.isenabled() == was
    steps = [c.step for c in plan.collections]
    assert steps == [1, 4, 7, 10]
    assert plan.frozen and plan.collections[0].reasons & REASON_FREEZE
    assert gc.get_freeze_count() > 0
    assert len(calls) == 4
    for (start_ns, dur_ns, gen), c in zip(calls, plan.collections, strict=True):
        assert isinstance(start_ns, int) and isinstance(dur_ns, int) and dur_ns >= 0 and gen == 2
        assert (start_ns, dur_ns) == (c.start_ns, c.dur_ns)
    assert plan.collections[1].num_collected >= 100  # the cycles were freed at the planned step
    s = plan.summary()
    assert s["num_collections"] == 4 and s["collection_steps"] == steps and not s["distributed"]


def test_adaptive_on_generation_count():
    plan = PlannedGC(interval_steps=None, adaptive=True, gen0_threshold=1000, rss_growth_bytes=None,
                     freeze_after_steps=None).start()
    for step in range(1, 11):
        _garbage(400 if step >= 5 else 0)
        plan.step()
    plan.stop()
    assert plan.collections, "the allocations crossed the threshold"
    assert all(c.reasons & REASON_COUNT for c in plan.collections)
    assert plan.collections[0].step >= 6


def test_memory_guard_and_context_manager():
    if rss_bytes() is None:
        pytest.skip("no /proc here")
    with PlannedGC(interval_steps=None, max_rss_bytes=1, freeze_after_steps=None) as plan:
        plan.step()
        plan.step()
    assert [c.step for c in plan.collections] == [1, 2]
    assert all(c.reasons & REASON_GUARD and c.rss_before_bytes for c in plan.collections)


def test_check_every_and_min_interval():
    plan = PlannedGC(interval_steps=2, check_every_steps=5, freeze_after_steps=None).start()
    for _ in range(10):
        plan.step()
    plan.stop()
    assert [c.step for c in plan.collections] == [5, 10]


def test_reenabled_gc_is_turned_off_with_a_warning_and_unplanned_counted():
    plan = PlannedGC(interval_steps=100, freeze_after_steps=None).start()
    gc.enable()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        plan.step()
    assert not gc.isenabled()
    assert any(issubclass(x.category, LaggardWarning) and "re-enabled" in str(x.message) for x in w)
    gc.collect()
    plan.stop()
    assert plan.num_unplanned == 1


def test_errors():
    with pytest.raises(LaggardError, match="nothing is ever collected"):
        PlannedGC(interval_steps=None)
    with pytest.raises(LaggardError, match="interval_steps"):
        PlannedGC(interval_steps=0)
    with pytest.raises(LaggardError, match="generation"):
        PlannedGC(generation=3)
    with pytest.raises(LaggardError, match="before start"):
        PlannedGC().step()
