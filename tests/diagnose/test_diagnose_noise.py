"""Noise-aware naming: every named rank, stage or link says how consistent its excess is against the
job's own step-to-step noise, and nothing within that noise is named (``laggard.diagnose.noise``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from laggard.diagnose import DiagnoseConfig
from laggard.diagnose.noise import JobNoise, binom_tail, judge, ratio_sigma
from laggard.results.diagnosis import step_spans

# the gate off: every step reads as slow and every target as consistent
# the gate off (and no second pass for hidden stragglers, which without the gate names more noise): what
# the first pass named before noise-aware naming
# every gate off: the noise gate, and the marginal share a multi-rank worker finding keeps a rank by
NO_GATE = DiagnoseConfig(noise_median_k=-1e9, noise_consistent_share=0.0, noise_step_k=-1e9, hidden_passes=0,
                         worker_marginal_max=0)


def _retimed(job, dur_s: np.ndarray, gap_s: np.ndarray | None = None):
    """The job with new op durations (and launch gaps before ops), its timeline replayed as the
    synthetic generator lays it out (steps end to end)."""
    from laggard.engine.graph import build_graph
    from laggard.engine.replay import op_starts, replay
    from laggard.optable.ops import Job

    gap_s = np.zeros(len(dur_s)) if gap_s is None else gap_s
    graph = build_graph(job)
    ends, step_s = replay(graph, dur_s + gap_s)
    starts = op_starts(graph, ends) + gap_s
    offset = np.concatenate([[0.0], np.cumsum(step_s)[:-1]])[graph.op_step]
    t = job.table
    for col, v in (("start_ns", starts + offset), ("dur_ns", ends - starts)):
        t = t.set_column(t.schema.get_field_index(col), col, pa.array(np.round(v * 1e9).astype(np.int64)))
    return Job(table=t, meta=job.meta)


def _busy_job(seed: int, sigma: float, factor: dict[int, float], *, dp: int = 4, pp: int = 2, steps: int = 12):
    """A synthetic job on a busy host: each (rank, step)'s compute scaled by lognormal noise
    (``sigma``) and by a steady per-rank ``factor`` (a rank with a core of its own runs faster)."""
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=dp, pp=pp, steps=steps, seed=seed))
    kinds, labels = job.codes("kind")
    compute = np.isin(np.array(labels)[kinds], ["compute", "other"])
    rank, step = job.column("rank"), job.column("step")
    f = np.random.default_rng(seed).lognormal(0.0, sigma, size=(int(rank.max()) + 1, int(step.max()) + 1))
    for r, x in factor.items():
        f[r] *= x
    dur = job.column("dur_ns") * 1e-9
    return _retimed(job, np.where(compute, dur * f[rank, step], dur))


def _workers(d, cause: str = "worker") -> list[list[int]]:
    return [[w["rank"] for w in f.workers] for f in d.findings if f.cause == cause]


def test_judge_reads_consistent_transient_and_noise():
    cfg = DiagnoseConfig()
    steps = np.arange(24)
    quiet = JobNoise(sigma=0.04, far_rate=0.001)
    steady = 1.31 + 0.04 * np.sin(steps)
    c = judge("rank 3", "compute", steady, 0.01 * np.ones(24), steps, quiet, cfg)
    assert c.pattern == "consistent" and len(c.slow_steps) == 24 and c.ratio == pytest.approx(1.31, abs=0.02)
    assert c.text.startswith("rank 3: slow in 24 of 24 steps, 1.31x ± 0.0") and c.text.endswith("(job noise ± 0.04)")
    bursts = np.ones(24)
    bursts[[7, 8, 9, 15]] = 2.1
    t = judge("rank 3", "compute", bursts, np.zeros(24), steps, quiet, cfg)
    assert t.pattern == "transient" and t.slow_steps == [7, 8, 9, 15] and t.ratio == pytest.approx(2.1)
    assert "slow in steps 7-9 and 15 (4 of 24), 2.10x ± 0.00 there" in t.text
    # the same bursts where every target has such steps a third of the time: the tail of a busy host
    assert judge("rank 3", "compute", bursts, np.zeros(24), steps, JobNoise(sigma=0.04, far_rate=0.3),
                 cfg).pattern == "noise"
    # one step far out is a blip every rank of a busy host has now and then, not a transient straggler
    blip = np.ones(24)
    blip[11] = 2.1
    assert judge("rank 3", "host", blip, np.zeros(24), steps, JobNoise(sigma=0.04), cfg).pattern == "noise"
    # a 1.3x median in a job whose steps vary by 20%: within the noise
    assert judge("rank 3", "compute", steady, np.zeros(24), steps, JobNoise(sigma=0.2, far_rate=0.01),
                 cfg).pattern == "noise"
    # no reference in any step: not judged here (the detector's rule stands)
    assert judge("link 0-1", "transfer", np.full(24, np.nan), np.zeros(24), steps, quiet, cfg).pattern == "unjudged"


def test_a_ratio_of_hundreds_reads_as_the_time_added():
    """A rank that sleeps 30 ms in a pass its peers run in 0.06 ms is 500x slower, with a spread as
    wide: the text gives the milliseconds it adds per step, and the ratio beside them, not a ratio
    with a spread of hundreds; a link's bursts likewise. Ratios of a few stay ratios."""
    cfg = DiagnoseConfig()
    steps = np.arange(13)
    quiet = JobNoise(sigma=0.9, far_rate=0.001)
    huge = np.linspace(200.0, 900.0, 13)
    c = judge("rank 1", "compute", huge, np.full(13, 0.0318), steps, quiet, cfg)
    assert c.pattern == "consistent"
    assert c.what == f"rank 1: slow in 13 of 13 steps, +31.8 ms per step, {np.median(huge):.0f}x its peers' time"
    assert "±" not in c.what
    bursts = np.ones(13)
    bursts[[3, 4, 9]] = 40.0
    t = judge("link 0->1 (send)", "transfer", bursts, np.where(bursts > 1, 0.012, 0.0), steps,
              JobNoise(sigma=0.04, far_rate=0.001), cfg)
    assert t.pattern == "transient"
    assert t.what.endswith("slow in steps 3-4 and 9 (3 of 13), +12.0 ms per step, 40x the other links' time there")
    few = judge("rank 1", "compute", np.full(13, 4.9), np.full(13, 0.01), steps, quiet, cfg)
    assert "4.90x ± 0.00" in few.what


