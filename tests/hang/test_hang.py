"""`laggard hang` on real gloo jobs with the Flight Recorder on (examples/flight_jobs.py, run once
per session: every scenario's ranks at once), checked against how each job was broken."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from laggard.collectives.launch import free_port
from tests.conftest import run_cli

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ["healthy", "late", "skip", "size", "stuck", "killed", "pp", "dppp"]


@pytest.fixture(scope="session")
def jobs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("flight")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    subprocess.run([sys.executable, str(ROOT / "examples" / "flight_jobs.py"), str(out), *SCENARIOS], env=env,
                   check=True, timeout=240)
    return out


def _truth(jobs: Path, name: str) -> dict:
    return json.loads((jobs / name / "truth.json").read_text())


@pytest.mark.parametrize("name", SCENARIOS)
def test_verdict_and_culprits_from_the_cli(jobs: Path, name: str, tmp_path: Path) -> None:
    truth = _truth(jobs, name)
    out = tmp_path / "v.json"
    assert run_cli("hang", jobs / name / "trace", "--json", out) == 0
    got = json.loads(out.read_text())
    assert (got["verdict"], got["culprit_ranks"]) == (truth["verdict"], truth["culprit_ranks"]), got["evidence"]
    if truth["group_ranks"] is not None:
        assert got["group_ranks"] == truth["group_ranks"]
        assert got["op"] == truth["op"]
    assert got["evidence"]


def test_stuck_rank_is_in_compute_and_pp_receiver_blocked_on_the_silent_stage(jobs: Path) -> None:
    from laggard.hang import analyze_hang

    stuck = analyze_hang([jobs / "stuck" / "trace"])
    assert stuck.ranks[2]["where"]["state"] == "compute"
    assert any("rank 2:" in e and "in compute" in e for e in stuck.evidence)
    pp = analyze_hang([jobs / "pp" / "trace"])
    assert pp.ranks[2]["where"]["peer"] == 1
    assert pp.ranks[2]["where"]["state"] == "p2p_recv"


def test_pp_evidence_names_the_culprit_the_gap_waits_on(jobs: Path) -> None:
    """Rank 1 skipped its send: rank 2 never reached the all-reduce because it waits in recv for
    rank 1. The gap's evidence says so, and names the culprit, not only the rank that never came."""
    from laggard.hang import analyze_hang

    pp = analyze_hang([jobs / "pp" / "trace"])
    assert pp.culprit_ranks == [1]
    gap = next(e for e in pp.evidence if "never reached it" in e)
    assert gap.endswith("ranks [2] never reached it: rank 2 is blocked in recv from rank 1, and rank 1 never "
                        "posted the send rank 2 waits for"), gap
    assert any(e.startswith("rank 1:") and e.endswith("(it never posted the send rank 2 waits for)")
               for e in pp.evidence), pp.evidence


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n in ("skip", "stuck", "killed", "pp", "dppp")])
def test_every_gap_leads_to_a_culprit(jobs: Path, name: str) -> None:
    """A gap whose missing ranks are not culprits names the chain of waits that ends at one."""
    from laggard.hang import analyze_hang

    rep = analyze_hang([jobs / name / "trace"])
    for e in (e for e in rep.evidence if "never reached it" in e):
        lacking = [int(x) for x in e.split("; ranks [")[-1].split("]")[0].split(", ")]
        if not set(lacking) <= set(rep.culprit_ranks):
            assert any(f"for rank {c}" in e or f"from rank {c}" in e for c in rep.culprit_ranks), e


