"""``--peer``: a slow worker made as fast as its stage peers were, op by op and step by step.

The job is DDP's shape as zero-code capture records it: per step a forward, the backward up to the
gradients' all-reduce, the all-reduce, and the short rest of the backward after it, both parts under
the one op type ``backward-compute``. Rank 1 runs 1.5x in steps 2 and 3 only. The truth is written
out by hand: with rank 1 at its peers' times every step is a healthy one (10 + 20 + 2 + 0.5 ms).
"""

from __future__ import annotations

import numpy as np

from laggard.engine.baseline import prepare
from laggard.engine.gaps import GapConfig
from laggard.optable.ops import Job, JobMeta, make_table
from laggard.whatif.custom import Change, apply_changes

MS = 1_000_000
FWD, BWD, TAIL, AR = 10.0, 20.0, 0.5, 2.0  # ms
SLOW_STEPS, FACTOR = (2, 3), 1.5


def _job() -> Job:
    rows = []
    t0 = 0.0
    for step in range(4):
        arrive = {r: (FWD + BWD) * (FACTOR if r == 1 and step in SLOW_STEPS else 1.0) for r in range(4)}
        last = max(arrive.values())
        for rank in range(4):
            f = FACTOR if rank == 1 and step in SLOW_STEPS else 1.0
            ops = [("forward-compute", "compute", 0.0, FWD * f), ("backward-compute", "compute", FWD * f, BWD * f),
                   ("grads-all-reduce", "collective", arrive[rank], last + AR - arrive[rank]),
                   ("backward-compute", "compute", last + AR, TAIL * f)]
            for name, kind, start, dur in ops:
                rows.append(dict(rank=rank, dp_rank=rank, pp_rank=0, step=step, name=name, kind=kind,
                                 group="world" if kind == "collective" else None, seq=0 if kind == "collective" else -1,
                                 peer=-1, start_ns=int((t0 + start) * MS), dur_ns=int(dur * MS)))
        t0 += last + AR + TAIL * FACTOR + 1.0
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    return Job(table=make_table(cols), meta=JobMeta(dp_size=4, pp_size=1))


def _step_ms(base, w: np.ndarray) -> np.ndarray:
    from laggard.engine.replay import replay_steps

    return 1e3 * replay_steps(base.graph, w[:, None])[:, 0]


def test_peer_gives_each_op_its_peers_time_in_that_step() -> None:
    base = prepare(_job(), GapConfig(enabled=False))
    measured = _step_ms(base, base.measured)
    healthy = FWD + BWD + AR + TAIL
    assert np.allclose(measured[[0, 1]], healthy, atol=0.01)
    assert np.allclose(measured[[2, 3]], (FWD + BWD + TAIL) * FACTOR + AR, atol=0.01)
    w, _ = apply_changes(base, [Change(action="peer", selector="rank=1,kind=compute")])
    # every step a healthy one: the slow steps sped up, the good ones untouched (a pooled op-type mean
    # would give the short tail the long backward's time, and slow every step down)
    assert np.allclose(_step_ms(base, w), healthy, atol=0.01), _step_ms(base, w)
    assert np.allclose(w[base.rank != 1], base.measured[base.rank != 1])
