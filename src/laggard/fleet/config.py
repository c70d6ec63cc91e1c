"""Thresholds and knobs of a fleet run (one typed place; each value says why it is what it is)."""

from __future__ import annotations

from dataclasses import dataclass, field

from laggard.analysis.config import AnalysisConfig
from laggard.errors import LaggardError
from laggard.io.cache import JobCacheConfig


@dataclass(kw_only=True, slots=True)
class FleetConfig:
    # how each job is analyzed: the same settings as `laggard analyze` (a fleet row is that command's result)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    # where each job's loaded op table is cached (laggard.io.cache), so a fleet run again over mostly the
    # same jobs reads only the new ones' traces; None (the library's default): no cache. `laggard fleet`
    # passes the CLI's (off with `laggard --no-cache fleet`). Jobs fetched from URLs are fresh copies: never cached
    job_cache: JobCacheConfig | None = None
    # the fleet study's headline: a job straggles when its slowdown is at least 10%
    straggling_slowdown: float = 1.1
    # fewer steps than this and the ideal durations (means/medians over the trace) and the per-step
    # slowdown rest on too little data to compare jobs: the job is a row marked 'rejected'
    min_steps: int = 3
    # replay fidelity = wall-clock / replayed step time. Below this the replay (measured durations on
    # the dependency graph) takes >10% longer than what was traced: the graph does not fit the trace
    # (clock skew, missing dependencies), so its what-ifs cannot be trusted
    min_fidelity: float = 0.9
    # above this more than half of each step is time no traced op accounts for (untraced CPU gaps,
    # data loading): the trace misses most of the work. Launch delays of a few ms per op stay below
    max_fidelity: float = 2.0
    # small jobs are analyzed in batches that take at least this long, so that the per-task cost
    # of the engine (pickling, IPC, Ray scheduling: ~1-10 ms) stays a small share of the work
    batch_target_s: float = 0.1
    # a batch never holds more jobs than this (the first results arrive early; one slow batch
    # does not hold back many rows)
    max_batch_jobs: int = 64
    # batches in flight per worker: enough to keep every worker busy while results travel back,
    # few enough that memory does not grow with the number of jobs
    inflight_per_worker: int = 2
    # the per-host view (laggard.fleet.hosts): findings of these causes name a machine's ranks
    # (a slow GPU or node, a slow link's end, its host's untraced time, the fallback's narrowest
    # carrier); a heavy stage or long sequences are the model's and the data's, not the host's
    host_causes: tuple[str, ...] = ("worker", "data-loading", "comm", "launch-delay", "unexplained")
    # a host is chronic when findings named it in at least 3 jobs (two could be chance: a busy
    # neighbour twice) and in at least a quarter of the jobs it ran in (a host in 200 jobs named
    # in 3 is noise, not a lemon)
    chronic_min_jobs: int = 3
    chronic_share: float = 0.25

    def __post_init__(self) -> None:
        if not isinstance(self.analysis, AnalysisConfig):
            raise LaggardError(f"FleetConfig.analysis must be an AnalysisConfig, got {type(self.analysis).__name__}")
        if self.min_steps < 1:
            raise LaggardError(f"min_steps must be >= 1 (got {self.min_steps})")
        if not 0 < self.min_fidelity <= 1 <= self.max_fidelity:
            raise LaggardError("replay fidelity bounds must satisfy 0 < min_fidelity <= 1 <= max_fidelity")
        if self.chronic_min_jobs < 1 or not 0.0 <= self.chronic_share <= 1.0:
            raise LaggardError("chronic_min_jobs >= 1 and 0 <= chronic_share <= 1 are required")
        if self.batch_target_s < 0 or self.max_batch_jobs < 1 or self.inflight_per_worker < 1:
            raise LaggardError("batch_target_s >= 0, max_batch_jobs >= 1 and inflight_per_worker >= 1 are required")
