"""Mitigations for stragglers, usable from any PyTorch training loop in a few lines.

* ``PlannedGC`` (``gc``): garbage collection on all ranks at the same step, fixed or adaptive.
* ``balance`` / ``imbalance`` / ``WLBPacker`` (``balance``) with ``CostModel`` / ``fit_cost``
  (``cost``): documents into DP ranks x microbatches of equal cost, under a token cap.
* ``cp_shard`` (``cp``): per-document or per-sequence context-parallel sharding, chosen per batch.
* ``partition_stages`` / ``split_stages`` (``partition``): the exact min-max contiguous pipeline split.
* ``Controller`` / ``ActConfig`` (``controller``): runtime actions in the training process: samples
  shifted away from a slow DP rank (and back), planned GC and balanced packing on the collector's
  findings, drain requests; opt-in, logged, rate-limited, behind a kill switch.
* ``BalancedBatchSampler``, ``pack_collate``, ``exchange_sequences`` (``data``): DataLoader and
  torch.distributed helpers.

This package imports numpy only (torch inside the functions that talk between ranks, never the
analysis stack), so a training loop can use it without loading pyarrow or the replay engine.
"""

from __future__ import annotations

from laggard.mitigate.balance import Plan, WLBPacker, balance, imbalance
from laggard.mitigate.controller import ActConfig, Controller, split_samples
from laggard.mitigate.cost import CostFit, CostModel, fit_cost
from laggard.mitigate.cp import AttentionCostModel, CPShard, cp_shard
from laggard.mitigate.gc import PlannedGC
from laggard.mitigate.partition import StageSplit, megatron_layout, partition_stages, split_stages
from laggard.util.lazy import lazy_exports

__all__ = [
    "ActConfig", "AttentionCostModel", "BalancedBatchSampler", "Controller", "CPShard", "CostFit", "CostModel", "Plan",
    "PlannedGC",
    "StageSplit", "WLBPacker", "balance", "cp_shard", "exchange_sequences", "fit_cost", "imbalance",
    "megatron_layout", "pack_collate", "partition_stages", "split_samples", "split_stages",
]


# torch.distributed helpers, loaded on first use (they import torch)
__getattr__, __dir__, _ = lazy_exports(__name__, dict.fromkeys(
    ("BalancedBatchSampler", "exchange_sequences", "pack_collate", "Exchange"), "laggard.mitigate.data"))
