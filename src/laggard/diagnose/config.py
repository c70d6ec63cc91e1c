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
    """Every threshold of the diagnosis. Each comment gives the reason for the value and, where the
    rule is a test against noise, the false-alarm rate it allows under a stated null (docs/rules.md
    derives each one)."""

    # -- verdict and reporting
    # healthy below this slowdown; None: the analysis's (``AnalysisConfig.healthy_threshold``, by
    # default HEALTHY_THRESHOLD). Set here or there, not both to different values.
    threshold: float | None = None
    min_share: float = 0.05  # a finding must explain 5% of the slowdown: less is within run-to-run noise
    # ...and its fix must speed the step up by 1%: 5% of a small slowdown is a fraction of a percent,
    # below what two runs of one job differ by on a shared host
    min_gain: float = 1.01
    # a finding that names a rank, a stage or a link needs its fix to gain this much (job-wide ones keep
    # min_gain): on-call drains what is named, and a node whose fix gains under 2% cannot be told from
    # run-to-run variation; a cause others hide may gain it fixed after them instead (named as hidden)
    min_named_gain: float = 1.02
    # explain several causes at once (Shapley values over the candidate fixes): 2^n replays
    max_joint: int = 7  # 128 subsets in one batched replay; more candidates are cut by their own scores
    single_cause: bool = False  # stop after the best finding (the diagnosis before several causes)
    unexplained_floor: float = 0.15  # say "unexplained: X%" when the findings leave more than this
    # the low-confidence finding names the narrowest carrier within this share of the slowdown of the
    # best one (a rank before its stage, a stage before an op type): what on-call can act on
    row_tie: float = 0.05
    # a slow worker whose excess over its stage peers lies mostly in traced data waits (kind other: the
    # DataLoader's next batch) is slow at loading its input, not at computing: over half of the excess
    # is the majority that names the part to fix
    data_share: float = 0.5
    # the low-confidence finding (no cause's signature fits) names a rank only when fixing it alone
    # speeds the step up by this much, the healthy threshold's: on-call drains the rank it names, and a
    # rank whose fix gains less cannot alone make a job straggle; below it the stage or op type is named
    fallback_rank_gain: float = 1.05

    # -- what the replay can judge (else the verdict is "cannot judge", with the reason)
    # S below this: the all-ideal replay is >5% slower than the measured one. Pooled means move S by a
    # few % either way on clean jobs; more means the graph lacks the job's dependencies (a pipeline
    # whose transfers stayed unmatched replays as independent ranks, faster than the job)
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
    # slow-worker candidate: compute >= 1.1x its fast stage peers'. A nomination, not a verdict: the
    # noise gate (noise_*) names only ranks whose excess stands above the job's own step-to-step noise,
    # so the floor can sit at the low end of real stragglers (1.15x and up) and under the 1.02-1.1x a
    # healthy rank of a shared host computes beside its fastest peer
    worker_ratio: float = 1.1
    # where compute runs on the host's CPUs, a rank stalled in host time computes while its peers wait
    # for it, on cores they leave idle: its compute is faster than a healthy rank's, so it is left out
    # of its peers' yardstick (``worker.yardsticks``). True keeps it in (the rule off).
    worker_stalled_yardstick: bool = False
    # of several slow workers, one whose own effect on the step (its ops measured, the rest ideal)
    # stays within the job's noise while another's stands out is not named (``worker.impact_riders``):
    # the other ranks giving that noise, at most this many (a replay column each)
    rider_reference_ranks: int = 15
    # ...and the check is skipped when the replay would hold more op weights than this (8 bytes each:
    # 400 MB), e.g. several slow ranks of a 4,096-worker job (7.7M ops)
    rider_max_cells: int = 50_000_000
    # a multi-rank worker finding keeps a rank only where, fixed last, it removes this share of what the
    # finding's fix removes (``worker.worth_naming``): a rider removes ~0, each of several equal
    # stragglers ~all of it; one replay per rank, so judged for up to worker_marginal_max ranks
    worker_marginal_share: float = 0.2
    worker_marginal_max: int = 16
    # a rank flagged slow whose compute ratio stays within the noise is still named when its own effect
    # on the step is the job's largest and stands this many sigma over 1 (``worker.by_impact``): the
    # transient bar, above the 2 a consistent target needs, since its compute did not name it (a
    # healthy rank's median passes it with probability < 1e-5 at 8 steps, sigma known)
    worker_impact_k: float = 3.0
    # ...over at least this many steps: the largest effect among a job's ranks is always some rank's,
    # and over a few steps it stands above the rest in every one of them by chance (one of n alike ranks
    # is the slowest in all k steps with probability n^(1-k): 6% for 3 steps of 4 ranks, 0.02% for 8)
    worker_impact_min_steps: int = 8
    # a DP rank whose compute and input waits, summed over windows of this many consecutive steps, are
    # consistently over its stage peers' and whose excess lies in its input waits is a slow input
    # pipeline (``worker.by_window``): a DataLoader whose workers cannot keep up hands its batches over
    # num_workers at a time, so its rank waits every few steps and its median step is a healthy one.
    # The smallest window where it is consistent names it; each window's false-alarm rate is the noise
    # gate's consistency rate (< 0.2% per rank at 8 windows with sigma from three other ranks)
    worker_window_steps: tuple[int, ...] = (2, 3, 4)
    # ...with at least this many whole windows (consistency over fewer is judged on too few values)
    worker_window_min: int = 8
    # a rank's effect on the step is consistent only where it is slow in more steps than the other ranks'
    # rate of slow steps gives by chance (binomial tail under this: at most 1% per rank): an effect on
    # the step is the step's slowest rank, and in a job of alike ranks each is the slowest in ~1/n of
    # the steps while the others' effects sit at 1, so their spread understates the noise (a rank of 4
    # alike ones is slowest in 6 of 8 steps with probability 0.42%, 5 of 8 with 2.7%)
    impact_chance_p: float = 0.01
    # a stage is heavy when its compute is 1.25x the other stages': a last stage's loss and logits cost
    # 1.02-1.13x the others' by design, which is no imbalance to fix
    heavy_row_ratio: float = 1.25
    stage_compute_min: float = 1.1  # an S_w-hot row is a stage finding only with 1.1x the compute
    # a pure pipeline's stage whose one worker is slow beyond the noise is heavy from 1.15x the other
    # stages' compute without a hot S_stage (which the pooled ideal keeps near 1 there): the low end of
    # real stragglers, over the 1.02-1.13x a last stage computes for its loss
    pure_stage_ratio: float = 1.15
    hot_of_top: float = 0.5  # a worker is hot in the heatmap at half the top excess of S_w
    row_majority: float = 0.5  # a row is hot when more than half its workers are hot or heavy
    # a replica of a stage that stands out is heavy where it carries this share of the stage's excess
    # (its median ratio to the other stages): a heavy stage's replicas share the excess, while one
    # slow replica carries all of it and the others none; judged alone against the workers' noise (a
    # ratio of two single workers, noisier than the stage's mean) a heavy stage's replicas can each
    # read as noise
    stage_replica_share: float = 0.5
    # ...over at least this many steps: over a few steps the pauses or stalls of one step move a whole
    # stage, and its replicas then share an excess no cause made
    stage_replica_min_steps: int = 8
    stage_vs_median: float = 2.0  # ...and its excess S_stage is 2x the other stages' median excess

    # -- sequence imbalance
    seq_min_ops: int = 8  # forward/backward pairs needed for a correlation
    seq_spread: float = 0.05  # microbatch times vary by >= 5% within a step (a clean job's jitter is 3%)
    # forward and backward of one microbatch move together (attention cost): a rank correlation, so that
    # a few GC-stalled forwards do not break it; independent times reach it in 5.8% of 8 pairs, 0.84% of
    # 16, 0.02% of 32, before the spread and the fit below
    seq_corr: float = 0.6
    # where the trace has the sequence lengths, they must explain the forward times (R^2 of the
    # attention-cost fit): times moved by CPU contention, a slow worker or GC pauses fit the lengths
    # with R^2 near 0, imbalanced lengths with 0.6 and more
    seq_min_r2: float = 0.3
    # where the lengths explain the forward times this well they are the evidence, and forward and
    # backward need not move together: on processes sharing cores the backward times move with the
    # contention too, which breaks the correlation and not the fit
    seq_fit_alone_r2: float = 0.45

    # -- garbage collection
    gc_mad: float = 8.0  # a forward is stalled at median + 8 MADs: a normal op passes with p = 3.4e-8
    gc_rel: float = 0.3  # ...and at least 30% over its median (MADs of a very steady op are tiny)
    gc_traced_share: float = 0.01  # traced gc ops worth 1% of the step are a finding of their own
    # where the trace records collections, a stalled forward is GC's only when collections traced inside
    # it take half its excess: a busy host stalls forwards too, with no collection in them
    gc_traced_cover: float = 0.5
    gc_paired_max: float = 0.3  # stalls that hit the backward too (30%+) are slow microbatches, not GC

    # -- communication
    comm_min_ops: int = 4
    # a slow link's median transfer is 3x its op type's other links' median: transfers lognormal with
    # sigma 0.5 (a loaded loopback) give it by chance in 0.005% of links of 4 transfers
    comm_median_x: float = 3.0
    comm_max_x: float = 10.0  # ...or its worst is 10x (rare long stalls; < 1e-5 for 4 such transfers)
    comm_excess_of_top: float = 0.3  # links within 30% of the worst link's excess are candidates
    comm_stands_out: float = 2.0  # a bad link's excess is 2x its op type's other links' median
    comm_everywhere: float = 0.5  # slow on more than half the links: not one link's fault
    # a link slow only in its tail (its median transfer within comm_median_x of the other links') is
    # named only when fixing it speeds the step up by 5%, what a job must lose to be called straggling:
    # on a busy host a rank blocked in a transfer wakes late, and one link's tail then stands out step
    # after step, while a slow link delays every transfer and moves its median. The same floor holds
    # for the tail every link shares (no link stands out, no link's median slow): ranks waiting on
    # peers that run late, which a fix of the transfers does not remove
    comm_tail_min_gain: float = 1.05

    # -- untraced host time (host ops, laggard.engine.gaps)
    host_min_share: float = 0.02  # a rank's host time above its peers' must be 2% of the ideal step
    # (smaller excesses are the noise of a shared host)
    host_hot_share: float = 0.5  # ranks with half the worst rank's excess are named with it
    host_max_ranks: int = 8  # at most this many ranks in one finding
    # -- work one rank does alone (``laggard.diagnose.extra``): a rank's seconds of ops of a type it
    # runs more of than any stage peer in a step, over its peers', are 2% of the ideal step on average
    # at least (less costs the job less than the noise of its step), then the noise gate judges them
    extra_min_share: float = 0.02
    extra_max_ranks: int = 8  # at most this many ranks judged (the largest first)
    # ... and at most half the ranks: when most ranks spend the same host time it is the overhead every
    # rank pays (the launch-delay finding on the whole job), not theirs
    host_max_rank_share: float = 0.5
    # the launch overhead every rank pays names its worst rank only when that rank's untraced gaps are
    # twice the other ranks' median (and over host_min_share of the step): on a shared host every rank
    # has some, and the largest of alike gaps is some rank's by chance
    launch_rank_ratio: float = 2.0
    # the median rank's untraced host time per step is 2% of the ideal step: a launch overhead every
    # rank pays (a clean job's launch gaps are a fraction of a percent); other causes may hide most of
    # it, and it is what they leave once fixed
    launch_idle_share: float = 0.02
    # ...and 10% where the compute ops are CPU-side passes an importer cut from a profiler trace
    # (``HOST_GAP_CUT_KEY``): there the Python between the passes (the loss, autograd's start, the
    # optimizer's glue) is untraced host time on every rank of every job, a few % of the step, while a
    # launch delay worth straggling over leaves well over 10%
    launch_idle_share_host: float = 0.10

    # -- noise: a named rank, stage or link stands out from the job's own step-to-step variation
    # (``laggard.diagnose.noise``; sigma: the robust spread of the same per-step ratio for the others)
    noise_floor: float = 0.01  # sigma is at least 1%: timer resolution and clock jitter on a real host;
    # a jitter-free simulated job would otherwise make any excess significant
    noise_step_k: float = 1.0  # a step is slow 1 sigma over its reference: a healthy target's step does
    # so 16% of the time, a straggler's 1 sigma beyond its noise 50%, 2 sigma beyond 84%
    noise_consistent_share: float = 0.5  # consistent: slow in at least half the steps (a healthy target
    # reaches it by chance in 7% of 3-step jobs, 2% at 8 steps, 0.1% at 16)
    # ...and its median ratio 2 sigma over 1 (sigmas of one step, not standard errors: healthy ranks of
    # a busy host differ steadily by about one step's noise). Both, for a healthy target with sigma
    # known: 0.16% of 3-step jobs, 0.02% at 4 steps, < 1e-5 from 8; with sigma from three other
    # targets, 0.14% at 8 steps (docs/rules.md)
    noise_median_k: float = 2.0
    noise_transient_k: float = 3.0  # transient: steps 3 sigma over 1 (a healthy step does that once in
    # ~700); only for causes that can come and go (host time, links)
    noise_transient_p: float = 0.001  # ...more of them than the others' rate of such steps gives by
    # chance (binomial tail under 0.1%: at most 0.1% per target at the others' rate; the run rule's
    # chance of its run, likewise)
    noise_transient_min_steps: int = 2  # ...and at least 2 of them: one step far out is a blip every rank of
    # a busy host has now and then
    noise_periodic: bool = True  # ...or, where 3 or more far steps are evenly spaced (every N-th step, N >= 2),
    # the tail times the share of so many judged steps that fall evenly spaced: at most 0.1% still under
    # the null (far steps at independent positions), and a periodic stall (a checkpoint, an evaluation,
    # a log flush every N steps) against one peer's steps is told from chance by where it falls
    # a run of slow steps (a straggler that recovers or starts late) a quarter of the steps at least,
    # the healthy rest more: a steady straggler's few unlucky steps at one end are no recovery
    # (a healthy target reads as a run in 0.1% of 16-step jobs, sigma from three others)
    noise_run_share: float = 0.25
    noise_transient_level: float = 0.5  # ...where "such steps" are also counted at half the target's own far
    # excess (the median over its far steps): a few of the others' blips just past the 3-sigma bar must
    # not hide a stall ten times their size

    def __post_init__(self) -> None:
        for name in ("min_gain", "min_named_gain", "comm_tail_min_gain", "fallback_rank_gain"):
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
