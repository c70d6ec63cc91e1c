"""A pure 4-stage pipeline over blocking send/recv, profiled with torch.profiler: gloo names no
peers without ``record_shapes``, and the ranks further down the pipeline pair almost as well as the
next one with a small model (a hop is well under a millisecond), so a chain search can call it two
pipelines in lockstep and read the job as dp 4 ("cannot judge"). Real traces in
``tests/data/kineto/pipe4_send_recv*`` (README there): rank 2's forward sleeps 10 ms a microbatch.
"""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from laggard.errors import LaggardWarning

KT = Path(__file__).parents[1] / "data" / "kineto"


def _load(path: Path):  # noqa: ANN202
    from laggard.io import load_job

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        job = load_job(path)
    return job, [str(w.message) for w in caught if issubclass(w.category, LaggardWarning)]


def _coords(job) -> dict[int, tuple[int, int]]:  # noqa: ANN001
    cols = {c: job.table.column(c).to_pylist() for c in ("rank", "dp_rank", "pp_rank")}
    return dict(zip(cols["rank"], zip(cols["dp_rank"], cols["pp_rank"], strict=True), strict=True))


def test_pipeline_without_peers_is_inferred() -> None:
    job, warns = _load(KT / "pipe4_send_recv")
    layout = job.meta.extra["layout"]
    assert (job.meta.dp_size, job.meta.pp_size) == (1, 4), layout
    assert layout["source"] == "p2p-matched", layout
    assert _coords(job) == {r: (0, r) for r in range(4)}
    st = job.meta.extra["p2p"]
    assert st["ops"] == st["matched"] > 0 and st["unmatched"] == 0, st
    assert not [w for w in warns if "layout" in w or "not matched" in w], warns


def test_slow_stage_is_named(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    assert run_cli("--no-cache", "analyze", KT / "pipe4_send_recv", "--json", tmp_path / "a.json", "-q") == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["verdict"] == "straggling", doc.get("reason")
    assert max(doc["by_worker"], key=lambda w: w["slowdown"])["rank"] == 2, doc["by_worker"]
    assert [w["rank"] for w in doc["findings"][0]["workers"]] == [2], doc["findings"][0]


def _drop_peers(src: Path, dst: Path) -> Path:
    """Each rank file of ``src`` as if recorded without shapes: no peers, no payload sizes on the transfers."""
    dst.mkdir()
    for f in sorted(src.glob("rank*.json.gz")):
        d = json.loads(gzip.decompress(f.read_bytes()))
        for e in d["traceEvents"]:
            if str(e.get("name", "")).startswith(("c10d::send", "c10d::recv", "gloo:send", "gloo:recv")):
                for k in ("Concrete Inputs", "Input Dims", "Input type", "Input Strides"):
                    e.get("args", {}).pop(k, None)
        (dst / f.name).write_bytes(gzip.compress(json.dumps(d).encode()))
    return dst


@pytest.mark.parametrize("name", ["pipe4_send_recv_shapes"])
def test_matched_pairs_are_the_peers_pairs(name: str, tmp_path: Path) -> None:
    """The run recorded with shapes names every transfer's peer; without them, matching recovers the
    same op table, byte for byte."""
    with_peers, _ = _load(KT / name)
    assert with_peers.meta.extra["layout"]["source"] == "p2p-peers"
    without, _ = _load(_drop_peers(KT / name, tmp_path / "no-peers"))
    assert without.meta.extra["layout"]["source"] == "p2p-matched", without.meta.extra["layout"]
    st = without.meta.extra["p2p"]
    assert st["matched"] == st["ops"] == st["peers_inferred"] > 0, st
    for col in ("rank", "dp_rank", "pp_rank", "step", "name", "kind", "start_ns", "dur_ns", "group", "seq", "peer"):
        assert without.table.column(col).to_pylist() == with_peers.table.column(col).to_pylist(), col
