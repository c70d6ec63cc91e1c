"""Balanced batches in a PyTorch training loop: a DataLoader batch sampler, a packing collate, and an
exchange of sequences between data-parallel ranks.

* ``BalancedBatchSampler``: give it to ``DataLoader(dataset, batch_sampler=...)``; it cuts each epoch
  into global batches, balances every global batch into DP ranks x microbatches (``balance``) and
  yields this rank's microbatches as lists of dataset indices. All ranks compute the same plan
  (same lengths, seed and epoch), so nothing is communicated. With ``method="wlb"`` outliers move to
  a later global batch of the same epoch; the last batch of an epoch takes whatever still waits.
* ``pack_collate``: concatenates a microbatch's token sequences into one packed row with
  ``cu_seqlens`` and per-document ``position_ids`` (the inputs of variable-length attention).
* ``exchange_sequences``: when every rank already holds its own sequences (its data shard), gathers
  the lengths, computes one balanced plan for the whole DP group and moves every sequence to the
  rank whose microbatch it joins with one ``all_to_all_single``.

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.mitigate._errors import check_positive_int, error, warn
from laggard.mitigate.balance import METHODS, Plan, WLBPacker, balance
from laggard.mitigate.cost import Cost, CostModel


class BalancedBatchSampler:
    """Yields this rank's ``num_microbatches`` microbatches (lists of dataset indices) per global batch."""

    def __init__(self, lengths: Sequence[int] | np.ndarray, *, global_batch_size: int, num_microbatches: int,
                 num_replicas: int = 1, rank: int = 0, method: str = "wlb", cost: CostModel | Cost | None = None,
                 max_tokens: int | None = None, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 max_wait_batches: int = 4) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1:
            raise error("BalancedBatchSampler: lengths must be a flat sequence of integers")
        self.global_batch_size = check_positive_int(global_batch_size, "global_batch_size")
        self.num_microbatches = check_positive_int(num_microbatches, "num_microbatches")
        self.num_replicas = check_positive_int(num_replicas, "num_replicas")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise error(f"rank must be in 0..{num_replicas - 1}, got {rank!r}")
        if method not in METHODS:
            raise error(f"method {method!r} not known (choose from {', '.join(METHODS)})")
        self.rank = rank
        self.method = method
        self.cost = cost
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.max_wait_batches = max_wait_batches
        self.epoch = 0
        self.plans: list[Plan] = []  # the plans of the last epoch iterated (for reports)

    @property
    def num_bins(self) -> int:
        return self.num_replicas * self.num_microbatches

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def num_global_batches(self) -> int:
        n = len(self.lengths)
        return n // self.global_batch_size if self.drop_last else math.ceil(n / self.global_batch_size)

    def __len__(self) -> int:
        return self.num_global_batches() * self.num_microbatches

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.lengths))
        return np.random.default_rng((self.seed, self.epoch)).permutation(len(self.lengths))

    def plans_for_epoch(self) -> Iterator[Plan]:
        """The plan of every global batch of the current epoch (ids are dataset indices)."""
        order = self._order()
        num = self.num_global_batches()
        packer = (WLBPacker(self.num_bins, cost=self.cost, max_tokens=self.max_tokens,
                            max_wait_batches=self.max_wait_batches) if self.method == "wlb" else None)
        for b in range(num):
            idx = order[b * self.global_batch_size : (b + 1) * self.global_batch_size]
            if packer is None:
                plan = balance(self.lengths[idx], self.num_bins, method=self.method, cost=self.cost,
                               max_tokens=self.max_tokens)
                plan.bins = [idx[np.asarray(bn, dtype=np.int64)].tolist() for bn in plan.bins]
                yield plan
                continue
            plan = packer.pack(self.lengths[idx], ids=idx, force_all=b == num - 1)
            yield plan
        if packer is not None and packer.pending:
            warn(f"BalancedBatchSampler: {len(packer.pending)} sequence(s) did not fit under max_tokens in the "
                 "last batch of the epoch and were dropped from it")

    def __iter__(self) -> Iterator[list[int]]:
        self.plans = []
        lo = self.rank * self.num_microbatches
        for plan in self.plans_for_epoch():
            self.plans.append(plan)
            yield from plan.bins[lo : lo + self.num_microbatches]


def pack_collate(samples: Sequence[Any], *, key: str = "input_ids") -> dict[str, Any]:
    """Concatenate sequences (1-D tensors, or dicts holding one under ``key``) into one packed row.

    Returns ``input_ids`` (1, total), ``position_ids`` (1, total; restarting at every document),
    ``cu_seqlens`` (int32, num_docs + 1), ``max_seqlen`` and ``seq_lens``. An empty microbatch gives
    empty tensors.
    """
    import torch

    seqs = [s[key] if isinstance(s, dict) else s for s in samples]
    seqs = [torch.as_tensor(s) for s in seqs]
    lens = [int(s.shape[0]) for s in seqs]
    lens_t = torch.tensor(lens, dtype=torch.int64)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    if lens:
        cu[1:] = torch.cumsum(lens_t, 0).to(torch.int32)
    total = int(cu[-1])
    ids = torch.cat(seqs).unsqueeze(0) if seqs else torch.zeros((1, 0), dtype=torch.int64)
    starts = torch.repeat_interleave(cu[:-1].to(torch.int64), lens_t) if lens else torch.zeros(0, dtype=torch.int64)
    pos = (torch.arange(total, dtype=torch.int64) - starts).unsqueeze(0)
    return {"input_ids": ids, "position_ids": pos, "cu_seqlens": cu, "max_seqlen": max(lens, default=0),
            "seq_lens": lens}


