"""Zero-code capture on real gloo ranks: DDP's gradient all-reduce, FSDP2's collectives, the program's
own calls (each once, also when the tracer wraps them), phases and steps from hooks, the training
math unchanged, and the slowed rank found by the analysis of what was captured.

The ranks run tests/autotrace_job.py (tests/autotrace_phase_jobs.py for the optimizer-nesting and
no-grad forward cases) through ``python -m laggard.tracer.auto.boot`` (the script never imports
laggard) with the environment torchrun would give them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laggard.collectives.launch import free_port
from tests.rank_procs import finish_ranks, first_failure

torch = pytest.importorskip("torch")

JOB = Path(__file__).resolve().parents[1] / "autotrace_job.py"
PHASE_JOB = JOB.with_name("autotrace_phase_jobs.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def run_workers(mode: str, world: int, tmp: Path, *, boot: bool = True, timeout: float = 240, job: Path = JOB,
                **env: str) -> list[subprocess.CompletedProcess]:
    port = free_port()
    procs = []
    for rank in range(world):
        e = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
             "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SRC), **env}
        cmd = [sys.executable, "-m", "laggard.tracer.auto.boot", str(job), mode] if boot else \
            [sys.executable, str(job), mode]
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return finish_ranks(procs, timeout)


def ops(trace: Path):
    files = sorted(trace.glob("ops-rank*.parquet"))
    assert files, f"no shards in {trace}"
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()


def _ok(results: list[subprocess.CompletedProcess]) -> None:
    bad = first_failure(results)
    assert bad is None, bad


@pytest.fixture(scope="module")
def ddp_trace(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ddp")
    _ok(run_workers("ddp", 2, tmp, LAGGARD_TRACE_DIR=str(tmp / "trace"), SLOW_RANK="1", SLOW_MS="30", STEPS="12"))
    return tmp / "trace"


def test_ddp_gradient_all_reduce_is_captured_and_matched(ddp_trace: Path) -> None:
    rows = ops(ddp_trace)
    meta = json.loads((ddp_trace / "job.json").read_text())
    assert meta["world_size"] == 2 and meta["extra"]["capture"] == "autotrace"
    steps = {r["step"] for r in rows}
    assert steps == set(range(12)), steps  # one step per optimizer step
    per_rank_step = defaultdict(Counter)
    for r in rows:
        per_rank_step[(r["rank"], r["step"])][r["name"]] += 1
    for (rank, step), names in per_rank_step.items():
        assert names["forward-compute"] >= 1 and names["backward-compute"] >= 1, (rank, step, names)
        assert names["optimizer"] == 1 and names["data-wait"] == 1, (rank, step, names)
        # DDP's buckets, each an op (its first iteration runs before DDP rebuilds them, in one here)
        assert names["grads-all-reduce"] >= (1 if step == 0 else 2), (rank, step, names)
    # every bucket's all-reduce has both ranks as participants: (step, group, seq) matches across ranks
    members = defaultdict(set)
    for r in rows:
        if r["kind"] == "collective":
            assert r["group"] == "world" and r["stream"] == "async" and r["size_bytes"] > 0
            members[(r["step"], r["group"], r["seq"])].add(r["rank"])
    assert members and all(m == {0, 1} for m in members.values()), members
    # the backward is cut at each bucket's issue, and its last segment starts after the buckets complete:
    # the wait for the slow rank is not the healthy rank's backward
    r0 = sorted((r for r in rows if r["rank"] == 0 and r["step"] == 6), key=lambda r: r["start_ns"])
    grads = [r for r in r0 if r["name"] == "grads-all-reduce"]
    last_bwd = [r for r in r0 if r["name"] == "backward-compute"][-1]
    assert last_bwd["start_ns"] >= max(g["start_ns"] + g["dur_ns"] for g in grads) - 1
    assert sorted(last_bwd["deps"]) == sorted({*last_bwd["deps"]} | {g["op_id"] for g in grads}) and \
        {g["op_id"] for g in grads} <= set(last_bwd["deps"])
    bwd0 = sum(r["dur_ns"] for r in r0 if r["name"] == "backward-compute")
    assert bwd0 < 25e6, f"rank 0's backward holds the 30 ms wait for rank 1: {bwd0 / 1e6:.1f} ms"


def test_analysis_names_the_slowed_rank(ddp_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    from laggard.cli.base import main

    assert main(["analyze", str(ddp_trace), "--json", str(out), "-q"]) == 0
    doc = json.loads(out.read_text())
    first = doc["findings"][0]
    assert first["cause"] == "worker", first
    assert _ranks(first["workers"]) == [1], first


def test_slow_input_pipeline_is_named_as_such(tmp_path: Path) -> None:
    """Rank 1's DataLoader takes 30 ms longer a batch, its compute is as fast as its peer's: the
    finding names rank 1's input pipeline, not its device."""
    _ok(run_workers("ddp", 2, tmp_path, LAGGARD_TRACE_DIR=str(tmp_path / "trace"), SLOW_RANK="1", SLOW_MS="0",
                    SLOW_DATA_MS="30", STEPS="12"))
    from laggard.cli.base import main

    assert main(["analyze", str(tmp_path / "trace"), "--json", str(tmp_path / "a.json"), "-q"]) == 0
    first = json.loads((tmp_path / "a.json").read_text())["findings"][0]
    assert first["cause"] == "data-loading" and _ranks(first["workers"]) == [1], first


