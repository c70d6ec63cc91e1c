"""Behaviour pin for the Kineto importer: the op table of every shipped trace, byte for byte.

``tests/data/kineto/golden.json`` holds a SHA-256 of each trace's op table (Arrow IPC bytes) and
the metadata laggard derives, computed with the importer as it was before ``build_rank`` was split
(``python tests/test_kineto_golden.py --write`` regenerates it; do that only for a deliberate
change of the imported ops, and say so in the commit).
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path

import pytest

KT = Path(__file__).parents[1] / "data" / "kineto"
GOLDEN = KT / "golden.json"
# every shipped trace: single files, and the four-rank DDP job as one job (the other ddp_* and the pipe4_*
# jobs are checked by what they are kept for)
TRACES = sorted(
    [p.relative_to(KT).as_posix() for p in KT.rglob("*.json.gz") if not p.parent.name.startswith(("ddp_", "pipe4_"))]
    + ["ddp_gloo"]
)
# metadata that describes the ops (timing of the decode itself is left out)
_META_KEYS = ("clock_offsets_s", "clock_domains", "declared_world_size", "devices", "collectives_from",
              "process_groups", "num_bytes", "num_events")


def digest(rel: str) -> dict:
    import pyarrow as pa

    from laggard.errors import LaggardWarning
    from laggard.io.kineto.load import read_kineto

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaggardWarning)
        job = read_kineto(KT / rel, workers=1)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, job.table.schema) as w:
        w.write_table(job.table)
    meta = {k: job.meta.extra.get(k) for k in _META_KEYS}
    return {
        "table_sha256": hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest(),
        "num_ops": job.table.num_rows,
        "meta_sha256": hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest(),
        "sizes": [job.meta.dp_size, job.meta.pp_size, job.meta.tp_size, job.meta.world_size],
        "warnings": sorted(str(w.message) for w in caught if issubclass(w.category, LaggardWarning)),
    }


@pytest.mark.parametrize("rel", TRACES)
def test_op_table_is_unchanged(rel: str) -> None:
    want = json.loads(GOLDEN.read_text())[rel]
    got = digest(rel)
    assert got["num_ops"] == want["num_ops"]
    assert got["sizes"] == want["sizes"]
    assert got["table_sha256"] == want["table_sha256"]
    assert got["meta_sha256"] == want["meta_sha256"]
    # warnings name the file by path: compare them relative to the data directory
    assert [w.replace(str(KT) + "/", "") for w in got["warnings"]] == want["warnings"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    out = {}
    for rel in TRACES:
        d = digest(rel)
        d["warnings"] = [w.replace(str(KT) + "/", "") for w in d["warnings"]]
        out[rel] = d
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
