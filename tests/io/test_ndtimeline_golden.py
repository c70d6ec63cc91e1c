"""Behaviour pin for the NDTimeline importer: the op table and metadata of both published traces.

``tests/data/ndtimeline/golden.json`` holds a SHA-256 of each trace's op table (Arrow IPC bytes)
and of the job metadata laggard derives, computed with the importer as it was before
``read_ndtimeline`` / ``_build_template`` were split by concept
(``python tests/test_ndtimeline_golden.py --write`` regenerates it; do that only for a deliberate
change of the imported ops, and say so in the commit).
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path

import pytest

ND = Path(__file__).parents[1] / "data" / "ndtimeline"
GOLDEN = ND / "golden.json"
TRACES = ("trace-AR.parquet", "trace-ST.parquet")
# the metadata fields the importer filled when the pin was written (fields added later are
# checked by their own tests, so adding one does not move the pin)
_META_FIELDS = ("name", "world_size", "dp_size", "pp_size", "tp_size", "cp_size", "vpp_size", "gpus_per_worker",
                "source", "extra")


def digest(name: str) -> dict:
    import pyarrow as pa

    from laggard.errors import LaggardWarning
    from laggard.io.ndtimeline.load import read_ndtimeline

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        job = read_ndtimeline(ND / name)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, job.table.schema) as w:
        w.write_table(job.table)
    meta = {k: getattr(job.meta, k) for k in _META_FIELDS}
    return {
        "table_sha256": hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest(),
        "num_ops": job.table.num_rows,
        "meta_sha256": hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest(),
        "warnings": sorted(str(w.message) for w in caught if issubclass(w.category, LaggardWarning)),
    }


@pytest.mark.parametrize("name", TRACES)
def test_op_table_is_unchanged(name: str) -> None:
    want = json.loads(GOLDEN.read_text())[name]
    got = digest(name)
    assert got["num_ops"] == want["num_ops"]
    assert got["table_sha256"] == want["table_sha256"]
    assert got["meta_sha256"] == want["meta_sha256"]
    assert got["warnings"] == want["warnings"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps({n: digest(n) for n in TRACES}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
