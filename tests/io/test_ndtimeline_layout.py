"""NDTimeline layouts the trace does not see: tp, cp, dsp and ep multiply GPUs, never DP ranks."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.cli.test_bad_input import _one_line_error
from tests.conftest import ND, run_cli


def _variant(tmp_path, name: str, **changes) -> tuple:
    """The published trace ``name`` beside a copy of its meta with ``changes`` (None deletes a key)."""
    trace = tmp_path / f"trace-{name}.parquet"
    shutil.copy(ND / f"trace-{name}.parquet", trace)
    meta = yaml.safe_load((ND / f"meta-{name}.yaml").read_text())
    for k, v in changes.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    (tmp_path / f"meta-{name}.yaml").write_text(yaml.safe_dump(meta))
    return trace


def _analyze(capsys, tmp_path, trace) -> dict:
    out = tmp_path / f"{trace.stem}.json"
    code = run_cli("analyze", trace, "--json", out, "-q")
    err = capsys.readouterr().err
    assert code == 0, err
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def ar_plain(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plain") / "ar.json"
    assert run_cli("analyze", ND / "trace-AR.parquet", "--json", out, "-q") == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("world", [128, None])
def test_dsp_doubles_gpus_not_dp_ranks(capsys, tmp_path, ar_plain, world):
    # the published AR job is dp 4 x pp 4 x tp 4 = 64 GPUs; with dsp 2 it is 128 GPUs, same trace
    d = _analyze(capsys, tmp_path, _variant(tmp_path, "AR", dsp_size=2, world_size=world))
    assert ar_plain["num_gpus"] == 64
    assert d["num_gpus"] == 128
    assert d["meta"]["dsp"] == 2 and d["meta"]["dp"] == 4 and d["meta"]["world_size"] == 128
    assert d["gpu_hours"] == pytest.approx(2 * ar_plain["gpu_hours"], rel=1e-12)
    assert d["gpu_hours_wasted"] == pytest.approx(2 * ar_plain["gpu_hours_wasted"], rel=1e-12)
    assert d["by_dp_rank"] == ar_plain["by_dp_rank"]
    assert d["num_workers"] == ar_plain["num_workers"]
    assert d["slowdown"] == ar_plain["slowdown"]


def test_cp_and_ep_multiply_gpus(capsys, tmp_path):
    # ST: dp 2 x pp 4 x tp 1 = 8 GPUs; cp 2 and ep 3 make 48
    d = _analyze(capsys, tmp_path, _variant(tmp_path, "ST", cp_size=2, ep_size=3, world_size=48))
    assert d["num_gpus"] == 48 and d["meta"]["cp"] == 2 and d["meta"]["ep"] == 3 and d["meta"]["dp"] == 2


def test_world_size_must_be_the_product(capsys, tmp_path):
    trace = _variant(tmp_path, "AR", dsp_size=2, world_size=64)
    line = _one_line_error(capsys, "analyze", trace)
    assert "world_size=64 is not dp_size*pp_size*tp_size*cp_size*dsp_size*ep_size = 4*4*4*1*2*1 = 128" in line


def test_dp_size_counts_trace_dp_ranks_only(capsys, tmp_path):
    # a meta that folds dsp into dp_size contradicts the trace's DP ranks
    trace = _variant(tmp_path, "AR", dp_size=8, dsp_size=2, world_size=256)
    assert "says dp_size=8 but the trace has 4 DP rank(s)" in _one_line_error(capsys, "analyze", trace)


def test_ep_size_must_be_positive(capsys, tmp_path):
    trace = _variant(tmp_path, "ST", ep_size=0)
    assert "ep_size must be a positive integer" in _one_line_error(capsys, "analyze", trace)


def test_plain_meta_reads_what_yaml_reads():
    """A plain ``key: value`` meta is read without yaml, to the same mapping; anything else goes to yaml."""
    import yaml

    from laggard.io.ndtimeline.meta import _plain_meta

    plain = ["trial_name: AR\nrun_id: 0\ndp_size: 4\n", "a: 0\nb: x-y\n\n", "a: 1\na: 2\n", "k: NaN\n"]
    for text in plain:
        assert _plain_meta(text) == yaml.safe_load(text)
    for text in ["a: yes\n", "y: 3\n", "a: 012\n", "a: 1 # c\n", "a: -1\n", "", "k: Null\n", "k: 1e3\n",
                 "a:\n  b: 1\n"]:
        assert _plain_meta(text) is None