def test_far_rate_of_a_clean_reference_is_not_zero():
    """Two reference ranks with no far step in 16 steps each: their rate is the Jeffreys estimate
    (1/2 / 33), not 0, so three far steps of a rank (descheduled three times on a busy host) are not
    "transient", and five still are. With the bare share (0) both were."""
    cfg = DiagnoseConfig()
    ref = np.ones((2, 16))
    noise = JobNoise.of(0.02, ref, cfg)
    assert noise.far_rate == pytest.approx(0.5 / 33)
    steps = np.arange(16)
    three, five = np.ones(16), np.ones(16)
    three[[8, 14, 15]] = 1.15
    five[[1, 4, 7, 10, 13]] = 1.15
    assert judge("rank 0", "host", three, np.zeros(16), steps, noise, cfg).pattern == "noise"
    assert judge("rank 0", "host", five, np.zeros(16), steps, noise, cfg).pattern == "transient"
    assert judge("rank 0", "host", three, np.zeros(16), steps, JobNoise(sigma=0.02, far_rate=0.0),
                 cfg).pattern == "transient"
    # far steps seen in the reference raise the rate (2 of 32 -> 2.5 / 33)
    ref[0, [3, 9]] = 1.5
    assert JobNoise.of(0.02, ref, cfg).far_rate == pytest.approx(2.5 / 33)


