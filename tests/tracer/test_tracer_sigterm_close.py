"""A SIGTERM that lands while the tracer is closing waits for the close: the last page and the final
status are written, then the process ends as SIGTERM ends it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from laggard.tracer import Tracer
    t = Tracer(sys.argv[1], rank=0, world_size=1, flush_interval_s=1e6)
    for step in range(3):
        with t.step(step), t.op("forward-compute"):
            time.sleep(0.001)
    close = t._writer.close
    def interrupted_close(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at the next bytecode: inside the close
        time.sleep(0.05)
        return close(*a, **k)
    t._writer.close = interrupted_close
    t.close()
    print("after close", flush=True)  # never reached: the deferred SIGTERM ends the process
""")


def test_sigterm_during_close_keeps_the_last_page(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "trace")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == -signal.SIGTERM, (r.returncode, r.stderr)
    assert "after close" not in r.stdout
    state = json.loads((tmp_path / "trace" / "rank0.state.json").read_text())
    assert state["status"] == "closed" and state["num_ops_recorded"] >= 3, state
    assert list((tmp_path / "trace").glob("ops-rank0-*.parquet"))
