"""Typed settings of the collector: window, limits, chronic scores, hang detection, metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from laggard.analysis.config import AnalysisConfig
from laggard.monitor.cluster import LeaseConfig


@dataclass(kw_only=True, slots=True)
class MonitorConfig:
    # ... or after any newly completed step once no batch came for this long (a job that paused or
    # ended gets its last steps analyzed)
    idle_refresh_s: float = 2.0
    # steps per analysis window: 6 steps average out most per-op noise (a 1.10x worker shows as a
    # steady S_w excess of ~2-5%) while a new straggler fills half the window within 3 steps
    window_steps: int = 6
    # re-analyze a job after this many newly completed steps: windows overlap by half (a step is in
    # 2 windows); measured on 1.10x workers vs heavy-tailed noise (benchmarks/bench_monitor.py)
    refresh_every_steps: int = 3
    # weight of the newest window in a worker's chronic score (EWMA): 0.2 keeps ~5 windows of memory,
    # so a one-off stall fades within a window and a persistent lag dominates
    chronic_alpha: float = 0.2
    # largest ingest body: a tracer page of 8192 ops is ~0.5 MB in Arrow IPC; 32 MB leaves room for
    # `monitor push` batches and refuses anything that would pin the collector's memory
    max_body_bytes: int = 32 * 2**20
    # no rank of a job recording an op for this long (from the tracers' heartbeats), or one rank's
    # heartbeats stopping this long while others' go on, is "hang suspected" (batch-only jobs: a rank
    # silent this long while others advance). An op takes milliseconds to seconds; it must exceed the
    # longest legitimate stall between two ops (a checkpoint save), since the verdict may end the job
    # (abort_on_hang). 30 s leaves the verdict within 60 s of the stop (measured ~33-35 s)
    hang_after_s: float = 30.0
    # ... and the others must be at least this many steps ahead of it (jobs without heartbeats:
    # `monitor push`; a tracer's heartbeats show a stop directly, see monitor/hangs.py)
    hang_min_steps: int = 2
    # after asking a job's tracers for their hang reports, decide once all have come or after this
    # long (a tracer sees the request within its 2 s heartbeat and sends in well under a second; a
    # rank that has not answered in 10 s is counted as missing: dead, or unable to send)
    hang_collect_s: float = 10.0
    # largest hang report accepted: a 2,000-entry Flight Recorder buffer is ~1 MB of JSON, a
    # 20,000-entry one ~12 MB; the tracer trims its oldest entries to fit the same 16 MB
    max_report_bytes: int = 16 * 2**20
    # hang reports held per job while a verdict is collected (a rank's newer report replaces its older
    # one; the oldest is dropped first beyond either cap, and its rank counts as missing). The verdict
    # wants one report per rank: 4,096 keeps every rank of jobs up to that size
    hang_reports_per_job: int = 4096
    # ... and their bytes (as received): 256 MiB holds 256 ranks' 2,000-entry recorder dumps (~1 MB
    # each), or 16 of the largest accepted; several jobs may hang at once on one collector, and the
    # reports are released when the verdict is decided (within hang_collect_s of the request)
    hang_report_bytes_per_job: int = 256 * 2**20
    # per-job history kept for the trend plot
    trend_len: int = 1000
    # Prometheus: laggard_worker_slowdown is exported for the top-k workers of each job only
    # (bounded label cardinality on 1,000-worker jobs)
    metrics_top_k: int = 10
    # the dashboard's top-k list
    top_k: int = 8
    # at most this share of the collector's time goes to analyzing one job (after a refresh of t
    # seconds the next waits t * (1 - share) / share): the analysis runs in its own process, but on
    # a small host it still competes with ingest for the cores, and a 1,024-worker window takes seconds
    analysis_share: float = 0.5
    # analyze windows in a child process (the running service): a 1,024-worker window is seconds of
    # pure-Python replay that would otherwise hold the GIL against ingest; off, the analyzer thread
    # runs it in the collector's interpreter (in-process callers of Collector.refresh always do)
    analysis_process: bool = True
    # ... in this many child processes: jobs are analyzed side by side (a job's windows one at a time).
    # A 1,024-rank window takes ~1.0-1.3 s of one core every 3 steps (bench_monitor: building its
    # table from the bodies included), so at 1 step/s one child keeps ~2 such jobs fresh; 2 is what
    # a small collector host (2-4 cores) can give without starving ingest; raise it with the cores
    analysis_workers: int = 2
    # each analysis process keeps its jobs' last windows' bodies read (``monitor.analyzer``), up to
    # this many MiB (least recently analyzed job dropped first): the next window of such a job reads a
    # third of its bodies instead of all. A 1,024-rank job flushing every 3 steps holds ~32 MiB
    # (measured), so 256 keeps 8 such jobs a child; one flushing 30 steps a batch holds ~212 MiB; a job
    # over the budget alone has its bodies read afresh each time (as without the cache). 0 keeps none
    analysis_cache_mib: int = 256
    # the analysis child's niceness: 0 (the same CPU priority as ingest). The analysis share above
    # already bounds its CPU; a higher value trades refresh time for ingest on a busy host
    analysis_nice: int = 0
    # how often the background analyzer makes a full round: idle refreshes, analysis-share waits,
    # hang checks (a window is handed over as its batches arrive and kept as its analysis comes
    # back, between rounds: Collector._analyzer_loop)
    tick_s: float = 0.2
    # how each window is analyzed: the same settings as `laggard analyze` (warm-up detection is
    # per window: a window of a running job has no warm-up to skip once the job settled)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    # several collectors on one database: each job's lease (laggard.monitor.cluster)
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    # a job's requests passed to the collector that holds it (laggard.monitor.forward): at most this
    # many wait on holders at once, on a limit of their own; the server's shared one (40 threads)
    # serves the health check, the job list and every other endpoint that reads the store, and a
    # holder that stops answering must not take those. A request past the limit waits its turn,
    # holding no thread
    forward_max_waiting: int = 16
    # ... each waits this long for the holder's answer: a holder answers from what it holds in memory
    # (a step's timeline is the slowest, well under a second); one slower than this is stuck or gone,
    # and its lease moves within lease_s
    forward_timeout_s: float = 10.0
    # ... and a holder that did not answer is not asked again for this long: its jobs' requests are
    # answered here meanwhile, not each after its own timeout; a lease round (renew_s) says by then
    # whether it lives
    forward_retry_s: float = 5.0

    def __post_init__(self) -> None:
        from laggard.errors import LaggardError

        for k in ("window_steps", "refresh_every_steps", "hang_min_steps", "trend_len", "metrics_top_k", "top_k",
                  "max_body_bytes", "max_report_bytes", "hang_reports_per_job", "hang_report_bytes_per_job",
                  "analysis_workers", "forward_max_waiting"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LaggardError(f"monitor config: {k} must be a positive integer, got {v!r}")
        if not isinstance(self.analysis_cache_mib, int) or isinstance(self.analysis_cache_mib, bool) \
                or self.analysis_cache_mib < 0:
            raise LaggardError("monitor config: analysis_cache_mib must be a non-negative integer, "
                               f"got {self.analysis_cache_mib!r}")
        if not 0.0 < self.chronic_alpha <= 1.0:
            raise LaggardError(f"monitor config: chronic_alpha must be in (0, 1], got {self.chronic_alpha!r}")
        if not 0.0 < self.analysis_share <= 1.0:
            raise LaggardError(f"monitor config: analysis_share must be in (0, 1], got {self.analysis_share!r}")
        if self.hang_report_bytes_per_job < self.max_report_bytes:
            raise LaggardError("monitor config: hang_report_bytes_per_job must be at least max_report_bytes "
                               f"({self.max_report_bytes}), got {self.hang_report_bytes_per_job}")
        if self.hang_after_s <= 0 or self.tick_s <= 0 or self.hang_collect_s <= 0:
            raise LaggardError("monitor config: hang_after_s, hang_collect_s and tick_s must be positive")
        if not self.forward_timeout_s > 0 or not self.forward_retry_s >= 0:
            raise LaggardError("monitor config: forward_timeout_s must be positive and forward_retry_s not negative, "
                               f"got {self.forward_timeout_s!r} and {self.forward_retry_s!r}")
