"""The Monte-Carlo engine: trials split into memory-bounded chunks, run on a thread pool.

A *kernel* draws and reduces one chunk: ``kernel(rng, num_trials) -> dict[name, array]`` where each
array has ``num_trials`` rows (one per trial). The engine sizes chunks so one chunk holds about
``chunk_elems`` float64 values per array, gives chunk i its own generator spawned from the seed
(so results depend only on the seed and the chunk size, never on the thread count or on
scheduling), runs the chunks on ``threads`` threads (numpy releases the GIL in the samplers and
reductions) and concatenates the per-trial outputs in chunk order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# 4 MiB per float64 array: a chunk's few temporaries per thread stay close to the CPU caches
# (measured ~10% faster than 16 MiB chunks) and far below RAM, while each chunk is still big
# enough (hundreds of thousands of values) to amortise the Python around it.
DEFAULT_CHUNK_ELEMS = 1 << 19

Kernel = Callable[[np.random.Generator, int], dict[str, np.ndarray]]


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def chunk_sizes(num_trials: int, elems_per_trial: int, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> list[int]:
    """Trials per chunk: as many as fit in ``chunk_elems`` values (at least one trial per chunk)."""
    per_chunk = max(1, min(num_trials, chunk_elems // max(1, elems_per_trial)))
    num_full, rest = divmod(num_trials, per_chunk)
    return [per_chunk] * num_full + ([rest] if rest else [])


def seed_sequence(seed: int | np.random.SeedSequence, *key: int) -> np.random.SeedSequence:
    """A SeedSequence for ``seed``, specialised by an optional integer key (e.g. a worker count)."""
    if isinstance(seed, np.random.SeedSequence):
        base = seed
        if not key:
            return base
        return np.random.SeedSequence(base.entropy, spawn_key=(*base.spawn_key, *key))
    return np.random.SeedSequence(int(seed), spawn_key=tuple(key))


def run_chunked(
    kernel: Kernel,
    num_trials: int,
    elems_per_trial: int,
    seed: int | np.random.SeedSequence,
    *,
    threads: int | None = None,
    chunk_elems: int | None = None,
) -> dict[str, np.ndarray]:
    """Run ``kernel`` over ``num_trials`` trials in chunks; concatenated per-trial outputs."""
    if num_trials < 1:
        raise ValueError("num_trials must be >= 1")
    sizes = chunk_sizes(num_trials, elems_per_trial, chunk_elems or DEFAULT_CHUNK_ELEMS)
    children = seed_sequence(seed).spawn(len(sizes))

    def one(i: int) -> dict[str, np.ndarray]:
        rng = np.random.Generator(np.random.PCG64(children[i]))
        out = kernel(rng, sizes[i])
        return {k: np.asarray(v) for k, v in out.items()}

    num_threads = min(threads or default_threads(), len(sizes))
    if num_threads <= 1:
        parts = [one(i) for i in range(len(sizes))]
    else:
        with ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="laggard-sim") as pool:
            parts = list(pool.map(one, range(len(sizes))))
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts], axis=0) for k in parts[0]}
