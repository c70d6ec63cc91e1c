"""benchmarks/gpu_check.py stays runnable for the next GPU session (device time is scarce): its dry
run on the CPU (``GPU_CHECK_DEVICE=cpu``: host clocks for events, CPU ranges for CUPTI's) goes
through every part that needs no GPU and writes its report. It proves nothing about CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(500)
def test_gpu_check_dry_run_covers_its_parts(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), str(tmp_path), "timing",
                        "overhead", "job", "autotrace"], capture_output=True, text=True, timeout=480, env=env)
    assert p.returncode in (0, 1), p.stderr[-3000:]  # 1: a figure missed its target (CPU timings)
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(doc) == {"timing", "overhead", "job", "autotrace"}
    assert not [k for k, v in doc.items() if "error" in v], doc
    assert doc["timing"]["ops_compared"] == doc["timing"]["ops_expected"] == 90
    assert doc["overhead"]["traced_ns_per_op"] > 0
    for which in ("tracer", "profiler"):  # both traces of the 2-process job analyzed from the CLI
        assert doc["job"][which]["verdict"] in ("healthy", "straggling"), doc["job"]
