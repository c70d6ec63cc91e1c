"""The job cache (laggard.io.cache): a hit gives the job the importer gives, and every change to
what a load reads (the trace, the meta YAML beside it, the options, the importers' code) misses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from laggard.errors import LaggardWarning
from laggard.io import load_job
from laggard.io.cache import JobCacheConfig, entries, entry_key, evict, read_entry

DATA = Path(__file__).parents[1] / "data"
ND = DATA / "ndtimeline"
NATIVE = DATA / "corpus" / "c16_job024" / "trace"
LAGGARD = Path(sys.executable).with_name("laggard")
OLD_NS = time.time_ns() - 3600 * 10**9  # inputs that have settled (JobCacheConfig.settle_s)


def _settled(*paths: Path) -> None:
    for p in paths:
        for f in [p, *p.iterdir()] if p.is_dir() else [p]:
            os.utime(f, ns=(OLD_NS, OLD_NS))


@pytest.fixture
def ar(tmp_path: Path) -> Path:
    d = tmp_path / "nd"
    d.mkdir()
    for name in ("trace-AR.parquet", "meta-AR.yaml"):
        shutil.copy(ND / name, d / name)
    _settled(d)
    return d / "trace-AR.parquet"


@pytest.fixture
def cfg(tmp_path: Path) -> JobCacheConfig:
    return JobCacheConfig(directory=tmp_path / "cache")


def _one_entry(cfg: JobCacheConfig) -> Path:
    found = entries(cfg)
    assert len(found) == 1, found
    return found[0][0]


def test_hit_is_the_loaded_job(ar: Path, cfg: JobCacheConfig) -> None:
    fresh = load_job(ar)
    first = load_job(ar, cache=cfg)
    entry = _one_entry(cfg)
    hit = load_job(ar, cache=cfg)
    assert fresh.table.equals(first.table) and fresh.table.equals(hit.table)
    assert hit.table.schema.metadata is None  # the entry's own metadata is not the job's
    assert hit.meta == fresh.meta and hit.load_args == fresh.load_args
    assert entries(cfg)[0][0] == entry  # read, not written again


def test_hit_is_read_from_the_entry(ar: Path, cfg: JobCacheConfig) -> None:
    """An entry rewritten with other durations gives those durations: the second load read it."""
    load_job(ar, cache=cfg)
    entry = _one_entry(cfg)
    with pa.memory_map(str(entry)) as src:
        table = ipc.open_stream(src).read_all()
    doubled = pa.array(np.asarray(table.column("dur_ns")) * 2)
    table = table.set_column(table.schema.get_field_index("dur_ns"), "dur_ns", doubled)
    tmp = entry.with_suffix(".tmp")
    with ipc.new_stream(str(tmp), table.schema) as w:
        w.write_table(table)
    os.replace(tmp, entry)
    hit = load_job(ar, cache=cfg)
    assert np.array_equal(hit.column("dur_ns"), load_job(ar).column("dur_ns") * 2)


def test_a_changed_input_misses(ar: Path, cfg: JobCacheConfig) -> None:
    key = entry_key([ar], {"fmt": "auto"}, cfg.settle_s)
    assert key is not None and key[1]
    meta = ar.with_name("meta-AR.yaml")
    meta.write_text(meta.read_text() + "\n# edited\n")
    os.utime(meta, ns=(OLD_NS + 10**9, OLD_NS + 10**9))
    assert entry_key([ar], {"fmt": "auto"}, cfg.settle_s)[0] != key[0]  # type: ignore[index]
    assert entry_key([ar], {"fmt": "ndtimeline"}, cfg.settle_s)[0] != key[0]  # type: ignore[index]
    os.utime(ar, ns=(OLD_NS + 2 * 10**9, OLD_NS + 2 * 10**9))
    changed = entry_key([ar], {"fmt": "auto"}, cfg.settle_s)
    assert changed is not None and changed[0] != key[0]


def test_fresh_inputs_are_not_cached(ar: Path, cfg: JobCacheConfig) -> None:
    os.utime(ar)  # just written: it could change again within the same timestamp tick
    load_job(ar, cache=cfg)
    assert entries(cfg) == []
    _settled(ar)
    load_job(ar, cache=cfg)
    assert len(entries(cfg)) == 1


def test_steps_are_selected_after_the_cache(ar: Path, cfg: JobCacheConfig) -> None:
    load_job(ar, cache=cfg)
    some = load_job(ar, steps="16-100", cache=cfg)
    assert len(entries(cfg)) == 1  # the same entry serves every selection
    assert some.table.equals(load_job(ar, steps="16-100").table)
    assert some.load_args["steps"] == "16-100"


def test_load_warnings_come_again_on_a_hit(tmp_path: Path, cfg: JobCacheConfig) -> None:
    trace = tmp_path / "native"
    shutil.copytree(NATIVE, trace)
    (trace / "ops-rank9-00000.parquet").write_bytes(b"")  # an empty shard: skipped with a warning
    _settled(trace)
    with pytest.warns(LaggardWarning, match="skipped 1 empty shard"):
        first = load_job(trace, cache=cfg)
    assert len(entries(cfg)) == 1
    with pytest.warns(LaggardWarning, match="skipped 1 empty shard"):
        hit = load_job(trace, cache=cfg)
    assert hit.warnings == first.warnings and any("empty shard" in w for w in hit.warnings)


def test_an_unreadable_entry_is_removed_and_the_trace_loaded(ar: Path, cfg: JobCacheConfig) -> None:
    load_job(ar, cache=cfg)
    entry = _one_entry(cfg)
    entry.write_bytes(entry.read_bytes()[: 1000])  # truncated
    job = load_job(ar, cache=cfg)
    assert job.table.equals(load_job(ar).table)
    assert len(entries(cfg)) == 1 and entries(cfg)[0][1] > 1000  # written again, whole


def test_least_recently_used_entries_go_first(tmp_path: Path) -> None:
    cfg = JobCacheConfig(directory=tmp_path / "c", max_bytes=250)
    cfg.directory.mkdir()
    for i, name in enumerate(("a", "b", "c")):
        f = cfg.directory / f"{name}.arrow"
        f.write_bytes(b"x" * 100)
        os.utime(f, ns=(OLD_NS + i * 10**9, OLD_NS + i * 10**9))
    os.utime(cfg.directory / "a.arrow", ns=(OLD_NS + 5 * 10**9,) * 2)  # used last
    assert evict(cfg) == 1
    assert sorted(p.name for p, _, _ in entries(cfg)) == ["a.arrow", "c.arrow"]
    assert read_entry(cfg, "nothing") is None


def _cli(args: list[str], cache_dir: Path, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "LAGGARD_CACHE_DIR": str(cache_dir), **env}
    full.pop("LAGGARD_NO_CACHE", None) if "LAGGARD_NO_CACHE" not in env else None
    return subprocess.run([str(LAGGARD), *args], capture_output=True, text=True, timeout=300, env=full, cwd=cwd)


def test_cli_caches_by_default_and_results_are_the_same(ar: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "clicache"
    outs = []
    for i, pre in enumerate(([], [], ["--no-cache"])):
        out = tmp_path / f"a{i}.json"
        p = _cli([*pre, "analyze", str(ar), "--json", str(out), "-q"], cache_dir)
        assert p.returncode == 0, p.stderr
        outs.append(json.loads(out.read_text()))
    assert outs[0] == outs[1] == outs[2]
    cfg = JobCacheConfig(directory=cache_dir)
    assert len(entries(cfg)) == 1
    assert cache_dir.stat().st_mode & 0o777 == 0o700  # made for the user alone
    listing = _cli(["cache"], cache_dir)
    assert listing.returncode == 0 and "1 cached job(s)" in listing.stdout and str(ar.absolute()) in listing.stdout
    cleared = _cli(["cache", "--clear"], cache_dir)
    assert cleared.returncode == 0 and "removed 1 cached job(s)" in cleared.stdout
    assert entries(cfg) == []


def test_cli_cache_off(ar: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "off"
    for pre, env in (([], {"LAGGARD_NO_CACHE": "1"}), (["--no-cache"], {})):
        p = _cli([*pre, "whatif", str(ar), "--fix", "all"], cache_dir, **env)
        assert p.returncode == 0, p.stderr
    assert not cache_dir.exists()
    # `laggard cache` still shows the cache the environment names, its own size cap, and that it is off
    listing = _cli(["cache"], cache_dir, LAGGARD_NO_CACHE="1", LAGGARD_CACHE_MAX_GIB="0.5")
    assert listing.returncode == 0, listing.stderr
    assert f"{cache_dir}: 0 cached job(s), 0.0 MiB of 0.5 GiB (off: LAGGARD_NO_CACHE" in listing.stdout
    assert "(off:" not in _cli(["cache"], cache_dir, LAGGARD_CACHE_MAX_GIB="0.5").stdout


def test_bad_cache_size_is_one_line(ar: Path, tmp_path: Path) -> None:
    p = _cli(["whatif", str(ar), "--fix", "all"], tmp_path / "c", LAGGARD_CACHE_MAX_GIB="lots")
    assert p.returncode == 2 and "LAGGARD_CACHE_MAX_GIB" in p.stderr and "Traceback" not in p.stderr


def test_root_flags_are_the_root_options_that_run_a_command() -> None:
    """`laggard --no-cache analyze` builds only analyze's module (ROOT_FLAGS names the root's flags)."""
    import click
    import typer

    from laggard.cli.base import ROOT_FLAGS, _new_app

    group = typer.main.get_group(_new_app())
    flags = [o for p in group.params if isinstance(p, click.Option) and p.is_flag and not p.is_eager
             for o in p.opts if o.startswith("--")]
    assert sorted(flags) == sorted(ROOT_FLAGS)
    code = ("import sys; from laggard.cli.base import main; main(['--no-cache', 'whatif', '--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('laggard.cli.')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "['laggard.cli.analyze', 'laggard.cli.base', 'laggard.cli.options']"


def test_an_edited_importer_misses(ar: Path, cfg: JobCacheConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    import laggard.io.cache as cache_mod

    key = entry_key([ar], {"fmt": "auto"}, cfg.settle_s)
    rows = cache_mod._code_rows()
    assert any(r[0] == "io/ndtimeline/load.py" for r in rows)
    rows[0][2] += 1  # one source file's mtime moved
    monkeypatch.setattr(cache_mod, "_code_rows", lambda: rows)
    assert entry_key([ar], {"fmt": "auto"}, cfg.settle_s)[0] != key[0]  # type: ignore[index]


def test_an_unwritable_cache_is_one_line_and_the_command_runs(ar: Path, unwritable_dir: Path) -> None:
    p = _cli(["whatif", str(ar), "--fix", "all"], unwritable_dir / "cache")
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "job cache" in ln]
    assert len(lines) == 1 and "could not write" in lines[0] and "Traceback" not in p.stderr


def test_the_listing_names_each_entry_by_its_absolute_path(ar: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    assert _cli(["whatif", ar.name, "--fix", "all"], cache_dir, cwd=ar.parent).returncode == 0  # a relative path
    listing = _cli(["cache"], cache_dir, cwd=tmp_path)
    assert listing.returncode == 0 and f"  {ar}" in listing.stdout
