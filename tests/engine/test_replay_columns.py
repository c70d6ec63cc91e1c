"""Large graphs replay their scenarios one column at a time (``laggard.engine.replay.column_wise``):
the same step times, bit for bit, as the batched 2-D replay. Forced on small synthetic jobs by
lowering the node threshold."""

from __future__ import annotations

import numpy as np
import pytest

import laggard.engine.replay as replay_mod
from laggard.engine.baseline import prepare, replay_mixed
from laggard.groundtruth.inject import parse_injections
from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth


@pytest.fixture(scope="module")
def base():
    res = synthesize_with_truth(SynthConfig(dp=12, pp=4, microbatches=6, steps=4, seed=3),
                                parse_injections(["slow-worker:rank=5,factor=1.5", "host-stall:rank=2,ms=20,every=2"]))
    return prepare(res.job)


def _both(monkeypatch, graph, run):
    """``run()`` batched, then column by column."""
    monkeypatch.setattr(replay_mod, "COLUMN_WISE_NODES", 2**62)
    assert not replay_mod.column_wise(graph)
    batched = run()
    monkeypatch.setattr(replay_mod, "COLUMN_WISE_NODES", 0)
    assert replay_mod.column_wise(graph)
    return batched, run()


def test_replay_mixed_column_wise_is_the_batched_replay(base, monkeypatch):
    rng = np.random.default_rng(0)
    labels_many = rng.integers(0, 20, base.graph.num_ops)  # > 8 values: the sorted-label path
    blocks = [(None, [1, 0]), (base.attr_code, np.arange(len(base.attr_names))),
              (base.pp_rank, np.unique(base.pp_rank)),
              (base.is_comm(), [False, True]), (base.dp_rank, np.unique(base.dp_rank)), (labels_many, np.arange(20)),
              (base.rank.astype(np.float64), [0.0, 5.0]),  # float labels: compared op by op
              (labels_many.astype(np.float64), np.arange(20.0)),  # many float labels: found by a search
              (base.pp_rank, [0, 1, 1, 2, 0, 3, 2, 1, 0, 3])]  # values asked twice: compared
    for keep in (True, False):
        batched, cols = _both(monkeypatch, base.graph,
                              lambda keep=keep: replay_mixed(base, *blocks, keep_measured=keep))
        assert len(batched) == len(cols) == len(blocks)
        for a, b in zip(batched, cols, strict=True):
            assert a.shape == b.shape and np.array_equal(a, b)
    # the scenarios differ from each other (the test would pass on a constant answer otherwise)
    assert len({float(x) for x in batched[1].mean(axis=0)}) > 3


def test_replay_steps_column_wise_is_the_batched_replay(base, monkeypatch):
    rng = np.random.default_rng(1)
    w = base.measured[:, None] * rng.uniform(0.5, 1.5, (base.graph.num_ops, 5))
    a, b = _both(monkeypatch, base.graph, lambda: replay_mod.replay_steps(base.graph, w))
    assert a.shape == b.shape == (len(base.graph.steps), 5) and np.array_equal(a, b)
    # one column alone replays as before
    assert np.array_equal(replay_mod.replay_steps(base.graph, w[:, 2]), a[:, 2])
