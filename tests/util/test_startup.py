"""Process start-up settings (``laggard.startup``): freed memory is reused, not faulted in again.

Each check runs in a fresh interpreter (the settings are per process and numpy reads its huge-page
setting once, when imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_PROBE = r"""
import json, resource, sys
if sys.argv[1] == "on":
    from laggard.startup import lean_process
    lean_process()
import numpy as np
from numpy._core.multiarray import _get_madvise_hugepage

def touch():
    a = np.empty(64 * 2**20, dtype=np.uint8)
    a[::4096] = 1  # one write per page: every page faulted in
    return a

touch()  # the first one is always new memory
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    touch()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
print(json.dumps({"faults": faults, "hugepage": bool(_get_madvise_hugepage())}))
"""


def _probe(mode: str, **env: str) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("NUMPY_MADVISE_HUGEPAGE",) and not k.startswith("MALLOC_")}
    e.update(env)
    p = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, env=e, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_arrays_are_reused_not_faulted_in_again():
    off, on = _probe("off"), _probe("on")
    # five more 64 MiB arrays: by default each is mapped afresh (16k pages, or 32 huge pages, each);
    # with the settings the freed one is handed out again, already in memory
    assert on["faults"] < 200, on
    assert off["faults"] > 5 * 30, off
    assert on["hugepage"] is False


def test_the_users_own_settings_win():
    assert _probe("on", NUMPY_MADVISE_HUGEPAGE="1")["hugepage"] is True
    # their own malloc tuning (here: glibc's defaults asked for explicitly) is left as they set it
    assert _probe("on", MALLOC_MMAP_THRESHOLD_="131072")["faults"] > 5 * 30
