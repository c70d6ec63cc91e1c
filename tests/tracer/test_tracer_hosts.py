"""Host identity in job.json: the Tracer records every rank's host name and, on GPU, the device's
UUID and PCI bus id (``laggard.tracer._env``); the analysis document and the fleet rows keep them.
No GPU here: the CUDA path is checked on a fake ``torch.cuda.get_device_properties`` (with and
without the attributes older torch builds lack)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from laggard.tracer import Tracer, _env

torch = pytest.importorskip("torch")


def _trace(out: Path) -> None:
    with Tracer(out, name="hosts", dp_rank=0, pp_rank=0, record_gc=False) as t:
        for step in range(3):
            with t.step(step), t.op("forward-compute"):
                pass


def test_job_json_names_the_host_and_the_analysis_keeps_it(tmp_path):
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    _trace(tmp_path / "t")
    meta = json.loads((tmp_path / "t" / "job.json").read_text())
    assert meta["extra"]["hosts"] == [{"rank": 0, "host": socket.gethostname()}]
    doc = analyze(load_job(tmp_path / "t")).to_json()
    assert doc["meta"]["hosts"] == [{"rank": 0, "host": socket.gethostname()}]


class _Props(SimpleNamespace):
    pass


def _fake_cuda(monkeypatch, props):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)

    def get(dev):
        assert dev == 3
        if isinstance(props, Exception):
            raise props
        return props

    monkeypatch.setattr(torch.cuda, "get_device_properties", get)


def test_gpu_identity_from_device_properties(monkeypatch):
    _fake_cuda(monkeypatch, _Props(name="NVIDIA H100 80GB HBM3", uuid="8f6b1d2e-1111-2222-3333-444455556666",
                                   pci_bus_id=0x1B, pci_domain_id=0, pci_device_id=0))
    assert _env.gpu_identity() == {"gpu_name": "NVIDIA H100 80GB HBM3",
                                   "gpu_uuid": "GPU-8f6b1d2e-1111-2222-3333-444455556666",
                                   "pci_bus_id": "00000000:1B:00.0"}
    monkeypatch.setattr(_env, "_cuda_in_use", lambda: True)
    ids = _env.host_identity()
    assert ids["host"] == socket.gethostname() and ids["pci_bus_id"] == "00000000:1B:00.0"


def test_gpu_identity_tolerates_older_torch_and_errors(monkeypatch):
    _fake_cuda(monkeypatch, _Props(name="Tesla V100"))  # no uuid, no pci_* attributes
    assert _env.gpu_identity() == {"gpu_name": "Tesla V100"}
    _fake_cuda(monkeypatch, RuntimeError("no CUDA GPUs are available"))
    assert _env.gpu_identity() == {}


def test_job_meta_hosts_from_gathered_rows():
    from laggard.tracer.clock import local_sync

    rows = [(0, 0, 0, -1, -1, {"host": "n1", "gpu_uuid": "GPU-a"}), (1, 1, 0, -1, -1, {"host": "n2"}),
            (2, 0, 1, -1, -1, {}), (3, 1, 1, -1, -1)]  # a rank with nothing known; a row without identity
    meta = _env._job_meta("j", rows, 4, local_sync(lambda: 0), False, {})
    assert meta.extra["hosts"] == [{"rank": 0, "host": "n1", "gpu_uuid": "GPU-a"}, {"rank": 1, "host": "n2"}]
    assert meta.dp_size == 2 and meta.pp_size == 2
