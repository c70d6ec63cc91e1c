"""torch.profiler's export leaves quotes inside event names unescaped (with_stack=True writes Python
frames as names): a real trace of the demo job had ``"name": "pyarrow/parquet/core.py(0): "",`` and
could not be read. Such a line is repaired, with a warning; other broken JSON is still an error."""

from __future__ import annotations

import gzip
import json
import re
import warnings
from pathlib import Path

import pytest

from laggard.errors import LaggardError
from laggard.io import load_job
from laggard.io.kineto import decode
from laggard.io.kineto.repair import repair_names

SRC = Path(__file__).resolve().parents[1] / "data" / "kineto" / "ddp_gloo"


def _break_names(dst: Path, pattern: bytes = rb'"name": "aten::mm",') -> Path:
    """The shipped real gloo traces with every ``aten::mm`` name written as torch writes a frame
    holding a quote: ``"name": "aten::mm "x"",``."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(SRC.glob("rank*.json.gz")):
        raw = gzip.decompress(f.read_bytes())
        assert pattern in raw
        (dst / f.name.removesuffix(".gz")).write_bytes(raw.replace(pattern, rb'"name": "aten::mm "x"",'))
    return dst


def _table(path: Path) -> tuple[list, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job = load_job(path)
    return job.table.to_pylist(), [str(w.message) for w in caught]


def test_repair_escapes_only_the_quotes_inside_a_name() -> None:
    fixed, n = repair_names(b'  {\n    "name": "f(0): "",\n    "ph": "X"\n  },\n'
                            b'  {\n    "name": "a \\"b\\"",\n    "ph": "X"\n  }')
    assert n == 1
    assert json.loads(b"[" + fixed + b"]") == [{"name": 'f(0): "', "ph": "X"}, {"name": 'a "b"', "ph": "X"}]


@pytest.mark.parametrize("chunk_bytes", [2**20, 4096])  # the whole file in one piece, and in chunks
def test_a_trace_with_unescaped_quotes_in_names_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       chunk_bytes: int) -> None:
    monkeypatch.setattr(decode, "_MIN_CHUNK_BYTES", chunk_bytes)
    bad = _break_names(tmp_path / "bad")
    with pytest.raises(json.JSONDecodeError):
        json.loads((bad / "rank0.json").read_text())  # the input really is invalid JSON
    ref, _ = _table(SRC)
    got, caught = _table(bad)
    assert got == ref  # the ops do not depend on a unit's name beyond its phase
    assert any(re.search(r"rank0\.json: \d+ event name\(s\) had unescaped quotes", m) for m in caught), caught


def test_other_broken_json_is_still_an_error(tmp_path: Path) -> None:
    bad = _break_names(tmp_path / "bad")
    raw = (bad / "rank1.json").read_bytes()
    (bad / "rank1.json").write_bytes(raw.replace(b'"ph": "X",', b'"ph": "X" "oops",', 1))
    with pytest.raises(LaggardError, match=r"rank1\.json: not valid JSON"):
        load_job(bad)
