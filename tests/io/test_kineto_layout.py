"""Pipeline layouts in PyTorch-profiler traces: a real dp 2 x pp 2 gloo job (the demo job,
heavy last stage injected) traced by torch.profiler and by laggard's own tracer in the same run;
ProfilerStep numbers offset between ranks; send/recv without peers; bad layouts and rank maps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laggard.demo.launch import JobConfig, run_job
from laggard.errors import LaggardError
from laggard.groundtruth.inject import parse_injections
from tests.conftest import run_cli

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def job_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pp-profiler")
    cfg = JobConfig.quick(steps=6, injections=parse_injections(["heavy-last-stage:factor=4"]),
                          trace_dir=str(base / "trace"), profiler_dir=str(base / "prof"))
    res = run_job(cfg)
    assert res.ok, res.failures
    return {"trace": base / "trace", "prof": base / "prof", "base": base}


def _analyze(path, **kw):  # noqa: ANN003
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    job = load_job(path, **kw)
    return job, analyze(job)


def _rewrite(src: Path, dst: Path, fn) -> None:  # noqa: ANN001
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("rank*.json")):
        d = json.loads(f.read_text())
        fn(int(f.stem.removeprefix("rank")), d)
        (dst / f.name).write_text(json.dumps(d))


def test_profiler_trace_gives_the_pipeline_and_the_tracers_stage_attribution(job_dirs: dict[str, Path]) -> None:
    job, a = _analyze(job_dirs["prof"])
    lay = job.meta.extra["layout"]
    assert (job.meta.dp_size, job.meta.pp_size) == (2, 2)
    assert lay["how"].startswith("from point-to-point transfers")
    assert lay["ranks"] == {"0": [0, 0, 0], "1": [0, 1, 0], "2": [1, 0, 0], "3": [1, 1, 0]}  # rank = dp * 2 + stage
    assert sorted(a.by_stage) == [0, 1]
    top = a.diagnosis.findings[0]
    assert top.cause == "stage-imbalance" and top.stages == [1]
    # the same job as laggard's own tracer saw it (an independent record of the same run)
    _, t = _analyze(job_dirs["trace"])
    assert max(t.by_stage, key=t.by_stage.get) == 1
    # within 5%: the profiler's per-op overhead and its untraced gaps weigh a few percent more on the
    # heavy stage
    assert a.by_stage[1] == pytest.approx(t.by_stage[1], rel=0.05)
    # the job's S reads higher from the profiler: its own cost per op lands inside the ops it times, most
    # on the heavy stage's, and grows when the host is busy (the profiler's S over the tracer's: 1.00-1.02
    # alone, 1.01-1.04 beside two busy loops, 1.05 in the suite); lower by more than noise is a mismatch
    assert 0.95 <= a.slowdown / t.slowdown <= 1.10, (a.slowdown, t.slowdown)
    # each stage runs one forward and one backward per microbatch: cut where the phase changes,
    # the profiler's segments are those units of work on every stage
    # (a descheduled glue piece read as one more on a busy host: test_a_descheduled_glue_piece...)
    _assert_passes(job)
    assert a.to_json()["meta"]["layout"]["pp"] == 2


def _assert_passes(job) -> None:  # noqa: ANN001
    """One forward and one backward per microbatch on each stage (4 microbatches, 6 steps, 2 DP
    ranks), each with its microbatch number."""
    tab = job.table.to_pandas()
    comp = tab[(tab["kind"] == "compute") & tab["name"].isin(["cpu-forward", "cpu-backward"])]
    n = comp.groupby(["pp_rank", "name"]).size().unstack()
    assert (n["cpu-forward"] == 4 * 6 * 2).all() and (n["cpu-backward"] == 4 * 6 * 2).all(), n
    assert (comp["microbatch"] >= 0).all()


def test_a_descheduled_glue_piece_is_not_a_pass(job_dirs: dict[str, Path]) -> None:
    """The receive buffer's allocation (one ``aten::empty``, ~0.01 ms) before a receive that waits,
    descheduled for 3.6 ms on each last-stage rank (the whole process held), as a busy 2-core host
    did (8 of 48 real runs beside four busy loops): over 2% of a pass, it read as a forward of its
    own (49 on a stage for 48 microbatches) and the step's microbatch numbers were dropped. One op
    among passes of 14-56."""
    def deschedule(rank: int, d: dict) -> None:
        if rank % 2 == 0:
            return
        ev = [e for e in d["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
        tid = next(e["tid"] for e in ev if e["name"].startswith("ProfilerStep#"))
        mine = sorted((e for e in ev if e["tid"] == tid and not e["name"].startswith("ProfilerStep#")),
                      key=lambda e: e["ts"])
        top, end = [], -1.0
        for e in mine:
            if e["ts"] >= end:
                top.append(e)
                end = e["ts"] + e["dur"]
        glue = [a for a, b in zip(top, top[1:], strict=False)
                if a["name"] == "aten::empty" and b["name"] == "c10d::recv_"]
        t = glue[len(glue) // 2]["ts"]
        for e in d["traceEvents"]:  # the whole process held 3.6 ms from the allocation's start
            if "ts" not in e:
                continue
            if e["ts"] > t:
                e["ts"] += 3600.0
            elif e["ts"] + e.get("dur", 0.0) > t:
                e["dur"] += 3600.0

    out = job_dirs["base"] / "descheduled"
    _rewrite(job_dirs["prof"], out, deschedule)
    job, _ = _analyze(out)
    _assert_passes(job)


def test_cli_prints_the_layout_and_how(job_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli("analyze", str(job_dirs["prof"]))
    out = capsys.readouterr().out
    assert code == 0
    assert "layout: dp 2 x pp 2 (from point-to-point transfers: pipelines [0, 1], [2, 3])" in " ".join(out.split())


def test_profiler_step_numbers_offset_between_ranks(job_dirs: dict[str, Path]) -> None:
    def earlier(rank: int, d: dict) -> None:  # ranks 1 and 3 started their profilers 5 steps earlier
        if rank in (1, 3):
            for e in d["traceEvents"]:
                if str(e.get("name", "")).startswith("ProfilerStep#"):
                    e["name"] = "ProfilerStep#" + str(int(e["name"].split("#")[1]) + 5)

    out = job_dirs["base"] / "offset"
    _rewrite(job_dirs["prof"], out, earlier)
    job, a = _analyze(out)
    assert any("renumbered rank 1 by -5" in w and "rank 3 by -5" in w for w in job.warnings)
    assert len(a.steps) == 6 and job.meta.pp_size == 2
    assert a.diagnosis.findings[0].cause == "stage-imbalance"


def _no_peers(rank: int, d: dict) -> None:
    for e in d["traceEvents"]:
        if str(e.get("name", "")).startswith(("c10d::send", "c10d::recv")):
            e.get("args", {}).pop("Concrete Inputs", None)


def test_send_recv_without_peers(job_dirs: dict[str, Path]) -> None:
    out = job_dirs["base"] / "no-peers"
    _rewrite(job_dirs["prof"], out, _no_peers)
    job, a = _analyze(out)
    lay = job.meta.extra["layout"]
    assert lay["how"].startswith("from per-stage process groups") and lay["ranks"]["3"] == [1, 1, 0]
    kinds = job.table.column("kind").to_pylist()
    assert kinds.count("p2p_send") == kinds.count("p2p_recv") > 0  # matched along the stages
    assert job.meta.extra["p2p"]["unmatched"] == 0 and lay["source"] == "stage-groups"
    assert a.diagnosis.findings[0].cause == "stage-imbalance" and a.diagnosis.findings[0].stages == [1]


def test_send_recv_without_peers_or_groups(job_dirs: dict[str, Path]) -> None:
    """Neither peer ranks nor per-stage groups: the transfers are matched across ranks by order,
    counts and timing (``tests/io/test_kineto_p2p.py``), and the matched pairs are the pipelines
    (unmatched, this job would read as dp 4 with a warning)."""
    def no_groups(rank: int, d: dict) -> None:
        _no_peers(rank, d)
        d["distributedInfo"]["pg_config"] = d["distributedInfo"]["pg_config"][:1]  # the world group only

    out = job_dirs["base"] / "no-groups"
    _rewrite(job_dirs["prof"], out, no_groups)
    job, a = _analyze(out)
    lay = job.meta.extra["layout"]
    assert (job.meta.dp_size, job.meta.pp_size) == (2, 2) and lay["source"] == "p2p-matched"
    assert lay["ranks"] == {"0": [0, 0, 0], "1": [0, 1, 0], "2": [1, 0, 0], "3": [1, 1, 0]}
    st = job.meta.extra["p2p"]
    assert st["matched"] == st["ops"] == st["peers_inferred"] > 0 and st["unmatched"] == 0
    assert not [w for w in job.warnings if "cannot infer" in w or "point-to-point" in w]
    assert a.diagnosis.findings[0].cause == "stage-imbalance" and a.diagnosis.findings[0].stages == [1]
    # the layout given by hand: the transfers are matched along it
    job, a = _analyze(out, layout="dp=2,pp=2")
    assert job.meta.pp_size == 2 and job.meta.extra["layout"]["how"] == "from --layout dp=2,pp=2"
    assert job.meta.extra["p2p"]["matched"] == st["ops"]


def test_rank_map(job_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "map.yaml"
    good.write_text("ranks:\n  0: {dp: 0, pp: 0}\n  1: {dp: 0, pp: 1}\n  2: {dp: 1, pp: 0}\n  3: {dp: 1, pp: 1}\n")
    job, _ = _analyze(job_dirs["prof"], rank_map=good)
    assert job.meta.pp_size == 2 and job.meta.extra["layout"]["how"] == "from rank map map.yaml"
    bad = tmp_path / "bad.json"  # ranks 0 and 1 exchange activations, so they cannot share a stage
    bad.write_text(json.dumps({"0": {"dp": 0, "pp": 0}, "1": {"dp": 1, "pp": 0}, "2": {"dp": 0, "pp": 1},
                               "3": {"dp": 1, "pp": 1}}))
    assert run_cli("analyze", str(job_dirs["prof"]), "--rank-map", str(bad)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("laggard: error: ") and "contradicts the trace: rank 0 sends to rank 1" in err[-1]


@pytest.mark.parametrize(("args", "words"), [
    (["--layout", "dp=2,pp=3"], "2 x 3 = 6 ranks, but the traces hold 4"),
    (["--layout", "pp=2,dp=2"], "contradicts the trace"),
    (["--layout", "dp=2,xx=2"], "expected dp=D,pp=P[,tp=T]"),
])
def test_bad_layouts(job_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str], args: list[str],
                     words: str) -> None:
    assert run_cli("analyze", str(job_dirs["prof"]), *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("laggard: error: ") and words in err[-1], err


def test_process_groups_that_overlap_inconsistently(job_dirs: dict[str, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    def clash(rank: int, d: dict) -> None:  # rank 3 says group "1" holds ranks [0, 3]; rank 0 says [0, 2]
        _no_peers(rank, d)
        if rank == 3:
            d["distributedInfo"]["pg_config"].append({"pg_name": "1", "pg_desc": "undefined", "pg_size": 2,
                                                      "ranks": [0, 3]})

    out = job_dirs["base"] / "clash"
    _rewrite(job_dirs["prof"], out, clash)
    assert run_cli("analyze", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("laggard: error: process groups overlap inconsistently: group '1'")
    with pytest.raises(LaggardError, match="overlap inconsistently"):
        _analyze(out)


def test_layout_is_only_for_profiler_traces(nd_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("analyze", str(nd_dir / "trace-AR.parquet"), "--layout", "dp=2,pp=2") == 2
    assert "--layout is for PyTorch-profiler traces" in capsys.readouterr().err
