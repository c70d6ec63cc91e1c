"""`laggard fleet`: discovery (manifests, file:// and fsspec URLs) and bad input (one line, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import ND, run_cli


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory) -> Path:
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth
    from laggard.optable.ops import write_native

    root = tmp_path_factory.mktemp("two")
    for i in range(2):
        write_native(synthesize_with_truth(SynthConfig(dp=2, pp=2, microbatches=4, steps=4, seed=i), []).job,
                     root / f"j{i}")
    return root


def _jobs(out: Path) -> list[str]:
    return sorted(pq.read_table(out / "fleet.parquet", columns=["job"]).column(0).to_pylist())


def test_manifest_and_file_url(two_jobs, tmp_path):
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"# two jobs\n{two_jobs / 'j0'}\n\nfile://{ND / 'trace-ST.parquet'}  # published\n")
    assert run_cli("fleet", manifest, "--out", tmp_path / "o", "--workers", "0", "-q") == 0
    assert _jobs(tmp_path / "o") == sorted([str(two_jobs / "j0"), str(ND / "trace-ST.parquet")])


def test_fsspec_memory_url(two_jobs, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    from laggard.fleet import run_fleet

    fs = fsspec.filesystem("memory")
    fs.put(str(two_jobs / "j1"), "/fleet-test/j1", recursive=True)
    fs.put(str(ND / "trace-ST.parquet"), "/fleet-test/nd/trace-ST.parquet")
    fs.put(str(ND / "meta-ST.yaml"), "/fleet-test/nd/meta-ST.yaml")
    run = run_fleet(["memory://fleet-test"], tmp_path, workers=0)  # the memory filesystem is per process
    rows = {r["job"]: r for r in pq.read_table(run.parquet).to_pylist()}
    assert set(rows) == {"memory:///fleet-test/j1", "memory:///fleet-test/nd/trace-ST.parquet"}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    # the metadata came along: no warning about a layout guessed without meta-*.yaml
    assert rows["memory:///fleet-test/nd/trace-ST.parquet"]["num_warnings"] == 0


@pytest.mark.parametrize(("args", "message"), [
    (["/no/such/dir"], "no such file or directory"),
    (["{jobs}", "--engine", "spark"], "--engine 'spark'"),
    (["{jobs}", "--ray-address", "auto"], "--ray-address is for --engine ray"),
    (["{jobs}", "--workers", "-1"], "--workers must be in 0..4096"),
    (["{empty}"], "no jobs found"),
    (["{bad_manifest}"], "jobs.txt:2: "),
])
def test_bad_input_one_line_exit_2(two_jobs, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "jobs.txt").write_text(f"{two_jobs / 'j0'}\n/missing/job\n")
    fill = {"jobs": str(two_jobs), "empty": str(tmp_path / "empty"), "bad_manifest": str(tmp_path / "jobs.txt")}
    code = run_cli("fleet", *[a.format(**fill) for a in args], "--out", tmp_path / "out", "-q")
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_earlier_results_need_resume(two_jobs, tmp_path, capsys):
    assert run_cli("fleet", two_jobs, "--out", tmp_path, "--workers", "0", "-q") == 0
    assert run_cli("fleet", two_jobs, "--out", tmp_path, "--workers", "0", "-q") == 2
    assert "pass --resume" in capsys.readouterr().err
    (tmp_path / "fleet.parquet").write_bytes(b"garbage")
    assert run_cli("fleet", two_jobs, "--out", tmp_path, "--resume", "-q") == 2
    assert "cannot read earlier fleet results" in capsys.readouterr().err


def test_summary_says_what_this_run_did(two_jobs, tmp_path, capsys):
    """--workers 0 runs in this process (not "1 workers"); --resume counts this run's jobs, not the
    earlier run's, and a run with nothing left says so instead of 0 workers at 0.0 jobs/s."""
    out = tmp_path / "o"
    assert run_cli("fleet", two_jobs / "j0", "--out", out, "--workers", "0") == 0
    first = " ".join(capsys.readouterr().out.split())
    assert "1 job analyzed in this run: 1 ok" in first and "in this process" in first and "workers" not in first
    assert run_cli("fleet", two_jobs, "--out", out, "--resume", "--workers", "0") == 0
    second = " ".join(capsys.readouterr().out.split())
    assert "1 job analyzed in this run: 1 ok" in second and "1 done by an earlier run, skipped" in second
    assert "2 jobs, 2 analyzed" in second  # the fleet as a whole, said as such
    assert run_cli("fleet", two_jobs, "--out", out, "--resume") == 0
    third = " ".join(capsys.readouterr().out.split())
    assert "no job left to analyze; 2 done by an earlier run" in third and "jobs/s" not in third


def test_a_fleet_run_again_reads_its_jobs_from_the_job_cache(two_jobs, tmp_path, monkeypatch):
    """The second run maps each job's op table (laggard.io.cache) and writes the same documents;
    `laggard --no-cache fleet` neither reads nor writes the cache."""
    import os
    import time

    from laggard.io.cache import JobCacheConfig, entries

    old = time.time_ns() - 3600 * 10**9
    for f in two_jobs.rglob("*"):
        os.utime(f, ns=(old, old))  # settled: written an hour ago
    cache = JobCacheConfig(directory=tmp_path / "cache")
    monkeypatch.setenv("LAGGARD_CACHE_DIR", str(cache.directory))
    docs = []
    for run in ("a", "b"):
        assert run_cli("fleet", two_jobs, "--out", tmp_path / run, "--workers", "0", "-q") == 0
        assert len(entries(cache)) == 2
        docs.append({p.name: p.read_bytes() for p in sorted((tmp_path / run / "jobs").glob("*.json"))})
    assert len(docs[0]) == 2 and docs[0] == docs[1]
    used = [e[2] for e in entries(cache)]
    assert run_cli("--no-cache", "fleet", two_jobs, "--out", tmp_path / "c", "--workers", "0", "-q") == 0
    assert [e[2] for e in entries(cache)] == used  # not read (a hit touches its entry), nothing added