def test_a_stall_ten_times_the_others_blips_is_transient():
    """A real profiled dp 2 x pp 2 job (corpus job055, its per-step host ratios): rank 3 stalls 117-129
    ms in 4 of 16 steps (ratio 1.43-1.47); one step of rank 0 sits at 1.052, just past the 3-sigma bar
    (1.051); counted whole it would make the others' rate of far steps 1.5 / 49, under which 4 far steps
    of 16 are not rare enough (p = 0.0011) and the stall would be called noise. Counted at half the
    stall's own excess, the others have no such step, and the stall is transient. Far steps no higher
    than the bar get no such second look. (The stall falls every 4 steps, which the periodic reading
    would count too: it is off here, so that only the level is judged.)"""
    cfg = DiagnoseConfig(noise_periodic=False)
    others = np.array([
        [1.039, 0.999, 0.984, 1.004, 0.982, 0.993, 1.0, 0.986, 0.987, 0.992, 1.052, 0.992, 0.999, 1.006, 1.019, 0.982],
        [1.028, 0.569, 1.01, 0.974, 1.007, 0.534, 0.967, 0.967, 1.012, 0.551, 0.98, 0.962, 1.0, 0.573, 1.022, 1.008],
        [0.961, 1.001, 1.016, 0.996, 1.018, 1.007, 1.0, 1.014, 1.013, 1.008, 0.948, 1.008, 1.001, 0.994, 0.981, 1.018]])
    stall = np.array([0.972, 1.431, 0.99, 1.026, 0.993, 1.466, 1.033, 1.033, 0.988, 1.449, 1.02, 1.038, 1.0, 1.427,
                      0.978, 0.992])
    job = JobNoise.of(0.016858, others, cfg)
    assert job.far_rate == pytest.approx(1.5 / 49)
    steps = np.arange(16)
    c = judge("rank 3", "host", stall, np.zeros(16), steps, job, cfg)
    assert c.pattern == "transient" and c.slow_steps == [1, 5, 9, 13] and c.ratio == pytest.approx(1.44, abs=0.01)
    # the old reading: only the rate at the bar
    assert judge("rank 3", "host", stall, np.zeros(16), steps, JobNoise(sigma=0.016858, far_rate=1.5 / 49),
                 cfg).pattern == "noise"
    low = np.where(stall > 1.2, 1.06, stall)  # the same steps, just past the bar: as before
    assert judge("rank 3", "host", low, np.zeros(16), steps, job, cfg).pattern == "noise"


def test_noise_helpers():
    assert (step_spans([15, 7, 8, 9]) == "7-9 and 15" and step_spans([3]) == "3"
            and step_spans([1, 3, 5]) == "1, 3 and 5")
    assert binom_tail(0, 5, 0.1) == 1.0 and binom_tail(5, 5, 0.5) == pytest.approx(1 / 32)
    assert binom_tail(3, 10, 0.0) == 0.0
    # a ratio to one peer is noisier than a ratio to the median of many
    assert ratio_sigma(0.1, 1) == pytest.approx(0.1 * np.sqrt(2)) and ratio_sigma(0.1, 7) < ratio_sigma(0.1, 1)