def _ranks(workers: list) -> list[int]:
    return [int(w["rank"]) if isinstance(w, dict) else int(w) for w in workers]


def test_training_math_unchanged(tmp_path: Path) -> None:
    """Three ranks (gradients divided by a world size that is not a power of two): the parameters after
    training are bit for bit those of the untraced run."""
    plain, traced = tmp_path / "plain", tmp_path / "traced"
    plain.mkdir()
    traced.mkdir()
    _ok(run_workers("ddp", 3, tmp_path, boot=False, DUMP=str(plain), STEPS="5"))
    _ok(run_workers("ddp", 3, tmp_path, DUMP=str(traced), STEPS="5", LAGGARD_TRACE_DIR=str(tmp_path / "t")))
    assert any(r["name"] == "grads-all-reduce" for r in ops(tmp_path / "t"))
    for rank in range(3):
        a, b = torch.load(plain / f"params{rank}.pt"), torch.load(traced / f"params{rank}.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), rank


def test_own_calls_recorded_once(tmp_path: Path) -> None:
    _ok(run_workers("manual", 2, tmp_path, boot=False, TRACE_OUT=str(tmp_path / "trace")))
    rows = ops(tmp_path / "trace")
    per = defaultdict(Counter)
    for r in rows:
        per[(r["rank"], r["step"])][r["name"]] += 1
    assert len(per) == 8  # 2 ranks x 4 steps
    n_params = 6  # the MLP's three weights and biases: one all-reduce each
    for (rank, _step), names in per.items():
        # "wrapped" is the tracer's op: the all_reduce inside it is that op, not a second one
        assert names["all-reduce"] == n_params and names["wrapped"] == 1 and names["mine"] == 1, names
        assert names["broadcast"] == 1 and names["barrier"] == 1 and names["all-gather-object"] == 1, names
        assert names["all-gather"] == 0, names  # the object collective's inner calls are its own
        assert (names["send"], names["recv"]) == ((2, 1) if rank == 0 else (1, 2)), names
    sends = Counter((r["step"], r["group"], r["seq"]) for r in rows if r["kind"] == "p2p_send")
    recvs = Counter((r["step"], r["group"], r["seq"]) for r in rows if r["kind"] == "p2p_recv")
    assert sends and sends == recvs  # every transfer has its two ends


def test_fsdp2_collectives(tmp_path: Path) -> None:
    _ok(run_workers("fsdp", 2, tmp_path, LAGGARD_TRACE_DIR=str(tmp_path / "trace"), STEPS="3"))
    rows = ops(tmp_path / "trace")
    names = Counter((r["rank"], r["name"]) for r in rows if r["kind"] == "collective")
    assert names[(0, "all-gather")] >= 3 * 2 and names[(0, "reduce-scatter")] >= 3 * 2, names
    assert names[(0, "all-gather")] == names[(1, "all-gather")], names


def test_tensor_parallel_functional_collectives(tmp_path: Path) -> None:
    _ok(run_workers("tp", 2, tmp_path, LAGGARD_TRACE_DIR=str(tmp_path / "trace")))
    rows = ops(tmp_path / "trace")
    ar = [r for r in rows if r["name"] == "all-reduce"]
    assert {r["step"] for r in ar} == {0, 1, 2, 3}, ar[:3]
    members = defaultdict(set)
    for r in ar:
        members[(r["step"], r["group"], r["seq"])].add(r["rank"])
    assert all(m == {0, 1} for m in members.values()), members
    # the forward is cut at the all-reduce's issue; the compute after its wait (where the result is first
    # used) depends on it, and no op before the wait does
    r0 = sorted((r for r in rows if r["rank"] == 0 and r["step"] == 2), key=lambda r: r["start_ns"])
    names = [r["name"] for r in r0]
    i = names.index("all-reduce")
    assert "forward-compute" in names[:i] and "forward-compute" in names[i + 1:], names
    waiting = [r for r in r0 if r0[i]["op_id"] in (r["deps"] or [])]
    assert len(waiting) == 1 and waiting[0]["kind"] == "compute", waiting
    assert waiting[0]["start_ns"] >= r0[i]["start_ns"] + r0[i]["dur_ns"] - 1_000, (waiting, r0[i])


def test_pipeline_over_send_recv_is_inferred(tmp_path: Path) -> None:
    """No layout is given: the transfers make two chains of two stages, stage 0 the end that sends
    first; stage 1 (ranks 1 and 3) is the slow one."""
    _ok(run_workers("pipe", 4, tmp_path, LAGGARD_TRACE_DIR=str(tmp_path / "trace"), SLOW_RANK="1", SLOW_MS="40",
                    STEPS="8"))
    from laggard.cli.base import main
    from laggard.io import load_job

    job = load_job(tmp_path / "trace")
    assert (job.meta.dp_size, job.meta.pp_size) == (2, 2), job.meta
    cols = {c: job.table.column(c).to_pylist() for c in ("rank", "dp_rank", "pp_rank")}
    coords = dict(zip(cols["rank"], zip(cols["dp_rank"], cols["pp_rank"], strict=True), strict=True))
    assert coords == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}, coords
    assert main(["analyze", str(tmp_path / "trace"), "--json", str(tmp_path / "a.json"), "-q"]) == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    # which finding comes first beside a job-wide one on 2 shared cores is the diagnosis' ranking, not
    # this capture's: here the slow stage's ranks are the worst workers
    worst = max(doc["by_worker"], key=lambda w: w["slowdown"])
    assert worst["rank"] in (1, 3), doc["by_worker"]


