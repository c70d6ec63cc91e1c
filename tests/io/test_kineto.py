"""Kineto (PyTorch profiler) import: every HTA test trace, decoding, bad input, CLI."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import orjson
import pytest

from laggard.analysis.pipeline import analyze
from laggard.engine.arrivals import arrivals, job_extras
from laggard.errors import LaggardError, LaggardWarning
from laggard.io import detect_format, load_job
from laggard.io.kineto import decode as ke
from laggard.io.kineto.load import read_kineto
from tests.conftest import run_cli

pytestmark = pytest.mark.timeout(120)

KT = Path(__file__).parents[1] / "data" / "kineto"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "kineto"
DDP = KT / "ddp_gloo"

# every file of ../shared/data/kineto (copied here), and what it must give
FILES = {
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": {"device": "gpu", "collectives": 0, "steps": [1]},
    "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": {"device": "cpu", "collectives": 2, "steps": [551],
                                                               "rank": 34},
    "distributed_info_unavailable/distributed_info_not_found.json.gz": {"device": "cpu", "collectives": 6,
                                                                        "steps": [1009]},
    "nccl_parser_config/nccl_data.json.gz": {"device": "gpu", "collectives": 21, "steps": [4, 5, 6], "rank": 0},
    "rank_non_gpu/rank_non_gpu.json.gz": {"device": "cpu", "collectives": 6, "steps": [1009], "rank": 0},
    "rank_unavailable/rank_not_found.json.gz": {"device": "cpu", "collectives": 6, "steps": [1009]},
    "df_index_resolver/df_index_resolver_step3.json.gz": {"device": "gpu", "collectives": 404, "steps": [3], "rank": 1},
}


def _load(path, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        job = read_kineto(path, **kw)
    return job, [str(w.message) for w in caught if issubclass(w.category, LaggardWarning)]


def test_every_shared_file_is_here():
    if not SHARED.exists():
        pytest.skip("../shared/data/kineto is not beside the project")
    shared = {p.relative_to(SHARED).as_posix() for p in SHARED.rglob("*.gz")}
    mine = set(FILES) | {"df_index_resolver/df_index_resolver.json.gz"}  # cut to one step here
    assert shared <= mine


@pytest.mark.parametrize("rel", sorted(FILES))
def test_hta_trace_imports(rel):
    want = FILES[rel]
    job, warns = _load(KT / rel)
    ops = job.table
    kinds = ops.column("kind").to_pylist()
    assert kinds.count("collective") == want["collectives"]
    assert sorted(set(ops.column("step").to_pylist())) == want["steps"]
    assert job.meta.extra["devices"] == [want["device"]]
    assert (np.asarray(ops.column("dur_ns")) >= 0).all()
    if "rank" in want:
        assert set(ops.column("rank").to_pylist()) == {want["rank"]}
    else:
        assert any("analyzed as rank 0" in w for w in warns)
    if want["collectives"]:
        names = {n for n, k in zip(ops.column("name").to_pylist(), kinds, strict=True) if k == "collective"}
        assert all(n.split(":")[0] in ("nccl", "gloo") for n in names), names


@pytest.mark.parametrize("rel", sorted(FILES))
def test_hta_trace_cli(rel, tmp_path, capsys):
    out = tmp_path / "a.json"
    code = run_cli("analyze", KT / rel, "--format", "kineto", "--json", out, "--quiet")
    err = capsys.readouterr().err
    if code != 0:  # allowed only as a one-line error
        assert code == 2 and "Traceback" not in err and err.count("laggard: error:") == 1, err
        pytest.fail(f"{rel} does not analyze: {err.strip()}")
    d = json.loads(out.read_text())
    assert d["num_steps"] == len(FILES[rel]["steps"])
    assert "arrivals" in d and "clock_offsets_s" in d


def test_nccl_trace_collectives_and_metadata():
    """nccl_data: NCCL kernels with their record_param_comms metadata (process group, sizes)."""
    job, _ = _load(KT / "nccl_parser_config/nccl_data.json.gz")
    t = job.table.to_pydict()
    coll = [i for i, k in enumerate(t["kind"]) if k == "collective"]
    assert {t["name"][i] for i in coll} == {"nccl:all_reduce", "nccl:broadcast"}
    assert {t["group"][i] for i in coll} == {"0"}
    assert all(t["stream"][i] == "gpu0:stream40" for i in coll)
    sizes = [t["size_bytes"][i] for i in coll]
    assert None not in sizes and max(sizes) == 4 * 7_875_584  # float all-reduce of 7,875,584 elements
    pg = job.meta.extra["process_groups"]["0"]
    assert pg["desc"] == "default_pg" and pg["ranks"] == [0, 1]
    # compute between collectives: GPU segments on the compute stream, each collective launched after one
    comp = [i for i, k in enumerate(t["kind"]) if k == "compute"]
    assert comp and all(t["stream"][i] == "gpu0:stream7" for i in comp)
    res = analyze(job)
    assert "nccl:all_reduce" in res.by_optype and res.num_workers == 1


def test_df_index_steps_and_kernels():
    job, warns = _load(KT / "df_index_resolver/df_index_resolver_step3.json.gz")
    t = job.table.to_pydict()
    names = [n for n, k in zip(t["name"], t["kind"], strict=True) if k == "collective"]
    assert set(names) == {"nccl:all_reduce"}
    assert any("no process-group name" in w for w in warns)
    assert any("the job has 2 ranks but 1 trace" in w for w in warns)


@pytest.mark.skipif(not (SHARED / "df_index_resolver").exists(),
                    reason="../shared/data/kineto is not beside the project")
def test_full_df_index_trace():
    job, _ = _load(SHARED / "df_index_resolver/df_index_resolver.json.gz")
    assert sorted(set(job.table.column("step").to_pylist())) == [2, 3, 4, 5, 6]
    assert job.table.column("kind").to_pylist().count("collective") == 2020
    assert job.meta.extra["num_bytes"] == 53_733_385
    res = analyze(job)
    assert res.slowdown >= 1.0


def test_chunked_decode_matches_whole(monkeypatch):
    """Decoding in small chunks (the streaming path) gives exactly the one-piece result."""
    path = KT / "nccl_parser_config/nccl_data.json.gz"
    whole = ke.read_events(path)
    monkeypatch.setattr(ke, "_BLOCK_BYTES", 64 * 1024)
    monkeypatch.setattr(ke, "_MIN_CHUNK_BYTES", 32 * 1024)
    part = ke.read_events(path)
    assert part.num_bytes == whole.num_bytes
    assert np.array_equal(part.ts_us, whole.ts_us) and np.array_equal(part.corr, whole.corr)
    assert [part.names[i] for i in part.name] == [whole.names[i] for i in whole.name]
    assert [part.tids[i] for i in part.tid] == [whole.tids[i] for i in whole.tid]
    assert part.meta == whole.meta and part.header == whole.header


def test_minified_and_plain_json(tmp_path):
    src = gzip.open(KT / "rank_non_gpu/rank_non_gpu.json.gz").read()
    (tmp_path / "rank0.json").write_bytes(orjson.dumps(orjson.loads(src)))  # one line, no layout
    a, _ = _load(tmp_path / "rank0.json")
    b, _ = _load(KT / "rank_non_gpu/rank_non_gpu.json.gz")
    assert a.table.equals(b.table)


def test_detect_format(tmp_path):
    assert detect_format(KT / "cpu_only") == "kineto"
    assert detect_format(KT / "nccl_parser_config/nccl_data.json.gz") == "kineto"
    assert detect_format(Path(str(DDP / "rank*.json.gz"))) == "kineto"
    job = load_job(str(DDP / "rank*.json.gz"))
    assert job.meta.dp_size == 4
    job2 = load_job([DDP / f"rank{r}.json.gz" for r in (0, 2)])
    assert sorted(set(job2.table.column("rank").to_pylist())) == [0, 2]


def test_arrivals_and_extras_on_ddp():
    job, _ = _load(DDP)
    a = arrivals(job)
    assert set(a["arrivals"]) == {"0", "1", "2", "3"}
    assert a["num_collectives"] == 10
    for v in a["arrivals"].values():
        assert set(v) >= {"last_count", "mean_lag_s", "p99_lag_s"}
        assert 0 <= v["mean_lag_s"] <= v["p99_lag_s"] + 1e-12
    assert sum(v["last_count"] for v in a["arrivals"].values()) <= a["num_collectives"]
    assert set(a["arrivals_by_group"]) == {"0"}
    ex = job_extras(job)
    assert ex["clock_offsets_s"] == {"0": 0.0, "1": 0.0, "2": 0.0, "3": 0.0}  # one host, one clock


def test_cli_glob_list_and_html(tmp_path, capsys):
    out = tmp_path / "a.json"
    html = tmp_path / "r.html"
    files = [DDP / f"rank{r}.json.gz" for r in range(4)]
    assert run_cli("analyze", *files, "--json", out, "--html", html) == 0
    printed = capsys.readouterr().out
    assert "arrivals at 10 collective(s)" in printed
    d = json.loads(out.read_text())
    assert set(d["arrivals"]) == {"0", "1", "2", "3"} and "clock_offsets_s" in d and "arrivals_by_group" in d
    assert "Arrivals at collectives" in html.read_text()
    assert run_cli("analyze", str(DDP / "rank*.json.gz"), "--format", "kineto", "-q", "--json", out) == 0
    assert json.loads(out.read_text())["num_workers"] == 4


# ---------------------------------------------------------------- bad input


def _err(capsys, *args) -> str:
    code = run_cli("analyze", *args, "--quiet")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("laggard: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_truncated_gzip(tmp_path, capsys):
    data = (DDP / "rank0.json.gz").read_bytes()
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(data[: len(data) // 2])
    assert "truncated gzip" in _err(capsys, p, "--format", "kineto")


def test_truncated_plain_json(tmp_path, capsys):
    data = gzip.open(DDP / "rank0.json.gz").read()
    p = tmp_path / "rank0.json"
    p.write_bytes(data[: len(data) // 2])
    assert "truncated" in _err(capsys, p)


def test_corrupt_gzip(tmp_path, capsys):
    data = bytearray((DDP / "rank0.json.gz").read_bytes())
    data[100:140] = b"\x00" * 40
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(bytes(data))
    msg = _err(capsys, p)
    assert "rank0.json.gz" in msg and ("gzip" in msg or "JSON" in msg)


def test_empty_file(tmp_path, capsys):
    p = tmp_path / "rank0.json"
    p.write_bytes(b"")
    assert "empty file" in _err(capsys, p, "--format", "kineto")
    g = tmp_path / "rank1.json.gz"
    with gzip.open(g, "wb") as f:
        f.write(b"")
    assert "empty" in _err(capsys, g, "--format", "kineto")


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"hello": 1}', "no traceEvents"),
        (b"[1, 2, 3]", "a JSON list"),
        (b"not json at all", "not valid JSON"),
        (b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "not a PyTorch profiler trace"),
        (b'{"traceEvents": []}', "no op"),
    ],
)
def test_json_that_is_not_a_trace(tmp_path, capsys, content, words):
    p = tmp_path / "rank0.json"
    p.write_bytes(content)
    assert words in _err(capsys, p, "--format", "kineto")


def _rewrite(src: Path, dst: Path, fn) -> Path:
    d = orjson.loads(gzip.open(src).read())
    fn(d)
    with gzip.open(dst, "wb") as f:
        f.write(orjson.dumps(d))
    return dst


def test_two_files_same_rank(tmp_path, capsys):
    shutil.copy(DDP / "rank0.json.gz", tmp_path / "a.json.gz")
    shutil.copy(DDP / "rank0.json.gz", tmp_path / "b.json.gz")
    msg = _err(capsys, tmp_path)
    assert "both claim rank 0" in msg


def test_ranks_from_different_jobs(tmp_path, capsys):
    def world8(d):
        d["distributedInfo"]["world_size"] = 8

    shutil.copy(DDP / "rank0.json.gz", tmp_path / "rank0.json.gz")
    _rewrite(DDP / "rank1.json.gz", tmp_path / "rank1.json.gz", world8)
    assert "different jobs" in _err(capsys, tmp_path)

    def later(d):  # the same job shape, profiled an hour later
        d["baseTimeNanoseconds"] += 3600 * 10**9

    _rewrite(DDP / "rank1.json.gz", tmp_path / "rank1.json.gz", later)
    assert "different jobs or profiling runs" in _err(capsys, tmp_path)

    def other_steps(d):
        for e in d["traceEvents"]:
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                e["name"] = "ProfilerStep#" + str(int(e["name"].split("#")[1]) + 100)

    # the same job with the profiler started 100 steps apart: the collectives end together (one
    # host, one clock), so the steps are renumbered rather than refused
    _rewrite(DDP / "rank1.json.gz", tmp_path / "rank1.json.gz", other_steps)
    job, warns = _load(tmp_path)
    assert any("renumbered rank 1 by -100" in w for w in warns) and job.table.num_rows > 0

    def other_host_steps(d):  # on another host and no sequence numbers: nothing ties the steps together
        other_steps(d)
        d["host_name"] = "elsewhere"

    _rewrite(DDP / "rank1.json.gz", tmp_path / "rank1.json.gz", other_host_steps)
    assert "no step in common" in _err(capsys, tmp_path)


def test_rank_from_file_name_warns(tmp_path):
    def no_rank(d):
        del d["distributedInfo"]["rank"]

    for r in range(4):
        _rewrite(DDP / f"rank{r}.json.gz", tmp_path / f"trace_rank_{r}.json.gz", no_rank)
    job, warns = _load(tmp_path)
    assert sorted(set(job.table.column("rank").to_pylist())) == [0, 1, 2, 3]
    assert sum("from the file name" in w for w in warns) == 4
    shutil.copy(tmp_path / "trace_rank_0.json.gz", tmp_path / "mystery.json.gz")
    with pytest.raises(LaggardError, match="cannot tell which rank"):
        read_kineto(tmp_path)


def test_missing_rank_steps_and_partial_job(tmp_path):
    """A rank without one of the steps: that step is skipped with a warning."""
    def drop_last_step(d):
        steps = [e for e in d["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
        last = max(steps, key=lambda e: e["ts"])
        d["traceEvents"].remove(last)

    for r in range(4):
        src = DDP / f"rank{r}.json.gz"
        if r == 1:
            _rewrite(src, tmp_path / f"rank{r}.json.gz", drop_last_step)
        else:
            shutil.copy(src, tmp_path / f"rank{r}.json.gz")
    job, warns = _load(tmp_path)
    assert any("not traced on every rank" in w for w in warns)
    assert len(set(job.table.column("step").to_pylist())) == 4


def test_non_trace_json_in_directory_is_skipped(tmp_path):
    for r in range(2):
        shutil.copy(DDP / f"rank{r}.json.gz", tmp_path / f"rank{r}.json.gz")
    (tmp_path / "results.json").write_text('{"accuracy": 0.9}')
    job, warns = _load(tmp_path)
    assert any("not profiler traces: results.json" in w for w in warns)
    assert job.meta.dp_size == 2


def test_workers_parallel_equals_serial():
    a, _ = _load(DDP, workers=1)
    b, _ = _load(DDP, workers=2)
    assert a.table.equals(b.table)


def test_workers_are_forked_when_the_process_is_single_threaded(tmp_path):
    """The CLI path: no thread started before decoding (pyarrow comes later), so workers are forked."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import multiprocessing as mp, sys\n"
        "from laggard.io.kineto import files, load as kineto\n"
        "print(files._worker_context(mp).get_start_method(), 'pyarrow' in sys.modules)\n"
        f"a = kineto.read_kineto({str(DDP)!r}, workers=2)\n"
        f"b = kineto.read_kineto({str(DDP)!r}, workers=1)\n"
        "print(a.table.equals(b.table), a.meta.extra['worker_cpu_s'] > 0)\n"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["fork", "False", "True", "True"]