def test_healthy_ranks_riding_along_are_dropped():
    """A busy host (compute varies by 25% step to step) where one rank of stage 1 has a core of its own
    (0.75x) and rank 5 is a 2.5x straggler: against the fast rank, the healthy ranks 3 and 7 of stage 1
    read 1.25x+ in the median step and ride along ("drain the node of rank 5 (and of 2 more)") in most
    draws of the noise; only rank 5 stands out from it (an unlucky draw may still read 1.8x)."""
    from laggard.analysis.pipeline import analyze

    jobs = [_busy_job(seed, 0.25, {1: 0.75, 5: 2.5}) for seed in range(6)]
    without = [_workers(analyze(job, config=NO_GATE).diagnosis) for job in jobs]
    assert sum(w != [[5]] for w in without) >= 4, without  # the false ranks, without the gate
    named = [_workers(analyze(job).diagnosis) for job in jobs]
    assert all(w[0][0] == 5 for w in named) and sum(w != [[5]] for w in named) <= 1, named
    d = analyze(jobs[1]).diagnosis
    f = next(f for f in d.findings if f.cause == "worker")
    assert "(and of" not in f.fix and f.steps_slow == f.steps_total == 12 and f.transient_steps == []
    assert 2.5 < f.ratio < 4.5 and 0 < f.ratio_spread < 1.5
    j = f.to_json()
    assert (j["steps_slow"] == 12 and j["targets"][0]["target"] == "rank 5"
            and j["targets"][0]["pattern"] == "consistent")
    assert j["consistency"].startswith("rank 5: slow in 12 of 12 steps, ")


def test_a_quiet_slow_worker_is_named_with_its_consistency():
    """Jitter of 8% per op: a 1.3x worker is named, steadily slow."""
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.inject import parse_injection
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=4, pp=2, steps=10, seed=0, jitter=0.08),
                     [parse_injection("slow-worker:rank=5,factor=1.3")])
    f = next(f for f in analyze(job).diagnosis.findings if f.cause == "worker")
    assert [w["rank"] for w in f.workers] == [5] and f.steps_slow == f.steps_total == 10
    assert f.ratio == pytest.approx(1.3, abs=0.05) and f.targets[0].noise < 0.05


def test_a_bursty_host_stall_is_described_as_transient():
    """Rank 3 stalls 120 ms before its first compute in steps 7-9 and 15 of 24: named for its host time,
    as a transient straggler with those steps."""
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=4, pp=2, steps=24, seed=1))
    kinds, labels = job.codes("kind")
    rank, step = job.column("rank"), job.column("step")
    on = np.flatnonzero((np.array(labels)[kinds] == "compute") & (rank == 3) & np.isin(step, [7, 8, 9, 15]))
    gap = np.zeros(len(rank))
    gap[on[np.unique(step[on], return_index=True)[1]]] = 0.12
    d = analyze(_retimed(job, job.column("dur_ns") * 1e-9, gap)).diagnosis
    f = next(f for f in d.findings if f.cause == "launch-delay" and f.targets)
    assert [w["rank"] for w in f.workers] == [3] and f.transient_steps == [7, 8, 9, 15]
    assert f.targets[0].pattern == "transient" and f.targets[0].excess_s == pytest.approx(0.12, rel=0.05)
    assert "rank 3: slow in steps 7-9 and 15 (4 of 24), +120.0 ms of host time per step" in f.consistency_text


def test_a_stage_with_one_slow_replica_is_not_heavy():
    """dp 2 x pp 2: one replica of stage 1 computes 1.2x (under the slow-worker floor), the other as
    stage 0 does: the stage is not heavier beyond the noise (its healthy replica is not); with both
    replicas 1.3x it is."""
    from laggard.analysis.pipeline import analyze
    from laggard.diagnose.context import Ctx
    from laggard.diagnose.stage import _rows, consistency

    def stage_1(factor: dict[int, float], cfg: DiagnoseConfig) -> list:
        ctx = Ctx(analyze(_busy_job(2, 0.05, factor, dp=2, pp=2, steps=16), diagnose=False))
        load = {int(r): float(x) for r, x in zip(ctx.ranks, ctx.worker_loads(), strict=True)}
        return consistency(ctx, cfg, load, [], _rows(ctx, []))[1]

    assert stage_1({3: 1.2}, DiagnoseConfig()) == []
    assert stage_1({3: 1.2}, NO_GATE) != []  # without the gate the healthy replica counts as heavy
    got = stage_1({1: 1.3, 3: 1.3}, DiagnoseConfig())
    assert [c.target for c in got] == ["stage 1", "rank 1", "rank 3"] and got[0].pattern == "consistent"
    assert got[0].ratio == pytest.approx(1.3, abs=0.05)


