"""DataLoader helpers: the balanced batch sampler and the packing collate; the package stays light."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from laggard.errors import LaggardError
from laggard.mitigate import BalancedBatchSampler, imbalance, pack_collate

pytestmark = pytest.mark.timeout(120)


def _lengths(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return np.minimum((rng.pareto(1.2, n) * 200).astype(np.int64) + 1, 8192)


@pytest.mark.parametrize("method", ["wlb", "kk", "greedy"])
def test_sampler_every_index_once_per_epoch_across_ranks(method):
    lengths = _lengths()
    num_replicas, num_mb = 4, 2
    per_rank = []
    for r in range(num_replicas):
        s = BalancedBatchSampler(lengths, global_batch_size=96, num_microbatches=num_mb, num_replicas=num_replicas,
                                 rank=r, method=method, max_tokens=16384, seed=3)
        mbs = list(s)
        assert len(mbs) == len(s)
        per_rank.append(mbs)
        for mb in mbs:
            assert lengths[mb].sum() <= 16384
    seen = sorted(i for mbs in per_rank for mb in mbs for i in mb)
    assert seen == list(range(len(lengths)))
    # ranks agree on the plan without talking: their microbatch costs are balanced together
    costs = [float((lengths[mb].astype(float) ** 2).sum()) for mbs in per_rank for mb in mbs[:num_mb]]
    assert len(costs) == num_replicas * num_mb
    if method == "wlb":  # kk and greedy cannot help a batch with one huge document
        assert imbalance(costs) < 1.05


def test_sampler_epochs_differ_and_drop_last():
    lengths = _lengths(100)
    s = BalancedBatchSampler(lengths, global_batch_size=30, num_microbatches=3, drop_last=True, method="kk")
    assert len(s) == 9
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 != e1 and len(e0) == 9
    assert len(s.plans) == 3
    with pytest.raises(LaggardError, match="rank"):
        BalancedBatchSampler(lengths, global_batch_size=30, num_microbatches=3, num_replicas=2, rank=2)


def test_dataloader_with_pack_collate():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    lengths = _lengths(64, seed=1) % 50 + 1
    data = [torch.arange(int(n), dtype=torch.int64) + 1000 * i for i, n in enumerate(lengths)]
    sampler = BalancedBatchSampler(lengths, global_batch_size=32, num_microbatches=4, method="wlb")
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=pack_collate)
    total = 0
    for batch in loader:
        ids, pos, cu = batch["input_ids"], batch["position_ids"], batch["cu_seqlens"]
        assert ids.shape == pos.shape and ids.shape[0] == 1
        assert cu.dtype == torch.int32 and int(cu[-1]) == ids.shape[1]
        assert batch["seq_lens"] == torch.diff(cu).tolist()
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            assert pos[0, a:b].tolist() == list(range(b - a))
            assert int(ids[0, a]) % 1000 == 0  # each document starts at its first token
        total += ids.shape[1]
    assert total == int(lengths.sum())
    empty = pack_collate([])
    assert empty["input_ids"].shape == (1, 0) and empty["cu_seqlens"].tolist() == [0]
    d = pack_collate([{"input_ids": torch.tensor([5, 6])}])
    assert d["input_ids"].tolist() == [[5, 6]]


def test_mitigate_imports_neither_torch_nor_the_analysis_stack():
    code = ("import sys, laggard.mitigate as m; m.balance([3, 2, 1], 2); m.partition_stages([1, 2, 3], 2); "
            "m.cp_shard([5, 6], 2); m.PlannedGC(interval_steps=2).start().step(); "
            "bad = [k for k in sys.modules if k.split('.')[0] in ('torch', 'pyarrow') or k in "
            "('laggard.whatif.core', 'laggard.engine.graph', 'laggard.engine.replay', 'laggard.io', "
            "'laggard.optable.ops')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