def test_workers_come_from_a_server_when_threads_run(monkeypatch):
    """A caller with threads (forking could copy a held lock): workers start from a fork server."""
    import multiprocessing as mp

    from laggard.io.kineto import files

    monkeypatch.setattr(files, "_os_threads", lambda: 3)
    assert files._worker_context(mp).get_start_method() in ("forkserver", "spawn")
    a, _ = _load(DDP, workers=2)
    b, _ = _load(DDP, workers=1)
    assert a.table.equals(b.table)
    assert a.meta.extra["worker_cpu_s"] > 0


def test_decoder_stays_lean():
    """The decode workers import only the decoder: no numpy, no pyarrow (they start in milliseconds)."""
    code = "import sys, laggard.io.kineto.decode; print(sorted({'numpy', 'pyarrow', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_parallel_decode_from_a_script_without_main_guard(tmp_path):
    """Workers never re-run the caller's main script: no crash without an ``if __name__ == "__main__"``
    guard, no side effects repeated, no CLI / pyarrow imported in the workers."""
    marker = tmp_path / "runs.txt"
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        f"open({str(marker)!r}, 'a').write('ran\\n')\n"
        "from laggard.io.kineto.load import read_kineto\n"
        f"job = read_kineto({str(DDP)!r}, workers=2)\n"
        "print(job.num_ops, job.meta.extra['worker_cpu_s'] > 0)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    serial, _ = _load(DDP, workers=1)
    assert out.stdout.split() == [str(serial.num_ops), "True"]
    assert marker.read_text() == "ran\n"


