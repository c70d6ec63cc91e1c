"""Which ops are "the same op" on every worker and step: the pools an op's ideal duration is taken over.

The published method pools an op type over all workers, steps and microbatches, where each type is one
computation (a microbatch's forward, one collective). A capture that splits a phase at the collectives
inside it records one op type as several spans of a step, different computations: DDP's backward
before its gradients' all-reduce and the short rest after it, a tensor-parallel forward cut at each
activation all-reduce. Pooled, every span's ideal is their mean: the long span's ideal falls short of
its own healthy time and the short one's far over it, so a rank measured among ideal peers reaches the
collective late and its peers leave it late, and the what-ifs read a slowdown no op has.

The same op is then the type's k-th span in its rank's step (and microbatch and virtual chunk): where
every (rank, step, microbatch, chunk) runs the same number of spans of a type, its k-th spans form one
pool. Where the counts differ (a stage with more layers, a step with an extra collective), the k-th span
is not one computation everywhere and the type stays one pool. Where each type runs once per microbatch,
as in traces that record one op per computation, nothing changes.
"""

from __future__ import annotations

import numpy as np


def same_op_codes(name_code: np.ndarray, rank: np.ndarray, step: np.ndarray, microbatch: np.ndarray,
                  vchunk: np.ndarray, start_ns: np.ndarray) -> tuple[np.ndarray, int]:
    """(per op, a code shared by the same op on every worker and step; the number of codes)."""
    n = len(name_code)
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0
    order = np.lexsort((start_ns, vchunk, microbatch, step, rank, name_code))
    key = np.stack([name_code[order], rank[order], step[order], microbatch[order], vchunk[order]])
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (key[:, 1:] != key[:, :-1]).any(axis=0)
    idx = np.arange(n)
    first = np.maximum.accumulate(np.where(new_run, idx, 0))
    nth_sorted = idx - first
    # spans per (type, rank, step, microbatch, chunk), and whether a type's count is one everywhere
    run_id = np.cumsum(new_run) - 1
    run_len = np.bincount(run_id)
    run_name = key[0][new_run]
    num_names = int(name_code.max()) + 1
    lo = np.full(num_names, np.iinfo(np.int64).max)
    hi = np.zeros(num_names, dtype=np.int64)
    np.minimum.at(lo, run_name, run_len)
    np.maximum.at(hi, run_name, run_len)
    split = (lo == hi) & (hi > 1)
    nth = np.empty(n, dtype=np.int64)
    nth[order] = nth_sorted
    nth = np.where(split[name_code], nth, 0)
    pair = name_code.astype(np.int64) * (int(nth.max()) + 1) + nth
    codes, inverse = np.unique(pair, return_inverse=True)
    return inverse.astype(np.int64).ravel(), len(codes)
