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

from laggard.engine.sorting import lex_order


def nth_in_group(*keys: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per op, how many ops with the same ``keys`` (integer arrays) started before it: 0 for the first
    (ties in row order). With (rank, step, op type): the same op on another rank, as its place."""
    o = lex_order(*keys, start)
    new = np.zeros(len(o), dtype=bool)
    new[:1] = True
    for k in keys:
        ko = k[o]
        new[1:] |= ko[1:] != ko[:-1]
    idx = np.arange(len(o))
    nth = np.empty(len(o), dtype=np.int64)
    nth[o] = idx - np.maximum.accumulate(np.where(new, idx, 0))
    return nth


def same_op_codes(name_code: np.ndarray, rank: np.ndarray, step: np.ndarray, microbatch: np.ndarray,
                  vchunk: np.ndarray, start_ns: np.ndarray) -> tuple[np.ndarray, int]:
    """(per op, a code shared by the same op on every worker and step; the number of codes)."""
    if len(name_code) == 0:
        return np.zeros(0, dtype=np.int64), 0
    name_code = name_code.astype(np.int64)
    nth = nth_in_group(name_code, rank, step, microbatch, vchunk, start=start_ns)
    # a type runs its most spans in every (rank, step, microbatch, chunk) where as many of its ops
    # are its last span as are its first: fewer spans to a group cannot leave the counts alike
    num_names = int(name_code.max()) + 1
    last = np.zeros(num_names, dtype=np.int64)
    np.maximum.at(last, name_code, nth)
    groups = np.bincount(name_code[nth == 0], minlength=num_names)
    full = np.bincount(name_code[nth == last[name_code]], minlength=num_names)
    nth = np.where(((last > 0) & (full == groups))[name_code], nth, 0)
    codes, inverse = np.unique(name_code * (int(nth.max()) + 1) + nth, return_inverse=True)
    return inverse.astype(np.int64).ravel(), len(codes)