def test_worker_error_is_the_first_bad_file(tmp_path, capsys):
    """With parallel workers, a bad file still ends in its one-line error (the first bad file's)."""
    for r in range(4):
        shutil.copy(DDP / f"rank{r}.json.gz", tmp_path / f"rank{r}.json.gz")
    (tmp_path / "rank1.json.gz").write_bytes(gzip.open(DDP / "rank1.json.gz").read()[:5000])  # truncated
    (tmp_path / "rank3.json.gz").write_bytes(b"")
    with pytest.raises(LaggardError, match=r"rank1\.json\.gz: not valid JSON"):
        read_kineto(tmp_path, workers=2)


def test_mixed_gpu_and_cpu_only_ranks(tmp_path):
    """A GPU rank with NCCL kernels beside a rank whose trace has no GPU activity."""
    shutil.copy(KT / "nccl_parser_config/nccl_data.json.gz", tmp_path / "rank0.json.gz")

    def as_rank1_cpu_only(d):
        d["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 2}
        d["traceEvents"] = [e for e in d["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]

    _rewrite(KT / "nccl_parser_config/nccl_data.json.gz", tmp_path / "rank1.json.gz", as_rank1_cpu_only)
    job, warns = _load(tmp_path)
    assert job.meta.extra["devices"] == ["cpu", "gpu"]
    assert any("no GPU activity" in w for w in warns)
    assert sorted(set(job.table.column("rank").to_pylist())) == [0, 1]
    res = analyze(job)
    assert res.num_workers == 2
