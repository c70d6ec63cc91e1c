"""Host identity from profiler traces (``laggard.io.kineto.devices``): ``host_name`` and the
``deviceProperties`` entry of the GPU a rank's kernels ran on, where the trace has them."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

from laggard.io import load_job
from tests.conftest import DATA

KT = DATA / "kineto"


def _load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_job(path)


def test_host_names_of_a_real_cpu_job():
    job = _load(KT / "ddp_gloo")
    assert job.meta.extra["hosts"] == [{"rank": r, "host": "vm"} for r in range(4)]


def test_gpu_of_a_real_nccl_trace_without_uuid():
    job = _load(KT / "nccl_parser_config" / "nccl_data.json.gz")
    assert job.meta.extra["hosts"] == [{"rank": 0, "gpu_name": "NVIDIA A100-PG509-200"}]


def test_uuid_and_pci_bus_id_where_the_trace_has_them(tmp_path):
    doc = json.loads(gzip.decompress((KT / "nccl_parser_config" / "nccl_data.json.gz").read_bytes()))
    for d in doc["deviceProperties"]:
        d.update(uuid=f"abcd-{d['id']}", pciBusID=0x10 + d["id"], pciDomainID=0, pciDeviceID=0)
    doc["host_name"] = "gpu-node-07"
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    job = _load(tmp_path / "rank0.json")
    (entry,) = job.meta.extra["hosts"]
    gpu_ids = {int(e["pid"]) for e in doc["traceEvents"] if e.get("cat") == "kernel" and str(e.get("pid")).isdigit()}
    dev = min(gpu_ids)
    assert entry["host"] == "gpu-node-07" and entry["gpu_uuid"] == f"GPU-abcd-{dev}"
    assert entry["pci_bus_id"] == f"00000000:{0x10 + dev:02X}:00.0"


def test_no_identity_in_the_trace_is_no_hosts():
    job = _load(KT / "cpu_only")
    assert "hosts" not in job.meta.extra
