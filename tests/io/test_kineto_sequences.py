"""The sequences a profiled pass attends over, read from its attention calls' recorded shapes
(``laggard.io.kineto.sequences``): a real torch.profiler trace of attention passes over lengths the
test chose (``tests/kineto_attention.py``) gives each forward and backward pass its batch of
sequences, ``seq_lens`` in the op table as the Tracer records them; without recorded shapes, none."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from laggard.errors import LaggardWarning
from laggard.io import load_job
from tests.kineto_attention import BATCH, LENGTHS, make_traces_in_subprocess


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_traces_in_subprocess(tmp_path_factory.mktemp("attention"))


def _load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        return load_job(path).table


@pytest.mark.timeout(240)
def test_each_pass_attends_over_the_sequences_it_was_given(traces: Path) -> None:
    t = _load(traces / "shapes")
    name = np.array(t.column("name").to_pylist(), dtype=object)
    mb, step = t.column("microbatch").to_numpy(), t.column("step").to_numpy()
    lens = t.column("seq_lens").to_pylist()
    steps = sorted(set(step.tolist()))
    assert len(steps) == len(LENGTHS), steps
    for phase in ("cpu-forward", "cpu-backward"):
        for s, want in zip(steps, LENGTHS, strict=True):
            rows = np.flatnonzero((name == phase) & (step == s) & (mb >= 0))
            got = {int(mb[i]): lens[i] for i in rows}
            assert got == {m: [n] * BATCH for m, n in enumerate(want)}, (phase, s, got)
    # ops that attend over nothing (the optimizer) carry none
    assert all(x is None for x, n in zip(lens, name, strict=True) if n == "cpu-optimizer")


@pytest.mark.timeout(240)
def test_a_trace_without_recorded_shapes_has_no_sequences(traces: Path) -> None:
    t = _load(traces / "no-shapes")
    assert t.column("seq_lens").null_count == t.num_rows
    assert (t.column("microbatch").to_numpy() >= 0).any()  # the passes are there, their sequences are not