def test_a_slow_link_says_how_consistent_it_is():
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.inject import parse_injection
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=2, pp=4, steps=6, seed=2), [parse_injection("slow-link:src=1,dst=2,delay_ms=8")])
    f = next(f for f in analyze(job).diagnosis.findings if f.cause == "comm")
    assert sorted(w["rank"] for w in f.workers) == [1, 2]
    assert f.targets and all(t.target.startswith("link 1-2 (") and t.pattern == "consistent" for t in f.targets)
    assert f.steps_slow == f.steps_total == 6


def test_a_rank_with_host_blips_does_not_ride_along():
    """Every rank's host stalls before its first compute in 30% of steps (30 ms on average, exponential),
    rank 3 also 30 ms in every step: rank 7, whose blips happened to be long, rides along on the worst
    rank's host excess without the gate; it is no more often far over the noise than the others are."""
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=4, pp=2, steps=16, seed=0))
    kinds, labels = job.codes("kind")
    rank, step = job.column("rank"), job.column("step")
    compute = np.flatnonzero(np.array(labels)[kinds] == "compute")
    first = compute[np.unique(rank[compute] * 1000 + step[compute], return_index=True)[1]]  # per (rank, step)
    rng = np.random.default_rng(0)
    gap = np.zeros(len(rank))
    gap[first] = (np.where(rng.random(len(first)) < 0.3, rng.exponential(0.03, len(first)), 0.0)
                  + np.where(rank[first] == 3, 0.03, 0.0))
    job = _retimed(job, job.column("dur_ns") * 1e-9, gap)

    def host_ranks(d) -> list[list[int]]:
        return [[w["rank"] for w in f.workers] for f in d.findings if f.cause == "launch-delay" and f.targets]

    assert host_ranks(analyze(job, config=NO_GATE).diagnosis) == [[3, 7]]
    d = analyze(job).diagnosis
    assert host_ranks(d) == [[3]]
    f = next(f for f in d.findings if f.cause == "launch-delay" and f.targets)
    assert f.targets[0].pattern == "consistent" and f.targets[0].excess_s == pytest.approx(0.03, rel=0.05)
    # against the median of its 3 stage peers (launch.peer_groups), whose blips raise it in 2 steps
    assert f.consistency_text.startswith("rank 3: slow in 14 of 16 steps, +30.0 ms of host time per step")


def test_a_link_within_the_noise_of_the_others_is_not_blamed():
    """3% of every link's transfers stall (30 ms on average, exponential): by chance link 0-1's stalls
    add up to more than twice the others', and without the gate it is blamed; against the job's noise
    it does not stand out, and the finding is the tail every link shares."""
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=2, pp=2, microbatches=8, steps=8, seed=0))
    kinds, labels = job.codes("kind")
    kind = np.array(labels)[kinds]
    p2p = (kind == "p2p_send") | (kind == "p2p_recv")
    rng = np.random.default_rng(0)
    dur = job.column("dur_ns") * 1e-9
    job = _retimed(job, dur + np.where(p2p & (rng.random(len(dur)) < 0.03), rng.exponential(0.03, len(dur)), 0.0))
    assert _workers(analyze(job, config=NO_GATE).diagnosis, "comm") == [[0, 1]]
    d = analyze(job).diagnosis
    assert _workers(d, "comm") == [[]]  # the tail every link shares: job-wide, no rank named
    assert "no link stands out" in next(f for f in d.findings if f.cause == "comm").evidence


