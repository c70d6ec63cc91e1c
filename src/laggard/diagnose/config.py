"""Every threshold of the diagnosis in one place, with the reason for its value."""

from __future__ import annotations

from dataclasses import dataclass, replace

from laggard.errors import LaggardError, check_healthy_threshold

# The one home of the default healthy threshold: a job is healthy below 5% slowdown (the paper's
# jobs read 1.0-1.1 when healthy; run-to-run noise on a shared host is a few %). The CLI, the
# analysis, the fleet and the report's colour bands all take it from here.
HEALTHY_THRESHOLD = 1.05
DEFAULT_THRESHOLD = HEALTHY_THRESHOLD  # its name before the layered layout


@dataclass(kw_only=True, slots=True)
class DiagnoseConfig:
    # -- verdict and reporting
    # healthy below this slowdown; None: the analysis's (``AnalysisConfig.healthy_threshold``, by
    # default HEALTHY_THRESHOLD). Set here or there, not both to different values.
    threshold: float | None = None
    min_share: float = 0.05  # a finding must explain 5% of the slowdown: less is within run-to-run noise
    # ...and its fix must speed the step up by 1%: 5% of a small slowdown is a fraction of a percent,
    # below what two runs of one real job differ by (real corpus, Tracer traces: 11 of the 34 findings
    # that named no injected cause gained under 1.5%, 6 of them under 1%, against 2 of 52 right ones)
    min_gain: float = 1.01
    # explain several causes at once (Shapley values over the candidate fixes): 2^n replays
    max_joint: int = 7  # 128 subsets in one batched replay; more candidates are cut by their own scores
    single_cause: bool = False  # stop after the best finding (the diagnosis before several causes)
    unexplained_floor: float = 0.15  # say "unexplained: X%" when the findings leave more than this
    row_tie: float = 0.05  # a stage goes before a worker of it that explains at most this much more
    # a slow worker whose excess over its stage peers lies mostly in traced data waits (kind other: the
    # DataLoader's next batch) is slow at loading its input, not at computing: over half of the excess
    # is the majority that names the part to fix
    data_share: float = 0.5
    # the low-confidence finding (no cause's signature fits) names a rank only when fixing it alone
    # speeds the step up by this much: on-call drains the rank it names, and a rank whose fix gains
    # less cannot alone make a job straggle. A clean real ddp2 job on 2 shared cores (S 1.068) had its
    # rank 1 named, 5% slower by its own CPU timers in most steps, for a fix gaining 1.033x; the right
    # ranks such findings named gained 1.10x (seed-2028 corpus). Below it the stage or op type is named
    fallback_rank_gain: float = 1.05

    # -- what the replay can judge (else the verdict is "cannot judge", with the reason)
    # S below this: the all-ideal replay is >5% slower than the measured one. Pooled means move S by
    # ~1-3% either way on clean jobs; more means the graph lacks the job's dependencies (a real dp1 x pp4
    # gloo job whose transfers stayed unmatched read S = 0.78 and was called healthy)
    min_judged_slowdown: float = 0.95
    # replay fidelity (wall clock / replay of the steps back to back) below this: the replay takes >10%
    # longer than the job did, so it invents waits the job did not have (the fleet rejects such rows too)
    min_judged_fidelity: float = 0.9
    # point-to-point transfers with no partner on another rank (beyond zero-length ones, which Megatron
    # records at the ends of a virtual pipeline): above this share of the transfers, the pipeline's
    # dependencies are missing from the replay
    max_unmatched_p2p: float = 0.05
    # -- hidden stragglers: when what the findings leave unexplained would alone make the job straggle
    # once they are fixed, the detectors run again on the job with them fixed (a weaker straggler behind
    # a stronger one: a 1.25x worker next to a 1.6x one on a shared stage is within the first pass's noise)
    hidden_passes: int = 1
    # a hidden cause whose what-if, on the measured job, gets more than this share of what it removes
    # from ops the found fixes already change is mostly the found cause again (a job-wide --zero
    # kind=host beside a one-rank host stall): it is left off those ranks. Below it the overlap is
    # incidental (a stage's --scale over a few ops a --despike also touched) and the cause stays whole
    hidden_overlap_share: float = 0.5

    # -- enough to judge
    min_workers: int = 2  # one worker has nobody to wait for: its slow ops are speed, not straggling
    min_steps: int = 3  # fewer steady steps cannot tell a slow worker from a one-off stall

    # -- workers and stages (compute per step: the median over steps, so a few stalled steps do not count)
    # slow-worker candidate: compute >= 1.1x its fast stage peers' (was 1.25). The noise gate
    # (noise_*) then names only ranks whose excess stands above the job's own step-to-step noise, so
    # the nomination can reach the real range (1.15x+): real corpus, Tracer traces: slow workers named
    # 6/14 -> 8/14, named-rank precision unchanged; simulator sweep at the 1.15 floor: recall 0.960 ->
    # 0.979, precision 1.0 -> 0.988
    worker_ratio: float = 1.1
    # of several slow workers, one whose own effect on the step (its ops measured, the rest ideal)
    # stays within the job's noise while another's stands out is not named (``worker.impact_riders``):
    # the other ranks giving that noise, at most this many (a replay column each)
    rider_reference_ranks: int = 15
    # ...and the check is skipped when the replay would hold more op weights than this (8 bytes each:
    # 400 MB), e.g. several slow ranks of a 4,096-worker job (7.7M ops)
    rider_max_cells: int = 50_000_000
    # a rank flagged slow whose compute ratio stays within the noise is still named when its own effect
    # on the step is the job's largest and stands this many sigma over 1 (``worker.by_impact``): 3, the
    # transient bar, above the 2 a consistent target needs, since it was not named by its compute
    # (real corpora: the slow ranks so named stood 3.8-7.7 sigma out; the healthy ranks with the
    # largest effect in their jobs 1.2-2.9, and 3.2 for one that collected more garbage, which the
    # per-pass condition leaves out)
    worker_impact_k: float = 3.0
    # ...over at least this many steps: the largest effect among a job's ranks is always some rank's,
    # and over a few steps it stands above the rest in every one of them by chance (simulated jobs of
    # 3 steps with real-job noise: a heavy stage's rank and two ranks with long sequences were named)
    worker_impact_min_steps: int = 8
    heavy_row_ratio: float = 1.25  # a stage is heavy when its compute is 1.25x the other stages' (the
    # demo job's last stage computes 1.02-1.1x the first with no injection)
    stage_compute_min: float = 1.1  # an S_w-hot row is a stage finding only with 1.1x the compute
    # a pure pipeline's stage whose one worker is slow beyond the noise is heavy from 1.15x the other
    # stages' compute without a hot S_stage (which the pooled ideal keeps near 1 there): the floor of
    # the real range (issue 24), over the 1.02-1.13x the demo job's last stage computes for its loss
    # (real dp 1 x pp 3-4 jobs: 1.10x and 1.13x named at 1.1x; 1.15-1.23x heavy stages found)
    pure_stage_ratio: float = 1.15
    hot_of_top: float = 0.5  # a worker is hot in the heatmap at half the top excess of S_w
    row_majority: float = 0.5  # a row is hot when more than half its workers are hot or heavy
    # a replica of a stage that stands out is heavy where it carries this share of the stage's excess
    # (its median ratio to the other stages): a heavy stage's replicas share the excess, while one
    # slow replica carries all of it and the others none. Judged alone against the workers' noise (a
    # ratio of two single workers, noisier than the stage's mean), a real dp 2 x pp 2 job's 1.32x stage
    # (its ranks' own CPU 1.47x) had replicas at 1.21x against 0.15 and was named by nothing
    stage_replica_share: float = 0.5
    # ...over at least this many steps: over 3 steps of a simulated job with GC pauses, a stage stood
    # out in all 3 and its replicas, 1.2-1.5x by the pauses, shared an excess no cause made
    stage_replica_min_steps: int = 8
    stage_vs_median: float = 2.0  # ...and its excess S_stage is 2x the other stages' median excess

    # -- sequence imbalance
    seq_min_ops: int = 8  # forward/backward pairs needed for a correlation
    seq_spread: float = 0.05  # microbatch times vary by >= 5% within a step (jitter is 3%)
    seq_corr: float = 0.6  # forward and backward of one microbatch move together (attention cost);
    # a rank correlation, so that a few GC-stalled forwards do not break it (jitter alone: ~0)
    # where the trace has the sequence lengths, they must explain the forward times (R^2 of the
    # attention-cost fit): real corpus, Tracer traces: R^2 0.66-0.96 where lengths were imbalanced, 0.00-0.01
    # in the 3 jobs whose times moved with CPU contention, a slow worker or GC pauses instead
    seq_min_r2: float = 0.3
    # where the lengths explain the forward times this well they are the evidence, and forward and
    # backward need not move together: on 4 processes sharing 2 cores a pure pipeline's backward times
    # move with the contention (two real dp 1 x pp 4 jobs with imbalanced lengths: rank correlation
    # 0.46, R^2 0.50 and 0.63; jobs without imbalanced lengths, three corpus runs: R^2 <= 0.04)
    seq_fit_alone_r2: float = 0.45

    # -- garbage collection
    gc_mad: float = 8.0  # a forward is stalled at median + 8 MADs (far outside the jitter)
    gc_rel: float = 0.3  # ...and at least 30% over its median
    gc_traced_share: float = 0.01  # traced gc ops worth 1% of the step are a finding of their own
    # where the trace records collections, a stalled forward is GC's only when collections traced inside
    # it take half its excess (real jobs on a busy host: 50-180 ms stalls with 0-1 ms of GC in them)
    gc_traced_cover: float = 0.5
    gc_paired_max: float = 0.3  # stalls that hit the backward too (30%+) are slow microbatches, not GC

    # -- communication
    comm_min_ops: int = 4
    comm_median_x: float = 3.0  # a slow link's median transfer is 3x its op type's median
    comm_max_x: float = 10.0  # ...or its worst is 10x (rare long stalls)
    comm_excess_of_top: float = 0.3  # links within 30% of the worst link's excess are candidates
    comm_stands_out: float = 2.0  # a bad link's excess is 2x its op type's other links' median
    comm_everywhere: float = 0.5  # slow on more than half the links: not one link's fault
    # a link slow only in its tail (its median transfer within comm_median_x of the other links') is
    # named only when fixing it speeds the step up by 5%, what a job must lose to be called straggling:
    # on a busy host a rank blocked in a transfer wakes late, and one link's tail then stands out step
    # after step (real corpora, four runs: 14 such findings, none on an injected link, gained 0.5-2.3%;
    # every injected slow link delays each transfer, its median 24-180x the other links'). The same
    # floor holds for the tail every link shares (no link stands out, no link's median slow): real
    # corpora, six of them (Tracer and profiler traces): 180 such findings on gloo, where no cause
    # slows every link, gained 0.8-6.0%, 176 of them under 5%
    comm_tail_min_gain: float = 1.05

    # -- untraced host time (host ops, laggard.engine.gaps)
    host_min_share: float = 0.02  # a rank's host time above its peers' must be 2% of the ideal step
    # (smaller excesses are the noise of a shared host)
    host_hot_share: float = 0.5  # ranks with half the worst rank's excess are named with it
    host_max_ranks: int = 8  # at most this many ranks in one finding
    # ... and at most half the ranks: when most ranks spend the same host time it is the overhead every
    # rank pays (the launch-delay finding on the whole job), not theirs (real corpus: every rank named,
    # "median of the other ranks: 0.0 ms", in 7 of 64 jobs)
    host_max_rank_share: float = 0.5
    # the launch overhead every rank pays names its worst rank only when that rank's untraced gaps are
    # twice the other ranks' median (and over host_min_share of the step): on a shared host every rank
    # has some, and naming the largest of alike gaps was a false rank in 9 of 10 clean real jobs
    launch_rank_ratio: float = 2.0
    launch_idle_share: float = 0.02  # the median rank's untraced host time per step is 2% of the ideal
    # step: a launch overhead every rank pays (clean simulated jobs: 0.1%; the published traces: 0.5%
    # (ST) and 0.02% (AR)); other causes may hide most of it, and it is what they leave once fixed
    # ...and 10% where the compute ops are CPU-side passes an importer cut from a profiler trace
    # (``HOST_GAP_CUT_KEY``): there the Python between the passes (the loss, autograd's start, the
    # optimizer's glue) is untraced host time on every rank of every job: 2.0-7.5% of the ideal step
    # in six real corpora's profiler traces (304 jobs) wherever no launch delay, host stall or
    # unrecorded GC pause was injected (a launch delay named in 54 of one corpus's 64 jobs), while
    # the 39 injected launch delays (from 1.15x) left 14.8-67%
    launch_idle_share_host: float = 0.10

    # -- noise: a named rank, stage or link stands out from the job's own step-to-step variation
    # (``laggard.diagnose.noise``; sigma: the robust spread of the same per-step ratio for the others)
    noise_floor: float = 0.01  # sigma is at least 1%: timer resolution and clock jitter on a real host;
    # a jitter-free simulated job would otherwise make any excess significant
    noise_step_k: float = 1.0  # a step is slow 1 sigma over its reference: a healthy target's step does
    # so 16% of the time, a 1.2x straggler's on a 2-core host (sigma ~0.12) about 65% of the time
    noise_consistent_share: float = 0.5  # consistent: slow in at least half the steps (a healthy target
    # reaches it by chance in 7% of 3-step jobs, 2% at 8 steps, 0.1% at 16)
    noise_median_k: float = 2.0  # ...and its median ratio 2 sigma over 1 (sigmas of one step, not
    # standard errors: healthy ranks of a busy host differ steadily by 1-1.6 sigma, e.g. 1.45x and 1.7x
    # the fastest of a real 4-rank DDP job on 2 cores; the demo job's 2x slow worker and 4x heavy stage
    # stand at 2.2-3 sigma there; with 3 steps a healthy rank's median passes in 0.3% of jobs)
    noise_transient_k: float = 3.0  # transient: steps 3 sigma over 1 (a healthy step does that once in
    # ~700); only for causes that can come and go (host time, links)
    noise_transient_p: float = 0.001  # ...more of them than the others' rate of such steps gives by
    # chance (binomial tail under 0.1%): on gloo every link has them in 10-30% of steps (ratios 0.05-20x)
    noise_transient_min_steps: int = 2  # ...and at least 2 of them: one step far out is a blip every rank of
    # a busy host has now and then (the demo job: 5-20 ms host stalls on random ranks and steps)
    noise_transient_level: float = 0.5  # ...where "such steps" are also counted at half the target's own far
    # excess (the median over its far steps): on 2 shared cores one other rank's 5%-of-a-step blip past
    # the 3-sigma bar made a real 117 ms stall in 4 of 16 steps (44% of the step) no longer transient

    def __post_init__(self) -> None:
        for name in ("min_gain", "comm_tail_min_gain", "fallback_rank_gain"):
            if not getattr(self, name) >= 1.0:
                raise LaggardError(f"DiagnoseConfig.{name}={getattr(self, name)}: a speed-up floor is at least 1")
        if self.threshold is not None:
            check_healthy_threshold(self.threshold, "DiagnoseConfig.threshold")

    @property
    def healthy_threshold(self) -> float:
        """The threshold in force: this config's, else the default."""
        return HEALTHY_THRESHOLD if self.threshold is None else self.threshold

    def with_threshold(self, threshold: float | None, where: str = "threshold") -> DiagnoseConfig:
        """This config with the healthy threshold resolved: ``threshold`` (given elsewhere) when this
        config sets none or the same; a clear error when both are set and differ."""
        if threshold is None:
            return replace(self, threshold=self.healthy_threshold)
        check_healthy_threshold(threshold, where)
        if self.threshold is not None and self.threshold != threshold:
            raise LaggardError(f"the healthy threshold is given twice: {where}={threshold:g} and "
                               f"DiagnoseConfig.threshold={self.threshold:g}; give it once")
        return replace(self, threshold=float(threshold))