def test_accumulation_microbatches(tmp_path: Path) -> None:
    _ok(run_workers("accumulate", 2, tmp_path, LAGGARD_TRACE_DIR=str(tmp_path / "trace"), STEPS="3"))
    rows = ops(tmp_path / "trace")
    assert {r["step"] for r in rows} == {0, 1, 2}
    fwd = Counter((r["rank"], r["step"], r["microbatch"]) for r in rows if r["name"] == "forward-compute")
    assert {mb for (_r, _s, mb) in fwd} == {0, 1}


def test_single_process_and_failure(tmp_path: Path) -> None:
    env = {"LAGGARD_TRACE_DIR": str(tmp_path / "single")}
    r = subprocess.run([sys.executable, "-m", "laggard.tracer.auto.boot", str(JOB), "single"], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(SRC), **env}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {row["step"] for row in ops(tmp_path / "single")} == set(range(5))
    res = run_workers("fail", 2, tmp_path, LAGGARD_TRACE_DIR=str(tmp_path / "fail"))
    assert [x.returncode for x in res] == [3, 3]
    state = json.loads((tmp_path / "fail" / "rank0.state.json").read_text())
    assert state["status"].startswith("failed") and {row["step"] for row in ops(tmp_path / "fail")} == {0, 1, 2}


