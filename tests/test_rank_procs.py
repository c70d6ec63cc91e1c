"""The tests' wait on a job's ranks (tests/rank_procs.py): a rank that fails ends the wait, for a line or
for the end, soon rather than after its peers' timeout, and names itself; ranks that all fail on purpose
keep their codes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.rank_procs import finish_ranks, first_failure, line_from


def _rank(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_rank_that_dies_ends_the_wait_and_is_named() -> None:
    t0 = time.monotonic()
    res = finish_ranks([_rank("import time; time.sleep(600)"),
                        _rank("import sys, time; time.sleep(0.5); sys.exit('no rendezvous')")], 120, grace_s=1.0)
    assert time.monotonic() - t0 < 30
    assert [r.returncode for r in res] == [-9, 1]
    bad = first_failure(res)
    assert bad is not None and bad.startswith("rank 1 exited 1") and "no rendezvous" in bad


def test_ranks_that_all_fail_on_purpose_keep_their_codes_and_output() -> None:
    big = "print('x' * 200_000)"  # more than a pipe holds: every rank's output is drained while the others run
    res = finish_ranks([_rank(f"import sys, time; {big}; time.sleep(1.5); sys.exit(3)"),
                        _rank(f"import sys; {big}; sys.exit(3)")], 120, grace_s=30.0)
    assert [r.returncode for r in res] == [3, 3] and all(len(r.stdout) > 200_000 for r in res)
    assert first_failure(res, 3) is None
    assert first_failure(res) is not None


def test_ranks_past_the_deadline_fail_the_test_with_their_state() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"within 1 s(.|\n)*rank 0 exited -9"):
        finish_ranks([_rank("import time; time.sleep(600)")], 1)


def test_a_line_is_read_and_a_rank_that_ends_first_fails_the_wait() -> None:
    procs = [_rank("import time; print('stuck 12.5', flush=True); time.sleep(600)")]
    try:
        assert line_from(procs, 0, 60) == "stuck 12.5"
    finally:
        procs[0].kill()
    t0 = time.monotonic()
    procs = [_rank("import time; time.sleep(600)"), _rank("import sys; sys.exit('died at start-up')")]
    try:
        with pytest.raises(pytest.fail.Exception, match=r"rank 1 exited with 1 before rank 0(.|\n)*died at start-up"):
            line_from(procs, 0, 120)
    finally:
        procs[0].kill()
    assert time.monotonic() - t0 < 30
