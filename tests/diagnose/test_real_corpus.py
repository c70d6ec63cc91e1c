"""The diagnosis on real multi-process jobs it once got wrong (tests/data/corpus/README.md): the
injected causes are in each job's truth.json, written by the job generator, never by the analysis."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from laggard.analysis.pipeline import analyze
from laggard.diagnose.config import DiagnoseConfig
from laggard.errors import LaggardWarning
from laggard.io import load_job

CORPUS = Path(__file__).parents[1] / "data" / "corpus"


def _diagnose(job: str, config: DiagnoseConfig | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = analyze(load_job(CORPUS / job / "trace"), config=config)
    truth = json.loads((CORPUS / job / "truth.json").read_text())
    return res.diagnosis, truth


def _named(d) -> set[int]:
    return {w["rank"] for f in d.findings for w in f.workers}


@pytest.mark.parametrize("job", ["job057", "job004"])
def test_stalls_without_a_traced_collection_are_not_gc(job: str) -> None:
    d, truth = _diagnose(job)
    assert not [f for f in d.findings if f.cause == "gc"], d.findings
    targeted = {r for c in truth["causes"] for r in c["target"].get("ranks", [])}
    assert _named(d) <= targeted, (d.findings, truth["causes"])


def test_gc_rule_is_what_keeps_the_clean_job_clean() -> None:
    """The same clean job with the rule off (any collection, however short, counts; no speed-up floor): GC is named on
    healthy ranks again, so the test above can fail."""
    # (and no named-gain floor: the healthy ranks' GC findings gain under 1.02x, below min_named_gain)
    d, _ = _diagnose("job057", DiagnoseConfig(gc_traced_cover=0.0, min_gain=1.0, min_named_gain=1.0))
    assert any(f.cause == "gc" and f.workers for f in d.findings), d.findings


def test_sequence_imbalance_needs_the_lengths_to_explain_the_times() -> None:
    d, _ = _diagnose("job004")
    assert "sequence-imbalance" not in {f.cause for f in d.findings}, d.findings
    assert [w["rank"] for w in d.findings[0].workers] == [0]  # the 1.275x slow rank
    d, _ = _diagnose("job004", DiagnoseConfig(seq_min_r2=0.0))
    assert "sequence-imbalance" in {f.cause for f in d.findings}, d.findings
    d, _ = _diagnose("job018")
    assert d.findings and d.findings[0].cause == "sequence-imbalance", d.findings


def test_pure_pipeline_slow_rank_is_found_although_s_is_near_1() -> None:
    d, truth = _diagnose("job054")
    assert truth["causes"][0]["target"]["ranks"] == [0]
    assert d.verdict == "straggling" and d.note, d
    top = d.findings[0]
    assert top.cause == "stage-imbalance" and top.stages == [0] and _named(d) == {0}, d.findings
    assert top.gain >= 1.05


def test_a_pipeline_stage_slow_in_one_run_of_steps_is_named_for_those_steps() -> None:
    """Rank 1, a 4-stage blocking pipeline's one worker of stage 1, computes 1.195x slower in the first
    half of the steps only: over every step its excess is diluted to under what a heavy stage needs,
    over the run it is not. It is a worker to check in those steps, not layers to move; its fix scales
    its compute in those steps alone."""
    d, truth = _diagnose("pp_blocking_transient_4r")
    assert truth["targets"] == [1] and truth["transient"] == "first-half"
    top = d.findings[0]
    assert top.cause == "worker" and _named(d) == {1} and top.stages == [1], d.findings
    assert set(top.steps) <= set(truth["slowed_steps"]) and len(top.steps) >= 8, top.steps
    assert top.whatif and all("step=" in x for x in top.whatif if x.startswith("stage=")), top.whatif
    assert "moving them would not help" in top.fix


def test_launch_overhead_on_every_rank_is_found_although_s_is_near_1() -> None:
    d, _ = _diagnose("job017")
    assert d.verdict == "straggling", d
    assert d.findings[0].cause == "launch-delay" and not d.findings[0].workers, d.findings
    assert d.findings[0].gain > 1.3


def test_clean_pure_pipeline_stays_healthy() -> None:
    d, _ = _diagnose("job009")
    assert d.verdict == "healthy", d.findings


def test_the_slower_of_two_links_is_measured_against_the_other() -> None:
    """A dp 2 x pp 2 job run with a core per rank (c16p2_job062): link 2-3's forward transfers take
    ~71 ms, link 1-0's 0.3 ms, and rank 1 stalls 73 ms per step on the host. Against its op type's
    median over both links (halfway between them) the slow link stood at 2x, not 3x, and the job got
    only an "unexplained" finding; against the other link it is named. Its fix sets its transfers to
    the other link's (``--peer``), not to their op type's mean (35 ms, half the slow link's own): the
    stall on the other pipeline, hidden behind the half-fixed link, is then named too."""
    d, truth = _diagnose("c16p2_job062")
    link = next(c for c in truth["causes"] if c["kind"] == "slow-link")
    stall = next(c for c in truth["causes"] if c["cause"] == "host-stall")
    comm = [f for f in d.findings if f.cause == "comm"]
    assert comm and sorted(w["rank"] for w in comm[0].workers) == sorted(link["target"]["ranks"]), d.findings
    assert comm[0].whatif[0] == "--peer", comm[0].whatif
    host = [f for f in d.findings if f.cause == "launch-delay" and f.workers]
    assert host and [w["rank"] for w in host[0].workers] == stall["target"]["ranks"] == [1], d.findings
    assert "unexplained" not in {f.cause for f in d.findings}, d.findings


def test_ranks_slower_only_than_one_fast_peer_do_not_ride_along() -> None:
    """A ddp4 job run with a core per rank (c16p2_job040): rank 2 computes 1.72x (injected), and rank
    3 ran anomalously fast (the job's own CPU timers: 91 ms per step against 116-123 ms for ranks 0
    and 1). Against their fast peer, ranks 0 and 1 are 1.1-1.4x and were named beside rank 2; alone,
    their steps are within the job's noise, and only rank 2 is named. With the checks
    off (``rider_max_cells=0``, and the marginal share ``worker_marginal_max=0``), they ride along again."""
    d, truth = _diagnose("c16p2_job040")
    assert _named(d) == set(truth["causes"][0]["target"]["ranks"]) == {2}, d.findings
    d, _ = _diagnose("c16p2_job040", DiagnoseConfig(rider_max_cells=0, worker_marginal_max=0))
    assert _named(d) == {0, 1, 2}, d.findings


def test_a_low_confidence_finding_names_no_rank_within_the_noise() -> None:
    """A dp 1 x pp 4 job run with a core per rank (c16p2_job042), rank 2 computing 1.17x: no detector
    fires and the never-silent finding names the largest carrier of the residual. That was rank 3
    (the last stage), whose own effect on the step is within the job's noise; it is no longer named
    (nor its stage: one rank per stage). With the check off (``rider_max_cells=0``) its stage is
    again (a pure pipeline's low-confidence finding names the stage, not the rank)."""
    d, truth = _diagnose("c16p2_job042")
    targeted = {r for c in truth["causes"] for r in c["target"].get("ranks", [])}
    assert _named(d) <= targeted and not any(3 in f.stages for f in d.findings), d.findings
    d, _ = _diagnose("c16p2_job042", DiagnoseConfig(rider_max_cells=0))
    assert any(3 in f.stages for f in d.findings), d.findings  # (its stage: the same ops as rank 3)


def test_a_rank_named_by_its_effect_says_how_consistent_it_is() -> None:
    """A clean ddp4 job run with a core per rank (c16p2_job002) whose rank 3 nonetheless ran slow: the
    job's own CPU timers (truth.json, taken by the job, not the analysis) give it 137 ms per step
    against 95-116 ms. Its compute ratio (1.19x) stays within the noise, so only a low-confidence
    finding named it; its effect on the step stands out (1.19x against 0.01, 13 of 16 steps), and it
    is named a slow worker by that (``worker.by_impact``), saying how consistent that effect is."""
    d, truth = _diagnose("c16p2_job002")
    cpu = truth["measured"]["cpu_ms_by_rank"]
    slowest = int(max(cpu, key=cpu.get))
    f = d.findings[0]
    assert f.cause == "worker" and [w["rank"] for w in f.workers] == [slowest] == [3], d.findings
    assert f.targets and f.targets[0].pattern == "consistent" and f.targets[0].basis == "step", f.targets
    assert f.consistency_text.startswith("rank 3: slow in "), f.consistency_text


def test_a_pure_pipelines_slow_rank_under_the_heavy_ratio_is_its_stage() -> None:
    """A dp 1 x pp 3 job run with a core per rank (c16_job024), stage 0's compute x1.303 (injected):
    it computes 1.24x the other stages' median, under ``heavy_row_ratio`` (1.25), so the stage
    detector did not count it heavy, and the worker detector, which sets a slow rank to its stage
    peers, has none in a pure pipeline. The slow worker (beyond the job's noise) makes its stage heavy
    there; fixing it gains over the healthy threshold although S is 1.02. With the worker bar raised
    over its 1.24x (``worker_ratio=1.3``) the job is healthy again, so the rule is what finds it."""
    d, truth = _diagnose("c16_job024")
    assert truth["causes"][0]["target"] == {"scope": "stage", "stage": 0, "ranks": [0]}
    assert d.verdict == "straggling" and d.note, d
    top = d.findings[0]
    assert top.cause == "stage-imbalance" and top.stages == [0] and _named(d) == {0}, d.findings
    assert top.gain >= 1.05 and top.targets and top.targets[0].pattern == "consistent", top
    d, _ = _diagnose("c16_job024", DiagnoseConfig(worker_ratio=1.3))
    assert d.verdict == "healthy", d.findings


def test_slow_links_that_share_a_rank_name_that_rank() -> None:
    """A dp 1 x pp 3 job on 2 cores (c24_job008), rank 1 computing 1.40x (injected): short of CPU, it
    served its transfers late, and links 0-1 (forward) and 1-2 (backward) both stood out from the
    other links. The comm finding named ranks 0, 1 and 2; both slow links have rank 1 at one end, so
    rank 1 is the one named (its NIC or its host), and ranks 0 and 2 are not."""
    d, truth = _diagnose("c24_job008")
    comm = [f for f in d.findings if f.cause == "comm" and f.workers]
    assert comm, d.findings
    assert [w["rank"] for w in comm[0].workers] == truth["causes"][0]["target"]["ranks"] == [1]
    assert "every slow link has rank 1 at one end" in comm[0].evidence
    assert len(comm[0].whatif) >= 4  # both links' transfers are still what its what-if fixes
    assert _named(d) == {1}, d.findings


def test_a_stage_fix_only_brings_op_types_down() -> None:
    """The same draw's job024 run again on 2 cores (c64b_job024: dp 1 x pp 3, stage 0's compute
    x1.303, injected): stage 0 computes 1.23x the other stages', and its fix set each op type to the
    other stages' mean, which for the forward holds the last stage's loss: the stage's forward was
    scaled up 1.05x, and the fix gained 1.048x, under the healthy threshold; the job was called
    healthy (S = 1.05 keeps a pure pipeline's total work). A fix now leaves the op types already at or
    under the others' level alone."""
    d, truth = _diagnose("c64b_job024")
    assert truth["causes"][0]["target"] == {"scope": "stage", "stage": 0, "ranks": [0]}
    assert d.verdict == "straggling" and d.note, d
    top = d.findings[0]
    assert top.cause == "stage-imbalance" and top.stages == [0] and _named(d) == {0}, d.findings
    factors = [float(a.split(":")[-1]) for a in top.whatif if a.startswith("stage=")]
    assert factors and max(factors) < 1 and top.gain >= 1.05, (top.whatif, top.gain)


def test_a_low_confidence_finding_on_a_pure_pipeline_names_the_stage_not_a_node() -> None:
    """A clean dp 1 x pp 3 job on 2 cores (c64b_job041): the last stage computes a little more (its
    LM head; the job's own CPU timers: 117 ms per step against 112-113), S = 1.06, and no cause's
    signature fits. The never-silent finding named rank 2, a node on-call would drain; its stage is
    the same ops, and a heavier stage is what the evidence shows. It names stage 2, with no rank."""
    d, truth = _diagnose("c64b_job041")
    assert truth["clean"]
    # its stage's effect on the step (slow in 11 of 16 steps) is no rarer than the other stages' rate of
    # slow steps gives by chance (``impact_chance_p``): not named; without that test it is named as the
    # stage, never as rank 2
    f = d.findings[0]
    assert f.cause == "unexplained" and not f.stages and not f.workers and not _named(d), d.findings
    d, _ = _diagnose("c64b_job041", DiagnoseConfig(impact_chance_p=1.0))
    f = d.findings[0]
    assert f.cause == "unexplained" and f.stages == [2] and not f.workers and not _named(d), d.findings
    assert f.targets and f.targets[0].target == "stage 2" and f.consistency_text.startswith("stage 2: "), f.targets


def test_the_overhead_finding_names_no_rank_within_the_noise() -> None:
    """A real dp 1 x pp 3 job on 2 cores, traced by torch.profiler (c64c_job025p: its op table as
    laggard imports the trace): rank 0 stalls 216 ms on the host every third step, named for it. The
    job-wide finding for the small untraced gaps every rank has also named rank 1, whose gaps summed to
    twice rank 2's (7.4 ms a step), though only a few steps of its were far out: on 2 shared cores one
    rank is descheduled more than another now and then. That rank is named now only when its gaps
    stand out from the job's step-to-step noise, as every named rank."""
    d, truth = _diagnose("c64c_job025p")
    assert truth["causes"][0]["target"]["ranks"] == [0]
    host = [f for f in d.findings if f.cause == "launch-delay" and f.workers]
    assert [[w["rank"] for w in f.workers] for f in host] == [[0]], [(f.workers, f.evidence) for f in d.findings]
    assert host[0].targets[0].pattern == "transient" and _named(d) == {0}, d.findings


def test_a_three_stage_pipelines_stage_noise_is_not_read_off_a_one_stage_reference() -> None:
    """The same draw's job024 run a third time (c64c_job024: dp 1 x pp 3, stage 0's compute x1.303):
    stage 0 computes 1.27x the others' median, its one rank consistently slow (1.28x, 15 of 16 steps).
    The stage's own judgement read the noise off the other two stages' ratios, each to the one stage
    left: 0.156, over the 0.135 a ratio to the median of two has, so the 2-sigma bar stood at 1.31 and
    the job was called healthy with no finding (S = 1.01)."""
    d, truth = _diagnose("c64c_job024")
    assert truth["causes"][0]["target"] == {"scope": "stage", "stage": 0, "ranks": [0]}
    top = d.findings[0]
    assert d.verdict == "straggling" and top.cause == "stage-imbalance" and top.stages == [0], d.findings
    assert top.targets[0].target == "stage 0" and top.targets[0].pattern == "consistent", top.targets
    assert _named(d) == {0}, d.findings


def test_a_flagged_rank_within_the_noise_stays_in_the_noise() -> None:
    """A real dp 2 x pp 2 job on 2 cores, traced by torch.profiler (c24b_job006p, its imported op
    table): rank 0 stalls 109 ms on the host every step, and the other ranks' compute speeds swing with
    the contention (1.2-2x their stage peers' in some steps). Ranks 3 and 2 were flagged; rank 2 was
    only transient, and left out of the noise it made rank 3 consistent (1.47x against 0.22) and a
    slow worker beside a healthy stage peer. The flagged ranks that do not stand out are the job's
    noise: with rank 2 in it (0.25) rank 3 does not stand out either."""
    d, truth = _diagnose("c24b_job006p")
    assert truth["causes"][0]["target"]["ranks"] == [0]
    assert not [f for f in d.findings if f.cause == "worker"], [(f.workers, f.evidence) for f in d.findings]
    assert _named(d) == {0}, [(f.cause, f.workers) for f in d.findings]


def test_a_link_slow_only_in_its_tail_must_cost_the_step_to_be_named() -> None:
    """The same clean draw's job041 run once more (c64c_job041: dp 1 x pp 3 on 2 shared cores, S = 1.06):
    link 0-1's median transfer is normal (0.55 ms against 0.43 elsewhere) but 40% of its transfers end
    2-9 ms late, step after step (2.8x the other link, noise 0.69), after its ranks waited: a blocked
    rank wakes late on a busy host. The link was named, ranks 0 and 1 with it, for a fix that gains
    1.2%. A link slow only in its tail is named when its fix gains what a job must lose to be called
    straggling (``comm_tail_min_gain``); with that floor at the general one, it is named again."""
    d, truth = _diagnose("c64c_job041")
    assert truth["clean"]
    assert not _named(d) and not [f for f in d.findings if f.cause == "comm" and f.workers], d.findings
    # (the named-gain floor lowered too: the link's fix gains 1.012x, under min_named_gain)
    d, _ = _diagnose("c64c_job041", DiagnoseConfig(comm_tail_min_gain=1.01, min_named_gain=1.01))
    assert [sorted(w["rank"] for w in f.workers) for f in d.findings if f.cause == "comm" and f.workers] == [[0, 1]], \
        d.findings


def test_a_slow_rank_in_a_contended_job_is_named_by_its_effect_on_the_step() -> None:
    """The same draw's job004 run a third time (c64d_job004: ddp3 on 2 cores, rank 0 computing 1.275x,
    its own CPU timers 144 ms per step against 109-114): its traced compute is 1.26x its peers' per
    step and 1.11x per microbatch, but with three ranks on two cores every rank's speed swings with the
    others' load, and its compute ratio (1.16x, 12 of 16 steps) stayed within a noise of 0.09. Only a
    low-confidence finding named it. Its own effect on the step stands out from the other ranks'
    (1.16x, 14 of 16 steps, against 0.02): it is a slow worker, said so, with that judgement."""
    d, truth = _diagnose("c64d_job004")
    assert truth["causes"][0]["target"]["ranks"] == [0]
    workers = [f for f in d.findings if f.cause == "worker"]
    assert [[w["rank"] for w in f.workers] for f in workers] == [[0]], [(f.cause, f.workers) for f in d.findings]
    t = workers[0].targets[0]
    assert t.target == "rank 0" and t.basis == "step" and t.pattern == "consistent", t
    assert _named(d) == {0}, d.findings


def test_more_garbage_collections_do_not_make_a_slow_worker() -> None:
    """A real dp 2 x pp 2 job with GC pauses on every rank (150 ms, in 48% of forwards) and a slow link
    0 -> 1 (c64c_job047): ranks 1 and 2 happened to collect more (their CPU per step 473-483 ms against
    297-306), so their compute per step, collections included, is 1.44-1.48x their stage peers', while
    their microbatch passes are not slower (0.91x). Rank 1's effect on the step is the job's largest
    (it receives the slow link's transfers too), 3.2 sigma out. A rank is named by its effect only where
    its passes themselves are slow: no worker finding here."""
    d, truth = _diagnose("c64c_job047")
    assert {c["cause"] for c in truth["causes"]} == {"slow-link", "gc-pauses"}
    assert not [f for f in d.findings if f.cause == "worker"], [(f.cause, f.workers) for f in d.findings]
    assert any(f.cause == "gc" for f in d.findings), d.findings


def test_a_heavy_stages_replicas_share_its_excess() -> None:
    """The draw's job026 run a fourth time (c64d_job026: dp 2 x pp 2, stage 1's compute x1.316; its
    ranks' own CPU per step 1.47x stage 0's): stage 1 computes 1.23x stage 0 per step, in 16 of 16
    steps against a noise of 0.08, but each replica (1.21x) was judged against the workers' noise, a
    ratio of two single workers (0.15), and neither counted heavy: the job got only a comm finding on
    every link. Both replicas carry the stage's excess evenly (a slow worker would carry all of it
    alone): the stage is heavy. With the share required at more than each carries, it is not."""
    d, truth = _diagnose("c64d_job026")
    assert truth["causes"][0]["target"]["stage"] == 1
    top = d.findings[0]
    assert top.cause == "stage-imbalance" and top.stages == [1], [(f.cause, f.stages) for f in d.findings]
    assert _named(d) == {1, 3}, d.findings
    d, _ = _diagnose("c64d_job026", DiagnoseConfig(stage_replica_share=1.0))
    assert "stage-imbalance" not in {f.cause for f in d.findings}, [(f.cause, f.stages) for f in d.findings]


def test_lengths_that_explain_the_times_are_the_evidence_of_sequence_imbalance() -> None:
    """The draw's job037 (c64d_job037: dp 1 x pp 4 on 2 cores, sequence lengths lognormal, sigma 0.38):
    microbatch forwards vary by 41% within a step and the lengths explain them (R^2 0.63), but with 4
    processes on 2 cores the backward times move with the contention, and the rank correlation of a
    microbatch's forward and backward (0.46) stayed under the 0.6 that the imbalance was required to
    show: only a comm finding on every link. Where the lengths explain the times they are the
    evidence; with that bar above the fit, nothing is found."""
    d, truth = _diagnose("c64d_job037")
    assert truth["causes"][0]["cause"] == "seqlen-imbalance"
    assert "sequence-imbalance" in {f.cause for f in d.findings}, [(f.cause, f.evidence) for f in d.findings]
    d, _ = _diagnose("c64d_job037", DiagnoseConfig(seq_fit_alone_r2=0.99))
    assert "sequence-imbalance" not in {f.cause for f in d.findings}, [(f.cause, f.evidence) for f in d.findings]


def test_a_pure_pipelines_slow_rank_is_judged_once_against_the_noise() -> None:
    """The draw's job042 run with a core per rank, both traces (c16v4_job042: dp 1 x pp 4, rank 2
    computing 1.17x by the injection and 1.35x the other ranks' CPU by the job's own timers, a core
    per rank of the lent 16-core machine): the worker detector judged rank 2 slow, 1.29x in 14 of 16
    steps against a noise of 0.10, but its stage, the same rank, was judged again against the other
    stages' ratios to each other, whose spread the last stage's swings made 0.15; 1.29x stood under 2
    of those and only a low-confidence finding named stage 2. The stage is named now, saying how
    consistent its rank is. With the worker bar over its 1.29x (``worker_ratio=1.35``) the stage is
    left to its own judgement, which is on the edge: since garbage collections stopped counting as
    compute the other stages' spread reads 0.145, and 1.292x stands 2.01 sigma out; a bar 5% higher
    (``noise_median_k=2.1``) leaves it unnamed."""
    d, truth = _diagnose("c16v4_job042")
    assert truth["causes"][0]["target"] == {"scope": "rank", "ranks": [2]}
    top = d.findings[0]
    assert top.cause == "stage-imbalance" and top.stages == [2] and _named(d) == {2}, d.findings
    assert top.targets and top.targets[0].pattern == "consistent" and top.targets[0].basis == "compute", top.targets
    d, _ = _diagnose("c16v4_job042", DiagnoseConfig(worker_ratio=1.35, noise_median_k=2.1))
    assert "stage-imbalance" not in {f.cause for f in d.findings}, [(f.cause, f.stages) for f in d.findings]
    d, _ = _diagnose("c16v4_job042", DiagnoseConfig(noise_median_k=2.1))  # the worker path alone names it
    assert d.findings[0].cause == "stage-imbalance" and d.findings[0].stages == [2], d.findings


def test_a_slow_link_of_two_does_not_set_the_ideal() -> None:
    """The draw's job044 on 2 cores (c64d_job044: dp 1 x pp 3, each transfer 1 -> 0 delayed 13.7 ms;
    by the job's own timers 1.294x). Each transfer op type runs on two links; its median over both lay
    between them, so the slow link's ideal kept half its delay and the healthy link's ideal got the
    other half, which was more often critical: S was 0.928. With the faster link's median as the ideal
    of a two-link op type, S measures what the job's timers do (1.29), and the link is named."""
    d, truth = _diagnose("c64d_job044")
    assert truth["causes"][0]["target"]["ranks"] == [0, 1]
    res = analyze(load_job(CORPUS / "c64d_job044" / "trace"))
    assert abs(res.slowdown - truth["causes"][0]["factor"]) < 0.03, (res.slowdown, truth["causes"][0]["factor"])
    assert d.verdict == "straggling" and not d.note, (d.verdict, d.note)
    comm = [f for f in d.findings if f.cause == "comm"]
    assert comm and _named(d) == {0, 1} and comm[0].gain >= 1.2, d.findings


def test_a_pooled_ideal_slower_than_the_job_is_judged_by_the_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same job with its transfers' links unknown to the ideal (``baseline.p2p_links`` finding
    none, as for transfers whose peers no trace names): the pooled ideal spreads the slow link's time
    over the other link, which is more often critical, so S = 0.928 and the job was "cannot judge", for
    a reason (missing dependencies) that did not hold. With every dependency modelled the fixes
    themselves judge it: the slow link's gains 1.05x and is named, with a note on why S cannot show it.
    Transfers without partners stay "cannot judge" (tests/diagnose/test_verdicts.py)."""
    import importlib

    import numpy as np

    baseline = importlib.import_module("laggard.engine.baseline")
    monkeypatch.setattr(baseline, "p2p_links", lambda job, kind_code, kinds: np.full(len(kind_code), -1))
    d, truth = _diagnose("c64d_job044")
    assert d.verdict == "straggling" and "S = 0.928 cannot show" in d.note, (d.verdict, d.reason, d.note)
    comm = [f for f in d.findings if f.cause == "comm"]
    assert comm and _named(d) == {0, 1} and comm[0].gain >= 1.05, d.findings
    d, _ = _diagnose("c64d_job044", DiagnoseConfig(threshold=1.1))  # no fix gains 1.1x: cannot judge, and why
    assert d.verdict == "cannot judge" and "S = 0.928" in d.reason and "no fix replayed" in d.reason, d.reason


def test_a_link_hidden_behind_gc_is_named_once_gc_is_fixed() -> None:
    """The draw's job047 with a core per rank (c16v4_job047: dp 2 x pp 2, GC pauses of 150 ms in 48% of
    forwards on every rank and each transfer 0 -> 1 delayed 13 ms): GC explains 94% of a 6.2x slowdown,
    so the 6% left stayed under ``unexplained_floor`` and no hidden pass ran; yet with GC fixed the job
    still runs 1.3x its ideal, and the slow link is what makes it straggle there. It is named now, as a
    hidden cause held to the rest GC leaves. With the hidden pass off it is not."""
    d, truth = _diagnose("c16v4_job047")
    assert {c["cause"] for c in truth["causes"]} == {"slow-link", "gc-pauses"}
    assert d.findings[0].cause == "gc", d.findings
    comm = [f for f in d.findings if f.cause == "comm"]
    assert comm and comm[0].hidden and _named(d) == {0, 1}, [(f.cause, f.share, f.hidden) for f in d.findings]
    # its share of the measured slowdown is GC's shadow (3%); with GC fixed it is most of what is left,
    # and its fix then gains 1.16x (the job replayed with GC fixed, then with the link fixed too)
    once = comm[0].once_fixed
    assert (comm[0].share < 0.1 and once is not None and once["share"] > 0.4
            and once["gain"] > 1.1), (comm[0].share, once)
    from laggard.report.wording import qualifier

    assert f"fixing it removes {100 * once['share']:.0f}% of what is left" in qualifier(comm[0].to_json())
    assert d.findings[0].once_fixed is None and not d.findings[0].hidden
    d, _ = _diagnose("c16v4_job047", DiagnoseConfig(hidden_passes=0))
    assert "comm" not in {f.cause for f in d.findings}, [(f.cause, f.share) for f in d.findings]


def test_two_pipeline_stages_that_hide_each_other_are_judged_together() -> None:
    """The draw's job048 run with a core per rank and 32 traced steps (c16s32_job048: dp 1 x pp 4, stage
    0's compute x1.424 and rank 3 computing 1.238x): S = 1.03 keeps a pure pipeline's total work, and
    each fix alone gains under the healthy threshold (1.046x and 1.049x) because the other stage then
    sets the pace; together they gain 1.10x. Both are named, the note says why."""
    d, truth = _diagnose("c16s32_job048")
    assert sorted(c["spec"] for c in truth["causes"]) == ["heavy-stage:stage=0,factor=1.424",
                                                          "slow-worker:rank=3,factor=1.238"]
    assert d.verdict == "straggling" and "together" in d.note, (d.verdict, d.note)
    stages = sorted(s for f in d.findings if f.cause == "stage-imbalance" for s in f.stages)
    assert stages == [0, 3] and _named(d) == {0, 3}, [(f.cause, f.stages, f.share) for f in d.findings]
    assert all(f.gain < 1.05 for f in d.findings)  # none alone
    d, _ = _diagnose("c16s32_job048", DiagnoseConfig(threshold=1.15))  # together 1.10x: under this one
    assert d.verdict == "healthy", (d.verdict, d.note)


@pytest.mark.parametrize("job", ["c26gc_job028p", "c26gc_job028"])
def test_a_clean_job_has_no_job_wide_launch_or_link_finding(job: str) -> None:
    """A clean dp 2 x pp 2 job on 2 cores (c26gc_job028; ``p``: its torch.profiler trace as the op table
    laggard imports from it). In the profiler trace every rank spends 5.4% of its ideal step in the
    Python between the CPU passes (the loss, autograd's start, the optimizer), which was named a launch
    delay gaining 1.06x; and every link's transfers share the slow tail of a busy host (blocked ranks
    waking late), named in both traces for a fix gaining 1.045-1.048x, under what a job must lose to be
    called straggling. Neither is named now; the job's 1.07-1.09x still gets its low-confidence finding,
    which names no rank. Held to the old floors, both come back."""
    d, truth = _diagnose(job)
    assert truth["clean"] and d.verdict == "straggling", d
    causes = {f.cause for f in d.findings}
    assert causes == {"unexplained"} and not _named(d) and not d.findings[0].stages, d.findings
    old = DiagnoseConfig(launch_idle_share_host=0.02, comm_tail_min_gain=1.01)
    d, _ = _diagnose(job, old)
    assert {f.cause for f in d.findings} >= ({"comm", "launch-delay"} if job.endswith("p") else {"comm"}), d.findings


def test_an_injected_launch_delay_stands_above_the_profiler_floor() -> None:
    """A dp 1 x pp 3 job with a 3.96 ms launch delay before each pass, 1.25x (c27_job047p, the
    profiler trace of the held-out seed-2027 draw's job047): the smallest untraced host time of the
    injected launch delays in six corpora (14.8% of the ideal step on the median rank) is still a
    job-wide launch-delay finding over the CPU passes' floor (10%), naming no rank."""
    d, truth = _diagnose("c27_job047p")
    assert [c["spec"] for c in truth["causes"]] == ["launch-delay:ms=3.96"]
    ld = [f for f in d.findings if f.cause == "launch-delay"]
    assert ld and not ld[0].workers and ld[0].gain > 1.2 and not _named(d), d.findings
    d, _ = _diagnose("c27_job047p", DiagnoseConfig(launch_idle_share_host=0.16))
    assert "launch-delay" not in {f.cause for f in d.findings}, d.findings


def test_the_low_confidence_finding_names_no_rank_whose_fix_gains_nothing() -> None:
    """A clean 4-rank DDP job on 2 cores (c64v3_job058p, profiler trace): S = 1.09 from a busy host's
    noise and no cause's signature fits. Rank 0, consistently a little slower, carried the most of the
    residual and was named, for a fix gaining 0.7%, under what any finding must gain (``min_gain``).
    The finding now names the op type that carries the most, and no rank."""
    d, truth = _diagnose("c64v3_job058p")
    assert truth["clean"] and d.verdict == "straggling"
    f = d.findings[0]
    assert f.cause == "unexplained" and not f.workers and not f.stages and "op type" in f.evidence, d.findings
    # (the noise gate's chance test and the named-gain floor off too: either alone keeps rank 0 out now)
    d, _ = _diagnose("c64v3_job058p", DiagnoseConfig(min_gain=1.0, fallback_rank_gain=1.0, min_named_gain=1.0,
                                                     impact_chance_p=1.0))
    assert _named(d) == {0}, d.findings


def test_the_low_confidence_finding_names_a_rank_only_for_a_straggling_gain() -> None:
    """A clean 2-rank DDP job on 2 shared cores (c28_job052, Tracer trace of the seed-2028 draw's
    job052): S = 1.068, no cause's signature fits, and rank 1, 5% slower by its own CPU timers in 12 of
    16 steps (1.06x +- 0.04 against a noise of +- 0.02 measured on the one other rank), was named for a
    fix gaining 1.033x. A rank named is a node drained; one whose fix gains under the healthy threshold
    (``fallback_rank_gain``) cannot alone make a job straggle: the finding names the op type."""
    d, truth = _diagnose("c28_job052")
    assert truth["clean"] and d.verdict == "straggling"
    f = d.findings[0]
    assert f.cause == "unexplained" and f.confidence == "low" and 1.01 <= f.gain < 1.05, d.findings
    assert not _named(d) and "op type" in f.evidence, d.findings
    d, _ = _diagnose("c28_job052", DiagnoseConfig(fallback_rank_gain=1.01))
    assert _named(d) == {1}, d.findings


def test_slow_links_that_reach_every_rank_name_none() -> None:
    """A dp 1 x pp 4 job on 2 cores with a 1.23x heavy stage 2 (c27_job055p, the held-out seed-2027
    draw's job055, its profiler trace as an op table): its neighbours' receives and the world
    all-reduce waiting on it made five transfer keys stand out, and the comm finding named all four
    ranks, three of them healthy. Slow keys that reach every rank are no one link's or host's fault:
    the finding is job-wide and names none (it named [0, 1, 2, 3] before: watched at eda0a02)."""
    d, truth = _diagnose("c27_job055p")
    assert [c["spec"] for c in truth["causes"]] == ["heavy-stage:stage=2,factor=1.232"]
    comm = [f for f in d.findings if f.cause == "comm"]
    assert comm and not comm[0].workers, d.findings
    assert comm[0].evidence.startswith("slow transfers on ") and "links reach all 4 ranks: median" in comm[0].evidence
    assert "same slow tail" not in comm[0].evidence, comm[0].evidence
    assert not _named(d), d.findings


@pytest.mark.parametrize(("job", "stalled", "victims"), [("c29_job017", 1, {3}), ("c29_job032", 0, {1, 2, 3})])
def test_peers_of_a_stalled_rank_on_a_shared_cpu_host_are_not_slow_workers(
        job: str, stalled: int, victims: set[int]) -> None:
    """Two real jobs of the held-out seed-2029 draw on 2 shared cores (Tracer traces): a host stall on
    one rank (108 ms a step on rank 1 of a dp 2 x pp 2 job beside a slow link; 185 ms on rank 0 of a
    ddp4 job beside a launch delay). Their stage peers computed 1.18-1.32x the stalled rank's, by
    their own CPU timers 1.02-1.09x: the busy loop takes a core they compute on, and the stalled rank
    computes while they wait for it. Judged against it they read as slow workers; with the stalled
    rank left out of their yardstick (``worker.yardsticks``) the stall is named, no peer of it."""
    d, truth = _diagnose(job)
    assert {c["target"]["ranks"][0] for c in truth["causes"] if c["cause"] == "host-stall"} == {stalled}
    assert not victims & {r for c in truth["causes"] for r in c["target"].get("ranks", [])}
    assert any(f.cause == "launch-delay" and [w["rank"] for w in f.workers] == [stalled] for f in d.findings)
    assert not victims & _named(d), d.findings
    d, _ = _diagnose(job, DiagnoseConfig(worker_stalled_yardstick=True))  # the rule off: named again
    assert victims <= _named(d), d.findings


def test_a_launch_delay_on_every_rank_names_no_rank_for_the_last_stages_glue() -> None:
    """A real dp 1 x pp 3 job with a 4.75 ms launch delay before every pass on every rank (c29_job046p,
    its profiler trace as an op table): the last stage's untraced host time, 53.5 ms a step against
    36.9 ms (the loss's Python glue between passes), was named as its own. Beside an overhead every
    rank pays a rank is named only at ``launch_rank_ratio`` x its peers' or an overhead's share of the
    step over them; a 93.8 ms stall beside a 9.61 ms launch delay (c29_job024p, 1.98x its peers',
    +20% of the step) still is."""
    d, truth = _diagnose("c29_job046p")
    assert [c["spec"] for c in truth["causes"]] == ["launch-delay:ms=4.75"]
    assert [f.cause for f in d.findings] == ["launch-delay"] and not _named(d), d.findings
    d, _ = _diagnose("c29_job046p", DiagnoseConfig(launch_rank_ratio=1.0))  # any excess: named again
    assert 2 in _named(d), d.findings
    d, truth = _diagnose("c29_job024p")
    assert {c["cause"] for c in truth["causes"]} == {"host-stall", "launch-delay"}
    assert _named(d) == {2} and any(f.cause == "launch-delay" and not f.workers for f in d.findings), d.findings


def test_the_gaps_before_recorded_collections_name_no_rank_for_a_launch_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real dp 1 x pp 4 job with GC pauses on every rank and a 1.79x slow rank 1 (c29_job057p, its
    profiler trace as an op table): rank 2's untraced gaps, 62 ms a step against 19-29 ms, named it for
    a launch delay; 49 ms of them lie right before its 26 recorded collections (the pause's own start).
    Told apart by the gaps outside collections (9-13 ms on every rank), no rank is named for it."""
    import importlib

    d, truth = _diagnose("c29_job057p")
    assert {c["cause"] for c in truth["causes"]} == {"gc-pauses", "slow-worker"}
    assert not [f for f in d.findings if f.cause == "launch-delay" and f.workers], d.findings
    assert any(f.cause == "gc" for f in d.findings) and 1 in _named(d), d.findings
    launch = importlib.import_module("laggard.diagnose.launch")
    monkeypatch.setattr(launch, "_outside_gc", lambda ctx, gaps: gaps)  # the rule off: rank 2 again
    d, _ = _diagnose("c29_job057p")
    assert any(f.cause == "launch-delay" and [w["rank"] for w in f.workers] == [2] for f in d.findings), d.findings


def test_a_profiled_rank_that_drew_longer_sequences_is_not_a_slow_worker() -> None:
    """A real ddp2 job, sequence lengths lognormal (sigma 0.44), nothing else injected (c29_job056p,
    its profiler trace as an op table): rank 1 drew the longer sequences (206 ms of CPU a step against
    156 ms, by the job's own timers) and was named a slow worker, since a profiler trace records no
    sequence lengths. Read from its attention calls' recorded shapes (laggard.io.kineto.sequences), its
    passes cost what their sequences predict: sequence imbalance, no rank. With the lengths dropped
    from the op table, rank 1 is named again."""
    import dataclasses

    import pyarrow as pa

    d, truth = _diagnose("c29_job056p")
    assert [c["spec"] for c in truth["causes"]] == ["seqlen-imbalance:sigma=0.44"]
    assert [f.cause for f in d.findings] == ["sequence-imbalance"] and not _named(d), d.findings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        job = load_job(CORPUS / "c29_job056p" / "trace")
    i = job.table.schema.get_field_index("seq_lens")
    blind = job.table.set_column(i, "seq_lens", pa.nulls(job.table.num_rows, job.table.schema.field(i).type))
    d = analyze(dataclasses.replace(job, table=blind)).diagnosis
    assert _named(d) == {1}, d.findings



def test_a_stage_slow_in_its_input_waits_is_slow_loading_its_input() -> None:
    """A real pure 4-stage pipeline over blocking send/recv (``laggard run``'s zero-code trace) whose last
    stage's DataLoader takes 27.1 ms longer per batch (gz60_pp_blocking_05_data, the tuning half of
    benchmarks/generalize.py): the stage sets the pace, and 97% of its excess over the other stages lies
    in its waits for input. Named a heavy stage, its fix said to move layers; the same rule as a slow
    worker's (``worker.data_bound``: over ``data_share`` of the excess in input waits) names its input
    pipeline. Its clean twin names no rank."""
    d, truth = _diagnose("gz60_pp_blocking_05_data")
    assert truth["kind"] == "data" and truth["targets"] == [3]
    assert d.findings and d.findings[0].cause == "data-loading" and d.findings[0].stages == [3], d.findings
    assert _named(d) == {3}, d.findings
    d, _ = _diagnose("gz60_pp_blocking_05_data", DiagnoseConfig(data_share=1.0))  # the rule off: a heavy stage
    assert d.findings[0].cause == "stage-imbalance", d.findings
    d, truth = _diagnose("gz60_pp_blocking_05_clean")
    assert truth["kind"] == "none" and not _named(d), d.findings


def test_input_waits_are_weighed_against_net_excess_per_op_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real tp 2 x dp 2 job (``laggard run``, gz6065_tp_dp_02_data, the evaluation half of
    benchmarks/generalize.py): rank 3's DataLoader is 10.1 ms slower per batch, its compute is its
    peers'. Each step's forward and backward run as two long spans and a short one of the same op
    type, so op by op every long span is over the type's mean and every short one under it; counted
    op by op those differences (which cancel) were most of rank 3's "excess" and it read as a slow
    worker. Netted per op type, its excess lies in its input waits: its input pipeline is named."""
    import importlib

    d, truth = _diagnose("gz6065_tp_dp_02_data")
    assert truth["kind"] == "data" and truth["targets"] == [3]
    assert d.findings and d.findings[0].cause == "data-loading", d.findings
    assert [w["rank"] for w in d.findings[0].workers] == [3] and _named(d) == {3}, d.findings

    worker = importlib.import_module("laggard.diagnose.worker")

    def op_by_op(ctx, mine, ref):  # noqa: ANN001, ANN202 - the statistic this rule replaced
        data = mine & ctx.kind_is("other")
        excess = float(np.nan_to_num(ctx.w[mine] - ref[mine]).clip(0).sum())
        return float(np.nan_to_num(ctx.w[data] - ref[data]).clip(0).sum()) / excess, 1.0

    monkeypatch.setattr(worker, "data_bound", op_by_op)
    d, _ = _diagnose("gz6065_tp_dp_02_data")
    assert d.findings[0].cause == "worker", d.findings


def test_a_low_confidence_finding_names_no_stage_whose_replicas_are_not_all_slow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real dp 2 x pp 2 job over torch.profiler (gz6064_pp_async_profiler_02_transient, the evaluation
    half of benchmarks/generalize.py): rank 1 (stage 1) computes 1.12x from step 6 on, its DP replica
    rank 3 is healthy. No detector fires; the low-confidence finding named stage 1, i.e. ranks 1 and 3,
    although rank 3's own effect on the step is within the noise. A stage some of whose replicas are
    noise is not named: the finding names no healthy rank."""
    import importlib

    d, truth = _diagnose("gz6064_pp_async_profiler_02_transient")
    assert truth["kind"] == "transient" and truth["targets"] == [1] and truth["stage_ranks"]["1"] == [1, 3]
    assert d.findings and 3 not in _named(d) and all(1 not in f.stages or f.workers for f in d.findings), d.findings
    monkeypatch.setattr(importlib.import_module("laggard.diagnose.fallback"), "_uneven_stage",
                        lambda *a, **k: False)  # the rule off: the whole stage is named
    d, _ = _diagnose("gz6064_pp_async_profiler_02_transient")
    assert d.findings[0].cause == "unexplained" and d.findings[0].stages == [1] and not d.findings[0].workers


def test_a_loader_whose_workers_hand_over_batches_together_is_a_slow_input_pipeline() -> None:
    """A real 2-rank DDP job under ``laggard run`` (zc_loader_w2_data): rank 1's DataLoader, two workers,
    cannot keep up, so it waits ~38 ms every other step and ~1 ms between. Step by step that is a burst
    pattern; over windows of two steps it is a steady excess (``worker.by_window``), and its waits for
    input are the excess: a slow input pipeline on rank 1, and nothing else named. Its clean twin names
    no rank. With the window rule off, only the low-confidence finding named rank 1."""
    d, truth = _diagnose("zc_loader_w2_data")
    assert truth["kind"] == "data" and truth["targets"] == [1]
    first = d.findings[0]
    assert first.cause == "data-loading" and [w["rank"] for w in first.workers] == [1], d.findings
    assert _named(d) == {1} and first.targets[0].window_steps == 2, first.targets
    assert "windows of 2 steps" in first.targets[0].text
    d, truth = _diagnose("zc_loader_w2_clean")
    assert truth["targets"] == [] and not _named(d), d.findings
    d, _ = _diagnose("zc_loader_w2_data", DiagnoseConfig(worker_window_steps=()))
    assert d.findings[0].cause == "unexplained", d.findings


def test_the_median_rank_of_two_is_a_rank_not_their_mean() -> None:
    """A real 2-rank DDP job (zc_ckpt_stall_2r): rank 0 stalls 300 ms after every 10th step (28.2 ms per
    step on average), rank 1 has 0.7 ms per step of untraced host time. Read by the count of far steps
    alone (``noise_periodic`` off), four stalls against one peer's 44 steps stay within the host-time
    rule's false-alarm rate, so no rank is named; the job-wide finding must then quote what the median
    rank pays, which with two ranks is the lower one's, not 14.4 ms, the mean, which neither rank paid."""
    d, truth = _diagnose("zc_ckpt_stall_2r", DiagnoseConfig(noise_periodic=False))
    assert truth["targets"] == [0]
    overhead = [f for f in d.findings if f.cause == "launch-delay" and not f.workers]
    assert overhead, d.findings  # (for the untraced host time both ranks have)
    for f in overhead:
        ms = float(f.evidence.split(" ms per step of host time on the median rank")[0].rsplit(" ", 1)[-1])
        assert ms < 2.0, f.evidence
    assert not _named(d) - {0}, d.findings


def test_a_stall_every_tenth_step_against_one_peer_is_named() -> None:
    """The same job read as shipped: its four stalls fall every 10 steps, which four of 44 steps drawn at
    random do in 0.2% of draws, so the stall is rank 0's host time (a checkpoint every 10 steps), said
    with its period, and no job-wide overhead takes its gain."""
    d, truth = _diagnose("zc_ckpt_stall_2r")
    first = d.findings[0]
    assert first.cause == "launch-delay" and [w["rank"] for w in first.workers] == truth["targets"], d.findings
    c = first.targets[0]
    assert c.pattern == "transient" and c.period == 10 and len(c.slow_steps) == len(truth["slowed_steps"]), c
    assert "every 10 steps, 4 of 44" in c.what and "every 10 steps" in first.fix
    assert not _named(d) - {0}, d.findings
    assert not [f for f in d.findings if f.cause == "launch-delay" and not f.workers], d.findings


@pytest.mark.parametrize("job", ["ho_hf_log_every8_2r", "ho_manual_dump_every8_2r", "ho_pl_clean_2r"])
def test_held_out_stalls_every_eighth_step_are_named_and_the_clean_job_is_not(job: str) -> None:
    """Held-out 2-rank jobs (an HF Trainer callback's slow log every 8 steps, a hand-averaged loop's
    metrics dump every 8 steps, a clean Lightning job), drawn after the periodic reading was fixed:
    the stalled rank is named for its host time with the period its truth gives, nothing else is
    named, and the clean job names no rank."""
    d, truth = _diagnose(job)
    if not truth["targets"]:
        assert not _named(d), d.findings
        return
    first = d.findings[0]
    assert first.cause == "launch-delay" and [w["rank"] for w in first.workers] == truth["targets"], d.findings
    assert first.targets[0].period == truth["every"], first.targets[0]
    assert _named(d) == set(truth["targets"]), d.findings


def test_an_evaluation_only_rank_0_runs_is_named_although_s_cannot_show_it() -> None:
    """A real 2-rank DDP job (zc_rank0_eval_2r): every 10 steps rank 0 alone evaluates 8 batches through
    the DDP model (no-grad forwards its peer never runs) and rank 1 waits at the next all-reduce. Those
    ops are at their own mean, so S reads 1.04 and the job was "healthy"; the extra ops are a count its
    peer does not have, and their fix, replayed, gains over the healthy threshold. With the detector
    left out the job reads healthy again, so the test can fail."""
    d, truth = _diagnose("zc_rank0_eval_2r")
    first = d.findings[0]
    assert first.cause == "extra-work" and [w["rank"] for w in first.workers] == truth["targets"], d.findings
    assert first.targets[0].period == truth["every"] and first.gain > 1.2, first
    assert "no-grad-forward" in first.evidence and _named(d) == {0}, d.findings
    from unittest import mock

    from laggard.diagnose import extra

    with mock.patch.object(extra, "detect", lambda ctx, cfg: []):
        d, _ = _diagnose("zc_rank0_eval_2r")
    assert d.verdict == "healthy", d


HELD_OUT_EXTRA = ["ho_uneven_val_4r", "ho_pl_sample_every10_2r", "ho_ema_metric_2r", "ho_uneven_val_slow_2r",
                  "ho_pl_sample_all_2r"]


@pytest.mark.parametrize("job", HELD_OUT_EXTRA)
def test_held_out_work_one_rank_does_alone_is_named_and_its_twins_are_not(job: str) -> None:
    """Held-out jobs drawn after the extra-work rule was written from zc_rank0_eval_2r alone (programs
    it never saw: a validation set split unevenly, a Lightning callback's sample outputs on one rank,
    an EMA model's metric on one rank): the rank is named for work its peers do not do, with the
    period its truth gives; a rank slowed as a whole (as many ops, each longer) is a slow worker and no
    extra work; with the evaluation on every rank alike no rank is named."""
    d, truth = _diagnose(job)
    extra_named = {w["rank"] for f in d.findings if f.cause == "extra-work" for w in f.workers}
    if truth["kind"] == "clean":
        assert not _named(d), d.findings
    elif truth["kind"] == "worker":
        assert not extra_named and _named(d) == set(truth["targets"]), d.findings
        assert d.findings[0].cause == "worker", d.findings
    else:
        first = d.findings[0]
        assert first.cause == "extra-work" and [w["rank"] for w in first.workers] == truth["targets"], d.findings
        assert first.targets[0].period == truth["every"], first.targets[0]
        assert _named(d) == set(truth["targets"]), d.findings


def test_a_pipeline_stage_is_no_peer_of_another_for_extra_work() -> None:
    """A real 2-stage pipeline (zc_pipeline_slow_stage_2r, stage 1's forward 10 ms longer a
    microbatch): stage 1's forward is cut where it receives, so it runs more forward ops than stage 0
    by design. Compared with the other stage it read as work rank 1 does alone; each rank is alone in
    its stage, so nobody is its peer, and the slow stage is the finding."""
    d, truth = _diagnose("zc_pipeline_slow_stage_2r")
    assert not [f for f in d.findings if f.cause == "extra-work"], d.findings
    first = d.findings[0]
    assert first.cause == "stage-imbalance" and first.stages == [truth["stage"]], d.findings


def test_fixes_that_take_the_step_below_the_ideal_are_no_interaction() -> None:
    """c24_job008 (dp 1 x pp 3, rank 1 computing 1.40x): its two findings' fixes together remove 2.8x
    the slowdown S measures (they take the step below the all-ideal one: each op type's ideal is its
    mean over every rank, the slow ops included). Each finding's score is capped at the whole slowdown,
    so that surplus read as +138% of interaction between the causes; on the share scale it is none,
    and the report says where the rest went."""
    import io

    from rich.console import Console

    from laggard.report.findings import print_findings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = analyze(load_job(CORPUS / "c24_job008" / "trace"))
    d = res.diagnosis
    assert len(d.findings) > 1 and d.combined_share > 1.5, (d.combined_share, d.findings)
    assert d.interaction == pytest.approx(1.0 - sum(f.score for f in d.findings)) and d.interaction <= 0
    con = Console(width=200, record=True, file=io.StringIO())
    print_findings(res, con)
    assert "together they take the step below the all-ideal one" in con.export_text()
