"""`make test` keeps the modules that start real multi-rank jobs apart (``tests/conftest.py``,
``REAL_JOB_MODULES``: one at a time, on one pytest worker). A module that starts ranks and is not listed
would run beside another such job, two 4-rank jobs on two cores, where timing checks fail; a listed
module that no longer starts any only costs the split its balance."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REAL_JOB_MODULES

ROOT = Path(__file__).parent.parent
# what starts ranks in this suite: the demo's launcher, the collectives' and the profiler jobs' helpers, the
# Flight Recorder jobs, torch's spawn, a process group made here, the demo command run in a subprocess
STARTS_RANKS = re.compile(r"\b(run_jobs?|run_workers|make_traces(_in_subprocess)?)\b|\bmp\.spawn\(|init_process_group\("
                          r"|\bflight_jobs\b|\"demo\", \"--|run_cli\(\"demo\"")


def _starting() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
            if p.name != Path(__file__).name and STARTS_RANKS.search(p.read_text())}


def test_every_module_that_starts_ranks_is_kept_apart() -> None:
    missing = sorted(_starting() - REAL_JOB_MODULES)
    assert not missing, f"add {missing} to REAL_JOB_MODULES in tests/conftest.py"


def test_every_module_kept_apart_starts_ranks() -> None:
    idle = sorted(REAL_JOB_MODULES - _starting())
    assert not idle, f"{idle} start no ranks: take them out of REAL_JOB_MODULES in tests/conftest.py"