@dataclass(kw_only=True, slots=True)
class Exchange:
    """This rank's share after ``exchange_sequences``."""

    microbatches: list[list[Any]]  # num_microbatches lists of sequences (tensors)
    ids: list[list[tuple[int, int]]]  # (source rank, index on the source) of every sequence received
    deferred: list[Any]  # this rank's own sequences held back (WLB outliers): pass them in next time
    deferred_ids: list[int]  # their indices in this call's ``local``
    plan: Plan = field(repr=False)  # the global plan (ids: position in rank-major order of all sequences)


def _device(dist: Any, group: Any) -> Any:
    import torch

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def exchange_sequences(local: Sequence[Any], num_microbatches: int, *, method: str = "wlb",
                       cost: CostModel | Cost | None = None, max_tokens: int | None = None,
                       group: Any = None) -> Exchange:
    """Balance the sequences held by all ranks of ``group`` into ranks x ``num_microbatches`` bins and
    move each sequence to its bin's rank (one all-gather of lengths, one ``all_to_all_single``).

    Sequences are tensors whose first dimension is the length; dtype and trailing shape must be the
    same on every rank. Every rank computes the same plan, so only the data moves.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise error("exchange_sequences: torch.distributed is not initialised")
    m = check_positive_int(num_microbatches, "num_microbatches")
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    seqs = [torch.as_tensor(s) for s in local]
    local_kinds = {(tuple(s.shape[1:]), str(s.dtype)) if s.dim() else ((), "scalar") for s in seqs}
    device = _device(dist, group)
    # one small metadata exchange: every rank's lengths, and the dtype and trailing shape of its sequences
    # (checked after the exchange, so that every rank raises the same error instead of some hanging)
    meta: list[Any] = [None] * world
    mine = ([int(s.shape[0]) if s.dim() else 0 for s in seqs], sorted(local_kinds))
    dist.all_gather_object(meta, mine, group=group)
    all_lens = [np.asarray(x[0], dtype=np.int64) for x in meta]
    kinds = {k for x in meta for k in x[1]}
    if len(kinds) > 1 or ((), "scalar") in kinds:
        raise error(f"exchange_sequences: ranks hold sequences of different dtype or shape: {sorted(kinds)}")
    if not kinds:
        return Exchange(microbatches=[[] for _ in range(m)], ids=[[] for _ in range(m)], deferred=[], deferred_ids=[],
                        plan=balance([], world * m, method=method, cost=cost, max_tokens=max_tokens))
    tail, dtype_name = kinds.pop()
    dtype = getattr(torch, dtype_name.removeprefix("torch."))
    per_token = int(np.prod(tail)) if tail else 1
    owner = np.concatenate([np.full(len(x), r, dtype=np.int64) for r, x in enumerate(all_lens)])
    local_idx = np.concatenate([np.arange(len(x), dtype=np.int64) for x in all_lens])
    lengths = np.concatenate(all_lens)
    plan = balance(lengths, world * m, method=method, cost=cost, max_tokens=max_tokens)
    dest = np.full(len(lengths), -1, dtype=np.int64)
    for b, ids in enumerate(plan.bins):
        dest[np.asarray(ids, dtype=np.int64)] = b // m
    gid = np.arange(len(lengths))
    # what I send, to each destination in global-id order; what I receive, from each source likewise
    send_ids = [gid[(owner == rank) & (dest == r)] for r in range(world)]
    recv_ids = [gid[(owner == r) & (dest == rank)] for r in range(world)]
    send_sizes = [int(lengths[s].sum()) * per_token for s in send_ids]
    recv_sizes = [int(lengths[s].sum()) * per_token for s in recv_ids]
    flat = [seqs[int(local_idx[g])].reshape(-1).to(device) for s in send_ids for g in s]
    send = torch.cat(flat) if flat else torch.zeros(0, dtype=dtype, device=device)
    recv = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=group)
    got: dict[int, Any] = {}
    pos = 0
    for ids in recv_ids:
        for g in ids.tolist():
            n = int(lengths[g]) * per_token
            got[g] = recv[pos : pos + n].reshape((int(lengths[g]), *tail))
            pos += n
    mbs = [[got[g] for g in plan.bins[rank * m + j]] for j in range(m)]
    src = [[(int(owner[g]), int(local_idx[g])) for g in plan.bins[rank * m + j]] for j in range(m)]
    mine_deferred = [g for g in plan.deferred if owner[g] == rank]
    return Exchange(microbatches=mbs, ids=src, deferred=[seqs[int(local_idx[g])] for g in mine_deferred],
                    deferred_ids=[int(local_idx[g]) for g in mine_deferred], plan=plan)


__all__ = ["BalancedBatchSampler", "Exchange", "exchange_sequences", "pack_collate"]
