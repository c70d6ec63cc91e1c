"""A partial trace: the ranks the job has that the trace lacks, recorded where the readers find them
and shown where the report leads (the headline and the JSON's ``meta``)."""

from __future__ import annotations

from laggard.optable.ops import JobMeta

MISSING_KEY = "missing_ranks"  # JobMeta.extra: {"ranks": [...], "of": N}, the ranks a partial trace lacks


def note_missing(meta: JobMeta, ranks: list[int], of: int | None = None) -> None:
    """Record in ``meta`` the ranks the job has but the trace lacks (the report's headline says so:
    the analysis covers the others only); nothing when none is."""
    if ranks:
        meta.extra[MISSING_KEY] = {"ranks": sorted(int(r) for r in ranks), "of": int(of or meta.world_size or 0)}


__all__ = ["MISSING_KEY", "note_missing"]