def test_tensor_parallel_groups_are_read_as_tp(tmp_path: Path) -> None:
    """tp 2 x dp 2 by hand (tests/autotrace_job.py ``tp_dp``): TP groups {0, 1} and {2, 3} all-reduce
    activations inside every forward (and the input's gradient inside the backward), DP groups {0, 2} and
    {1, 3} the gradients after the backward. No layout is given: the groups make tp 2 x dp 2, and rank 1,
    whose blocks are slow, is the rank named, not its TP peer rank 0 (which shares its DP rank and stage)."""
    # 25 ms per block keeps rank 1 the worst S_w when another test shares the two cores (10 ms did not)
    _ok(run_workers("tp_dp", 4, tmp_path, LAGGARD_TRACE_DIR=str(tmp_path / "trace"), SLOW_RANK="1", SLOW_MS="25",
                    STEPS="12"))
    from laggard.cli.base import main
    from laggard.io import load_job

    job = load_job(tmp_path / "trace")
    assert (job.meta.dp_size, job.meta.pp_size, job.meta.tp_size) == (2, 1, 2), job.meta
    cols = {c: job.table.column(c).to_pylist() for c in ("rank", "dp_rank", "pp_rank", "tp_rank")}
    coords = dict(zip(cols["rank"], zip(cols["dp_rank"], cols["pp_rank"], cols["tp_rank"], strict=True), strict=True))
    assert coords == {0: (0, 0, 0), 1: (0, 0, 1), 2: (1, 0, 0), 3: (1, 0, 1)}, coords
    assert "tensor parallel 2" in job.meta.extra["layout_inferred"], job.meta.extra
    assert main(["analyze", str(tmp_path / "trace"), "--json", str(tmp_path / "a.json"), "-q"]) == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    assert (doc["meta"]["dp"], doc["meta"]["tp"]) == (2, 2) and "tensor parallel" in doc["meta"]["layout_inferred"]
    assert doc["by_worker"][0]["rank"] == 1 and doc["by_worker"][0]["tp_rank"] == 1, doc["by_worker"]
    assert doc["M_W_detail"]["fixed_ranks"] == [1], doc["M_W_detail"]
    named = [f for f in doc["findings"] if f["workers"]]
    assert named and _ranks(named[0]["workers"]) == [1], doc["findings"]


def test_pure_pipeline_of_four_stages_is_inferred(tmp_path: Path) -> None:
    """The 4-stage pipeline over blocking send/recv of tests/io/test_kineto_pipe4.py, captured with no
    code: one chain 0 -> 1 -> 2 -> 3."""
    _ok(run_workers("pipe4", 4, tmp_path, LAGGARD_TRACE_DIR=str(tmp_path / "trace"), SCHEDULE="one-by-one", STEPS="4"))
    from laggard.io import load_job

    job = load_job(tmp_path / "trace")
    assert (job.meta.dp_size, job.meta.pp_size, job.meta.tp_size) == (1, 4, 1), job.meta
    cols = {c: job.table.column(c).to_pylist() for c in ("rank", "dp_rank", "pp_rank")}
    assert dict(zip(cols["rank"], zip(cols["dp_rank"], cols["pp_rank"], strict=True), strict=True)) == \
        {r: (0, r) for r in range(4)}