def test_one_ranks_stall_is_not_an_overhead_every_rank_pays():
    """Two ranks, one stalling 40 ms a step on the host: the stalling rank is named, and the median
    rank's host time (left over once it is out) is no job-wide launch overhead. With the stalled rank
    in that median (half its stall), a second finding blamed every rank (real 2-rank profiler jobs)."""
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.inject import parse_injections
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

    truth = synthesize_with_truth(SynthConfig(dp=2, pp=1, microbatches=4, steps=8, seed=3),
                                  parse_injections(["host-stall:rank=1,ms=40,every=1"]))
    found = [(f.cause, [w["rank"] for w in f.workers]) for f in analyze(truth.job).diagnosis.findings]
    assert found == [("launch-delay", [1])], found


def test_evenly_spaced_steps_are_counted_as_a_direct_enumeration_counts_them():
    """``periodic_count`` against every k-subset of the steps, contiguous and with gaps (steps some
    judge skipped); ``period_of`` says a period only for 3+ steps, 2+ apart, evenly."""
    import itertools

    from laggard.diagnose.noise import period_of, periodic_count

    def enumerate_(k: int, steps: list[int]) -> int:
        return sum(1 for c in itertools.combinations(steps, k) if period_of(np.array(c)))

    for steps in (list(range(17)), list(range(3, 21)), [0, 1, 2, 4, 5, 7, 8, 9, 12, 13, 14, 15, 18, 19]):
        for k in (3, 4, 5):
            assert periodic_count(k, np.array(steps)) == enumerate_(k, steps), (steps, k)
    assert periodic_count(2, np.arange(10)) == 0 and periodic_count(4, np.arange(3)) == 0
    assert period_of(np.array([9, 19, 29, 39])) == 10 and period_of(np.array([4, 8])) == 0
    assert period_of(np.array([5, 6, 7])) == 0 and period_of(np.array([1, 3, 6])) == 0


def test_few_stalls_every_tenth_step_against_one_peer_are_transient():
    """Four 300 ms stalls in 44 steps against one peer's 44 healthy steps: at the Jeffreys rate
    (0.5 / 45) their count's tail is 0.0022, over the 0.1% gate; evenly spaced, the chance is that times
    the 301 of C(44, 4) four-step sets that are (0.2%). The same four stalls at uneven steps stay noise,
    and so does a periodic pair (two steps are always evenly spaced)."""
    cfg = DiagnoseConfig()
    peer = np.ones((1, 44))
    job = JobNoise.of(0.01, peer, cfg)
    steps = np.arange(44)
    periodic, scattered, pair = np.ones(44), np.ones(44), np.ones(44)
    periodic[[9, 19, 29, 39]] = 38.0
    scattered[[3, 19, 26, 40]] = 38.0
    pair[[9, 19]] = 38.0
    c = judge("rank 0", "host", periodic, np.where(periodic > 1, 0.3, 0.0), steps, job, cfg)
    assert c.pattern == "transient" and c.period == 10 and c.slow_steps == [9, 19, 29, 39]
    assert "(every 10 steps, 4 of 44)" in c.what and c.to_json()["period_steps"] == 10
    assert judge("rank 0", "host", scattered, np.zeros(44), steps, job, cfg).pattern == "noise"
    assert judge("rank 0", "host", pair, np.zeros(44), steps, job, cfg).pattern == "noise"
    off = DiagnoseConfig(noise_periodic=False)
    assert judge("rank 0", "host", periodic, np.zeros(44), steps, job, off).pattern == "noise"


def test_the_periodic_reading_keeps_the_false_alarm_rate():
    """Under the null (each of a healthy target's 44 steps far out independently, at the rate the
    gate is given), the share of targets called transient stays under ``noise_transient_p``, with the
    periodic reading as without it (Monte-Carlo, 40,000 targets)."""
    from laggard.diagnose import noise

    cfg = DiagnoseConfig()
    rng = np.random.default_rng(7)
    steps = np.arange(44)
    for q in (0.5 / 45, 0.03):
        far = rng.random((40_000, 44)) < q
        named = sum(noise._rare(m, steps, q, cfg) for m in far)
        assert named / len(far) < cfg.noise_transient_p, (q, named)