def test_plain_torch_dumps_rank_from_file_name_and_json(jobs: Path, tmp_path: Path) -> None:
    """Strip laggard's additions (a dump as torch writes it on gloo), mix pickle and JSON, odd names."""
    src = jobs / "skip" / "trace"
    for i, f in enumerate(sorted(src.glob("flight-rank*.pkl"))):
        d = pickle.loads(f.read_bytes())
        rank = d.pop("laggard")["rank"]
        d["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        if i % 2:
            (tmp_path / f"node-a_trace.{rank}.json").write_text(json.dumps(d))
        else:
            (tmp_path / f"x{rank}").write_bytes(pickle.dumps(d))
    out = tmp_path / "v.json"
    assert run_cli("hang", tmp_path, "--json", out) == 0
    got = json.loads(out.read_text())
    assert (got["verdict"], got["culprit_ranks"]) == ("hang", [1])


def test_wrapped_buffer_is_matched_by_sequence_id(jobs: Path, tmp_path: Path) -> None:
    """Keep only each rank's newest entries, a different number per rank (buffers wrap unevenly)."""
    for f in sorted((jobs / "size" / "trace").glob("flight-rank*.pkl")):
        d = pickle.loads(f.read_bytes())
        d["entries"] = d["entries"][-(2 + d["laggard"]["rank"]):]
        (tmp_path / f.name).write_bytes(pickle.dumps(d))
    from laggard.hang import analyze_hang

    rep = analyze_hang([tmp_path])
    assert (rep.verdict, rep.culprit_ranks) == ("desync", [3])
    assert any("wrapped" in n for n in rep.notes)


def test_bad_inputs_one_line_each(jobs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = jobs / "skip" / "trace"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "empty.pkl").write_bytes(b"")
    (bad / "trunc.pkl").write_bytes((good / "flight-rank0.pkl").read_bytes()[:200])
    (bad / "other.json").write_text('{"hello": 1}')
    for f in sorted(bad.iterdir()):
        assert run_cli("hang", f) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("laggard: error:") and f.name in err[0]
    other_job = jobs / "late" / "trace" / "flight-rank0.pkl"
    dup = tmp_path / "copy-of-rank2.pkl"
    dup.write_bytes((good / "flight-rank2.pkl").read_bytes())
    out = tmp_path / "v.json"
    assert run_cli("hang", good, bad, other_job, dup, "--json", out) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5, err
    assert sum("another job" in e for e in err) == 1 and sum("duplicate rank 2" in e for e in err) == 1
    got = json.loads(out.read_text())
    assert (got["verdict"], got["culprit_ranks"]) == ("hang", [1])
    assert run_cli("hang", bad) == 2
    assert run_cli("hang", tmp_path / "nope") == 2


def test_dump_on_request_file_and_sigterm(tmp_path: Path) -> None:
    """The tracer dumps when `flight-dump-request` appears and when it gets SIGTERM."""
    script = tmp_path / "job.py"
    script.write_text(f"""
import os, sys, time, signal, datetime
sys.path.insert(0, {str(ROOT / 'src')!r})
from laggard.tracer.flight import enable
enable(32)
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
from laggard.tracer import Tracer
t = Tracer({str(tmp_path / 'trace')!r}, align=None)
with t.step(0):
    t.all_reduce(torch.ones(4))
    open({str(tmp_path / 'trace' / 'flight-dump-request')!r}, "w").close()
    for _ in range(100):
        if os.path.exists({str(tmp_path / 'trace' / 'flight-rank0.pkl')!r}):
            break
        time.sleep(0.1)
    print("requested", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
""")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "requested" in p.stdout, p.stderr[-2000:]
    d = pickle.loads((tmp_path / "trace" / "flight-rank0.pkl").read_bytes())
    assert d["laggard"]["reason"] == "terminated"  # the SIGTERM dump replaced the requested one
    assert [e["profiling_name"] for e in d["entries"]][-1] == "gloo:all_reduce"


def _state_only(rank: int, world: int, calls: int, *, pending: bool, where: str) -> dict:
    """A hang report as laggard.tracer.flight.report makes it with the Flight Recorder off."""
    comm = {"name": "grads-all-reduce", "kind": "collective", "group": "world", "seq": calls, "step": 4,
            "peer": -1, "start_unix_ns": 10**18 + rank} if pending else None
    return {"version": "laggard-tracer-state", "entries": [], "pg_config": {},
            "laggard": {"rank": rank, "world_size": world, "fr": False, "reason": "test", "dump_unix_ns": 2 * 10**18,
                        "where": {"state": where}, "step": 4, "group_calls": {"world": calls, "p2p:0>1": 3},
                        "group_last": {"world": "grads-all-reduce"}, "comm": comm}}


def test_recorder_off_the_tracer_states_give_the_verdict(tmp_path: Path) -> None:
    """No Flight Recorder entries at all: the collectives laggard's tracer counted per group line the
    ranks up (rank 2 stuck in compute after 4 all_reduces, the others inside the 5th)."""
    for r in range(4):
        stuck = r == 2
        (tmp_path / f"flight-rank{r}.json").write_text(json.dumps(
            _state_only(r, 4, 4 if stuck else 5, pending=not stuck, where="compute" if stuck else "collective")))
    out = tmp_path / "v.json"
    assert run_cli("hang", tmp_path, "--json", out) == 0
    got = json.loads(out.read_text())
    assert (got["verdict"], got["culprit_ranks"], got["group"], got["group_ranks"], got["op"], got["seq"]) == \
        ("hang", [2], "world", [0, 1, 2, 3], "grads-all-reduce", 5), got
    assert any("Flight Recorder off" in n for n in got["notes"])
    # a rank that sent nothing is missing: the others wait for it
    (tmp_path / "flight-rank2.json").unlink()
    assert run_cli("hang", tmp_path, "--json", out) == 0
    got = json.loads(out.read_text())
    assert (got["verdict"], got["culprit_ranks"], got["missing_ranks"]) == ("missing-ranks", [2], [2]), got