def test_ddp_buffer_broadcast_is_captured(tmp_path: Path) -> None:
    """A model with buffers: DDP broadcasts them from rank 0 before each forward, in C++. Rank 1's host
    stalls 40 ms before each forward (the program sleeps); rank 0's broadcast waits for it. Captured,
    that wait is a collective matched across the ranks, not rank 0's forward, and no finding names
    rank 0."""
    trace = tmp_path / "trace"
    _ok(run_workers("ddp", 2, tmp_path, LAGGARD_TRACE_DIR=str(trace), BUFFERS="1", SLOW_RANK="1", SLOW_MS="0",
                    SLOW_HOST_MS="40", STEPS="12"))
    rows = ops(trace)
    members = defaultdict(set)
    for r in rows:
        if r["name"] == "buffers-broadcast":
            assert r["kind"] == "collective" and r["group"] == "world" and r["size_bytes"] > 0, r
            members[(r["step"], r["seq"])].add(r["rank"])
    assert {s for s, _ in members} == set(range(12)) and all(m == {0, 1} for m in members.values()), members
    fwd0 = sorted(r["dur_ns"] for r in rows if r["rank"] == 0 and r["name"] == "forward-compute" and r["step"] >= 2)
    median_ms = fwd0[len(fwd0) // 2] / 1e6
    assert median_ms < 20, f"rank 0's forward holds the 40 ms wait for rank 1: {median_ms:.1f} ms"
    from laggard.cli.base import main

    assert main(["analyze", str(trace), "--json", str(tmp_path / "a.json"), "-q"]) == 0
    findings = json.loads((tmp_path / "a.json").read_text())["findings"]
    named = {r for f in findings for r in _ranks(f["workers"])}
    assert 0 not in named and findings[0]["workers"] and _ranks(findings[0]["workers"]) == [1], findings[0]



@pytest.mark.parametrize("given", [False, True], ids=["laggard-run", "inner-optimizer-given"])
def test_zero_redundancy_optimizer_step_ends_the_step(tmp_path: Path, given: bool) -> None:
    """ZeroRedundancyOptimizer's ``step()`` runs its inner SGD's ``step()`` and then broadcasts the
    parameters: the step ends where ZeRO's step does, so each step's broadcasts are that step's (the
    last step's too), one step per ZeRO step. Also where ``laggard.autotrace`` is given the inner SGD
    as the step's optimizer: ZeRO's step around it ends the step."""
    steps, trace = 6, tmp_path / "trace"
    env = {"TRACE_OUT": str(trace)} if given else {"LAGGARD_TRACE_DIR": str(trace)}
    _ok(run_workers("zero", 2, tmp_path, boot=not given, job=PHASE_JOB, STEPS=str(steps), **env))
    rows = ops(trace)
    assert {r["step"] for r in rows} == set(range(steps))
    n_params = 6  # the MLP's weights and biases: ZeRO broadcasts each from the rank that owns it
    for rank in (0, 1):
        for step in range(steps):
            mine = [r for r in rows if r["rank"] == rank and r["step"] == step]
            bcast = [r for r in mine if r["name"] == "broadcast"]
            opt = sorted((r for r in mine if r["name"] == "optimizer"), key=lambda r: r["start_ns"])
            assert len(bcast) == n_params and opt, (rank, step, Counter(r["name"] for r in mine))
            # inside ZeRO's optimizer phase: issued after it starts, completed before it ends
            end = max(r["start_ns"] + r["dur_ns"] for r in opt)
            assert all(opt[0]["start_ns"] <= b["start_ns"] and b["start_ns"] + b["dur_ns"] <= end for b in bcast), \
                (rank, step, bcast, opt)
            # one optimizer phase, cut only where it issues a broadcast: the inner step pushes none of its own
            assert len(opt) == n_params + 1, (rank, step, Counter(r["name"] for r in mine))
    members = defaultdict(set)
    for r in rows:
        if r["name"] == "broadcast":
            members[(r["step"], r["group"], r["seq"])].add(r["rank"])
    assert all(m == {0, 1} for m in members.values()), members


def test_independent_optimizers_first_to_step_ends_the_step(tmp_path: Path) -> None:
    """Two optimizers stepping one after another (a GAN's discriminator, then its generator), neither
    inside the other: the first to step ends each step, so the second's step joins the next one."""
    steps = 5
    r = subprocess.run([sys.executable, "-m", "laggard.tracer.auto.boot", str(PHASE_JOB), "gan"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(SRC), "STEPS": str(steps),
                                                    "LAGGARD_TRACE_DIR": str(tmp_path / "trace")})
    assert r.returncode == 0, r.stderr
    per = defaultdict(Counter)
    for row in ops(tmp_path / "trace"):
        per[row["step"]][row["name"]] += 1
    assert set(per) == set(range(steps)), sorted(per)
    assert [per[s]["optimizer"] for s in range(steps)] == [1] + [2] * (steps - 1), per
    assert [per[s]["backward-compute"] for s in range(steps)] == [1] + [2] * (steps - 1), per


def test_grad_disabled_forwards_are_no_training_forwards(tmp_path: Path) -> None:
    """A validation pass under ``torch.no_grad()`` / ``torch.inference_mode()`` before every odd step's
    training batch: its forwards are ``no-grad-forward`` ops of no microbatch, the training forwards
    stay ``forward-compute``, and the checkpointed block's recompute inside the backward is still a
    training forward (grad is on there)."""
    steps, val_batches = 6, 2
    _ok(run_workers("validate", 2, tmp_path, job=PHASE_JOB, LAGGARD_TRACE_DIR=str(tmp_path / "trace"),
                    STEPS=str(steps), VAL_BATCHES=str(val_batches)))
    rows = ops(tmp_path / "trace")
    assert {r["step"] for r in rows} == set(range(steps))
    for rank in (0, 1):
        for step in range(steps):
            mine = [r for r in rows if r["rank"] == rank and r["step"] == step]
            val = [r for r in mine if r["name"] == "no-grad-forward"]
            fwd = [r for r in mine if r["name"] == "forward-compute"]
            bwd = [r for r in mine if r["name"] == "backward-compute"]
            assert len(val) == (val_batches if step % 2 else 0), (rank, step, Counter(r["name"] for r in mine))
            assert all(r["microbatch"] == -1 and r["kind"] == "compute" for r in val), val
            assert fwd and bwd and all(r["microbatch"] == 0 for r in fwd + bwd), (rank, step)
            b0, b1 = min(r["start_ns"] for r in bwd), max(r["start_ns"] + r["dur_ns"] for r in bwd)
            # the training forward before the backward, the block's recompute inside it
            assert any(r["start_ns"] < b0 for r in fwd), (rank, step)
            assert any(b0 <= r["start_ns"] <= b1 for r in fwd), (rank, step)
            assert all(r["start_ns"] + r["dur_ns"] <= b0 for r in val), (rank, step)


def test_forwards_first_run_after_the_first_steps_are_traced(tmp_path: Path) -> None:
    """An evaluation that starts only after the session narrowed its forward hooks (from step 5, every
    other step), through DDP's wrapped module and through an EMA copy never called before: each of
    its forwards is a ``no-grad-forward`` of its step (the one after the optimizer step that ended the
    evaluating one), and each training step still has exactly one training forward."""
    steps, late, val_batches = 9, 5, 2
    _ok(run_workers("late_eval", 2, tmp_path, job=PHASE_JOB, LAGGARD_TRACE_DIR=str(tmp_path / "trace"),
                    STEPS=str(steps), LATE=str(late), VAL_BATCHES=str(val_batches)))
    rows = ops(tmp_path / "trace")
    for rank in (0, 1):
        mine = [r for r in rows if r["rank"] == rank]
        val = Counter(r["step"] for r in mine if r["name"] == "no-grad-forward")
        # what runs after a step's optimizer step joins the next step
        assert dict(val) == {i + 1: 2 * val_batches for i in range(late, steps - 1) if i % 2}, (rank, val)
        fwd = Counter(r["step"] for r in mine if r["name"] == "forward-compute")
        assert set(fwd.values()) == {1} and len(fwd) == steps, (rank, fwd)


def test_a_loop_with_no_optimizer_says_so_and_ends_its_steps_with_end_step(tmp_path: Path) -> None:
    """A loop that averages its gradients and updates the weights by hand has no optimizer step to end
    a step: its trace holds no step, and the trace check says why (not that the ranks died before
    their first flush). With ``laggard.end_step()`` after each update every step is there, each with
    its forward, backward and the hand-written all-reduces (6 parameters)."""
    from laggard.optable.tracedir import check_trace

    steps = 4
    bare = tmp_path / "bare"
    _ok(run_workers("manual", 2, tmp_path, job=PHASE_JOB, LAGGARD_TRACE_DIR=str(bare), STEPS=str(steps)))
    assert not [r for r in (ops(bare) if list(bare.glob("ops-rank*.parquet")) else [])
                if r["name"] in ("forward-compute", "backward-compute", "all-reduce")]
    (line,) = check_trace(bare)
    assert f"rank(s) 0, 1 ran {steps} backward passes but no step ended" in line and "laggard.end_step()" in line
    marked = tmp_path / "marked"
    _ok(run_workers("manual", 2, tmp_path, job=PHASE_JOB, LAGGARD_TRACE_DIR=str(marked), STEPS=str(steps),
                    END_STEP="1"))
    assert check_trace(marked) == []
    per = defaultdict(Counter)
    for row in ops(marked):
        per[(row["rank"], row["step"])][row["name"]] += 1
    assert set(per) == {(r, s) for r in (0, 1) for s in range(steps)}, sorted(per)
    for key, names in per.items():
        assert names["forward-compute"] >= 1 and names["backward-compute"] >= 1, (key, names)
        assert names["all-reduce"] == 6, (key, names)
