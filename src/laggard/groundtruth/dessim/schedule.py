"""The order in which one pipeline stage runs its microbatches (1F1B, interleaved with vpp > 1).

Written for the simulator from the published schedule rules (PipeDream-flush 1F1B; Megatron's
interleaved variant: microbatches visit the model chunks in groups of ``num_stages``).
"""

from __future__ import annotations

from typing import NamedTuple


class Item(NamedTuple):
    forward: bool
    microbatch: int
    chunk: int


def stage_order(stage: int, num_stages: int, num_microbatches: int, num_chunks: int = 1) -> list[Item]:
    """Forward/backward items of one stage for one step, in execution order."""
    total = num_microbatches * num_chunks
    if num_chunks == 1:
        warm = min(num_stages - 1 - stage, total)
    else:
        warm = min(2 * (num_stages - 1 - stage) + (num_chunks - 1) * num_stages, total)

    def item(k: int, forward: bool) -> Item:
        per_round = num_stages * num_chunks
        rnd, pos = divmod(k, per_round)
        chunk = pos // num_stages
        mb = rnd * num_stages + pos % num_stages
        return Item(forward, mb, chunk if forward else num_chunks - 1 - chunk)

    out = [item(k, True) for k in range(warm)]
    for k in range(total - warm):
        out.append(item(warm + k, True))
        out.append(item(k, False))
    out.extend(item(k, False) for k in range(total - warm, total))
    return out
