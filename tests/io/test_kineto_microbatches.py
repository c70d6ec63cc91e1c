"""A CPU rank's forward and backward passes in a profiler trace (``laggard.io.kineto.segments``):
every CPU rank is cut where the phase changes, and its k-th forward and k-th backward of a step are
microbatch k, so the detectors that read microbatches (sequence imbalance, per-microbatch worker
speed) see them as they do in the Tracer's traces.

The real case: a 2-rank DDP job (gloo, torch.profiler, ``tests/kineto_ddp.py``) with gradient
accumulation over 4 microbatches whose rows are drawn uneven (lognormal sigma 0.8, per rank and
microbatch: what documents of uneven length do). The last microbatch's backward is cut by DDP's
gradient all-reduces; its pieces are one pass. Before, each step was one segment holding all eight
passes, and no microbatch was found: the test fails on that importer. The structure is checked on
the committed run and on one made here; the diagnosis on the committed run only.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from laggard.analysis.pipeline import analyze
from laggard.errors import LaggardWarning
from laggard.io import load_job
from tests.kineto_ddp import make_traces_in_subprocess

MICROBATCHES = 4
COMMITTED = Path(__file__).parents[1] / "data" / "kineto" / "ddp_uneven_microbatches"  # README there


@pytest.fixture(scope="module")
def uneven_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_traces_in_subprocess(tmp_path_factory.mktemp("ddp-uneven"), world=2, slow_rank=0, steps=8,
                                     extra_matmuls=0, microbatches=MICROBATCHES, rows_sigma=0.8)


def _load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        return load_job(path)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("which", ["committed", "fresh"])
def test_each_step_has_its_microbatches_forward_and_backward(which: str, request: pytest.FixtureRequest) -> None:
    t = _load(COMMITTED if which == "committed" else request.getfixturevalue("uneven_dir")).table
    name = np.array(t.column("name").to_pylist(), dtype=object)
    mb = t.column("microbatch").to_numpy()
    rank, step = t.column("rank").to_numpy(), t.column("step").to_numpy()
    assert {"cpu-forward", "cpu-backward"} <= set(name), sorted(set(name))
    for phase in ("cpu-forward", "cpu-backward"):
        on = (name == phase) & (mb >= 0)
        cells = {(int(r), int(s)) for r, s in zip(rank[on], step[on], strict=True)}
        assert len(cells) == 2 * len(np.unique(step)), phase  # every rank and step
        for r, s in cells:
            got = sorted(mb[on & (rank == r) & (step == s)].tolist())
            # the last backward's pieces (cut by the all-reduces) share its microbatch
            assert sorted(set(got)) == list(range(MICROBATCHES)), (phase, r, s, got)


@pytest.mark.timeout(60)
def test_uneven_microbatches_are_named_sequence_imbalance() -> None:
    """On the committed run (a quiet machine): the times of a run made during the test depend on what
    else the machine runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = analyze(_load(COMMITTED))
    causes = [f.cause for f in res.diagnosis.findings]
    assert "sequence-imbalance" in causes, res.diagnosis.findings
    assert not any(f.cause in ("gc", "worker") for f in res.diagnosis.findings), res.diagnosis.findings
