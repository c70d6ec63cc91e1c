"""A node's relay (``laggard monitor relay``) between tracers and a real collector, both real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.collectives.launch import free_port  # noqa: E402
from laggard.io import load_job  # noqa: E402
from laggard.optable.ops import JobMeta, make_table, to_numpy  # noqa: E402
from laggard.wire.batch import CONTENT_TYPE, decode_batch, encode_batch  # noqa: E402
from laggard.wire.bundle import BUNDLE_CONTENT_TYPE, encode_bundle  # noqa: E402
from laggard.wire.pack import PACK_CONTENT_TYPE, encode_pack  # noqa: E402
from tests.monitor_helpers import TOKEN, RelayProc, Server  # noqa: E402

JOB = Path(__file__).parents[1] / "monitor_tracer_job.py"
RANKS = 8


def _n_ops(rank: int) -> int:
    """Ops in each of ``rank``'s batches (3 steps): not the same on every rank, so that an answer
    handed to the wrong tracer shows."""
    return 3 * (2 + rank % 3)


def _batch(rank: int, seq: int, *, meta: bool = True, dur_ns: int = 2_000_000) -> bytes:
    per = 2 + rank % 3
    n = 3 * per
    steps = np.repeat(np.arange(3 * seq, 3 * seq + 3), per)
    t = make_table({"rank": np.full(n, rank, np.int32), "dp_rank": np.full(n, rank, np.int32), "step": steps,
                    "name": ["fwd"] * n, "kind": ["compute"] * n,
                    "start_ns": steps * 10**8 + np.tile(np.arange(per) * 3 * 10**6, 3), "dur_ns": np.full(n, dur_ns)})
    m = JobMeta(name="relayjob", world_size=RANKS, dp_size=RANKS, source="test") if meta else None
    return encode_batch(t, job_id="relayjob", rank=rank, seq=seq, meta=m)


@pytest.fixture
def stack(tmp_path):
    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    relay = RelayProc(srv.url, tmp_path, extra=["--gather-ms", "200"]).start()
    yield srv, relay
    relay.stop()
    srv.stop()


def _post_all(relay: RelayProc, bodies: list[bytes]) -> list[tuple[int, object]]:
    """All bodies posted at once, one thread each (a node's ranks flushing together)."""
    out: list = [None] * len(bodies)

    def post(i: int) -> None:
        out[i] = relay.request("POST", "/api/v1/ops", bodies[i], content_type=CONTENT_TYPE)

    ths = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return out


def test_a_node_batches_reach_the_collector_in_packs_each_answered_as_its_own(stack) -> None:
    srv, relay = stack
    answers = _post_all(relay, [_batch(r, 0) for r in range(RANKS)])
    assert [(code, ans["accepted"], ans["duplicate"]) for code, ans in answers] == [
        (200, _n_ops(r), False) for r in range(RANKS)], answers
    health = relay.request("GET", "/healthz")[1]
    assert health["batches"] == RANKS and health["bundles"] < RANKS, health  # gathered, not one request each
    detail = srv.request("GET", "/api/v1/jobs/relayjob")[1]
    assert {r["rank"]: r["num_ops"] for r in detail["ranks"]} == {r: _n_ops(r) for r in range(RANKS)}
    # a tracer's retry through the relay is a duplicate at the collector, answered as such
    code, ans = relay.request("POST", "/api/v1/ops", _batch(3, 0), content_type=CONTENT_TYPE)
    assert code == 200 and ans["duplicate"] is True and ans["accepted"] == 0
    # a bad batch is refused to its own tracer; the others of the same gathering are stored
    bodies = [_batch(r, 1, dur_ns=-5 if r == 2 else 2_000_000) for r in range(RANKS)]
    answers = _post_all(relay, bodies)
    assert answers[2][0] == 422 and "negative dur_ns" in answers[2][1]["detail"]
    assert all(code == 200 and ans["accepted"] == _n_ops(i) for i, (code, ans) in enumerate(answers) if i != 2)
    detail = srv.request("GET", "/api/v1/jobs/relayjob")[1]
    assert {r["rank"]: r["num_ops"] for r in detail["ranks"]} == {r: _n_ops(r) * (1 if r == 2 else 2)
                                                                  for r in range(RANKS)}


def test_the_relay_asks_for_the_token_and_passes_other_routes_through(stack) -> None:
    srv, relay = stack
    assert relay.request("POST", "/api/v1/ops", _batch(0, 0), content_type=CONTENT_TYPE, token=None)[0] == 401
    assert relay.request("GET", "/api/v1/jobs", token="wrong-token-0123456789")[0] == 401
    # another relay's bundle with a bad part is refused whole, saying which part (as the collector does)
    code, ans = relay.request("POST", "/api/v1/ops", encode_bundle([_batch(0, 0), _batch(1, 0, dur_ns=-1)]),
                              content_type=BUNDLE_CONTENT_TYPE)
    assert code == 422 and ans["detail"].startswith("bundle part 1:"), ans
    code, ans = relay.request("POST", "/api/v1/ops", _bad_pack(), content_type=PACK_CONTENT_TYPE)  # and its pack
    assert code == 422 and ans["detail"].startswith("pack part 1:"), ans
    assert srv.request("GET", "/api/v1/jobs")[1] == []  # nothing of it went on
    code, ans = relay.request("POST", "/api/v1/jobs/relayjob/heartbeat",
                              json.dumps({"rank": 0, "state": {}, "meta": JobMeta(
                                  name="relayjob", world_size=RANKS, dp_size=RANKS).to_json()}).encode())
    assert code == 200 and ans["tracing"] is True
    assert relay.request("GET", "/api/v1/jobs")[1] == srv.request("GET", "/api/v1/jobs")[1]
    code, ans = relay.request("GET", "/api/v1/jobs/nosuchjob")
    assert code == 404 and "nosuchjob" in ans["detail"]  # the collector's own answer, status included


def test_relays_stack_a_racks_relay_over_its_nodes_relays(tmp_path) -> None:
    """Two nodes' relays post their packs to a rack's relay, which posts the collector packs of both
    nodes: every tracer gets its own batch's answer back through both relays."""
    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    rack = RelayProc(srv.url, tmp_path, extra=["--gather-ms", "300"]).start()
    nodes = [RelayProc(rack.url, tmp_path, extra=["--gather-ms", "100"]).start() for _ in range(2)]
    try:
        out: list = [None] * RANKS

        def post(r: int) -> None:
            out[r] = nodes[r % 2].request("POST", "/api/v1/ops", _batch(r, 0), content_type=CONTENT_TYPE)

        ths = [threading.Thread(target=post, args=(r,)) for r in range(RANKS)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        assert [(code, ans["accepted"]) for code, ans in out] == [(200, _n_ops(r)) for r in range(RANKS)], out
        node_health = [n.request("GET", "/healthz")[1] for n in nodes]
        rack_health = rack.request("GET", "/healthz")[1]
        assert [h["batches"] for h in node_health] == [RANKS // 2] * 2, node_health
        # the rack relay got the nodes' bundles (not 8 single batches) and sent fewer bundles than it got
        assert (rack_health["batches"] == RANKS
                and rack_health["bundles"] < sum(h["bundles"] for h in node_health)), rack_health
        detail = srv.request("GET", "/api/v1/jobs/relayjob")[1]
        assert {r["rank"]: r["num_ops"] for r in detail["ranks"]} == {r: _n_ops(r) for r in range(RANKS)}
        # a bad batch behind two relays is refused to its own tracer alone
        code, ans = nodes[0].request("POST", "/api/v1/ops", _batch(0, 1, dur_ns=-5), content_type=CONTENT_TYPE)
        assert code == 422 and "negative dur_ns" in ans["detail"]
    finally:
        for n in nodes:
            n.stop()
        rack.stop()
        srv.stop()


def test_a_relay_whose_collector_is_down_answers_503(tmp_path) -> None:
    relay = RelayProc(f"http://127.0.0.1:{free_port()}", tmp_path).start()
    try:
        code, ans = relay.request("POST", "/api/v1/ops", _batch(0, 0), content_type=CONTENT_TYPE)
        assert code == 503 and "down" in ans["detail"]
        assert relay.request("GET", "/api/v1/jobs")[0] == 503
    finally:
        relay.stop()


def test_a_stopped_collector_leaves_the_relay_answering(tmp_path) -> None:
    """A rack's worth of tracers' batches, and as many requests it passes through, wait on a collector
    that is stopped (its socket still takes connections): the batches hold no thread of the relay
    while they wait and the others a few, so its health check still answers."""
    import signal
    import time

    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    relay = RelayProc(srv.url, tmp_path, extra=["--gather-ms", "20"]).start()
    srv.proc.send_signal(signal.SIGSTOP)
    posts: list[threading.Thread] = []
    try:
        for r in range(64):  # each waits up to the relay's upstream timeout (30 s)
            for args in (("POST", "/api/v1/ops", _batch(r % RANKS, r // RANKS)), ("GET", "/api/v1/jobs", None)):
                t = threading.Thread(target=_quiet, args=(relay, *args), daemon=True)
                t.start()
                posts.append(t)
        time.sleep(1.0)
        t0 = time.monotonic()
        code, ans = relay.request("GET", "/healthz")
        took_s = time.monotonic() - t0
        # milliseconds; with the batches holding the server's threads, the upstream timeout
        assert code == 200 and ans["relay"] and took_s < 5.0, (code, took_s)
    finally:
        relay.stop(signal.SIGKILL)
        srv.proc.send_signal(signal.SIGCONT)
        srv.stop()


def _quiet(relay: RelayProc, method: str, path: str, body: bytes | None) -> None:
    try:
        relay.request(method, path, body, content_type=CONTENT_TYPE)
    except OSError:  # the relay killed under it
        pass


def _bad_pack() -> bytes:
    """A pack (what relays send) whose second part has a negative duration."""
    good, bad = decode_batch(_batch(0, 0)), decode_batch(_batch(1, 0))
    i = bad.table.schema.get_field_index("dur_ns")
    bad.table = bad.table.set_column(i, bad.table.schema.field(i), pa.array([-1] * bad.table.num_rows, pa.int64()))
    return encode_pack([good, bad])


def test_the_collector_refuses_a_bundle_or_pack_with_a_bad_part_whole(tmp_path) -> None:
    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    try:
        code, ans = srv.request("POST", "/api/v1/ops", _bad_pack(), content_type=PACK_CONTENT_TYPE)
        assert code == 422 and ans["detail"].startswith("pack part 1:") and "negative dur_ns" in ans["detail"], ans
        code, ans = srv.request("POST", "/api/v1/ops", b"not a pack", content_type=PACK_CONTENT_TYPE)
        assert code == 422 and "not an Arrow IPC stream" in ans["detail"]
        body = encode_bundle([_batch(0, 0), _batch(1, 0, dur_ns=-1)])
        code, ans = srv.request("POST", "/api/v1/ops", body, content_type=BUNDLE_CONTENT_TYPE)
        assert code == 422 and ans["detail"].startswith("bundle part 1:") and "negative dur_ns" in ans["detail"]
        assert srv.request("GET", "/api/v1/jobs")[1] == []  # nothing of it stored
        code, ans = srv.request("POST", "/api/v1/ops", b"not a bundle", content_type=BUNDLE_CONTENT_TYPE)
        assert code == 422 and "LAGGARD-BUNDLE" in ans["detail"]
        code, ans = srv.request("POST", "/api/v1/ops", encode_bundle([_batch(0, 0), _batch(0, 0), _batch(1, 0)]),
                                content_type=BUNDLE_CONTENT_TYPE)
        assert code == 200 and [p["duplicate"] for p in ans["parts"]] == [False, True, False]
    finally:
        srv.stop()


def test_real_tracers_stream_through_a_relay_and_lose_nothing(stack, tmp_path) -> None:
    """Two traced processes (the Tracer with its monitor stream and heartbeats) posting to the relay:
    the collector holds exactly the ops of their own Parquet trace on disk."""
    srv, relay = stack
    procs = [subprocess.Popen([sys.executable, str(JOB), relay.url, TOKEN, str(tmp_path / "trace"), str(r), "2", "40"],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(o["dropped"] == 0 and o["left"] == 0 and o["sent"] > 0 for o in outs), outs
    trace = load_job(tmp_path / "trace")
    rank = to_numpy(trace.table.column("rank"))
    detail = srv.wait_for(lambda d: d["num_ops"] == trace.num_ops, "/api/v1/jobs/faultjob")
    assert {r["rank"]: r["num_ops"] for r in detail["ranks"]} == {r: int((rank == r).sum()) for r in (0, 1)}
    health = relay.request("GET", "/healthz")[1]
    assert health["batches"] == sum(o["sent"] for o in outs) and health["bundles"] <= health["batches"]


@pytest.mark.parametrize(("args", "says"), [
    ([], "the collector's token is needed"),
    (["--token", TOKEN, "--gather-ms", "-5"], "gather time must be 0-10 s"),
    (["--token", TOKEN, "--max-parts", "0"], "max_parts must be 1-4096"),
    (["--token", TOKEN, "--url", "ftp://x"], "expected http://HOST:PORT"),
])
def test_bad_relay_flags_are_one_line_and_exit_2(args, says, capsys, monkeypatch) -> None:
    from tests.conftest import run_cli

    monkeypatch.delenv("LAGGARD_TOKEN", raising=False)
    assert run_cli("monitor", "relay", "--port", str(free_port()), *args) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_relay_that_fails_to_send_answers_503_and_keeps_going(monkeypatch) -> None:
    """A failure while making or posting a pack (a bug, not the collector) answers each waiting
    tracer 503, which it spools and retries, and the relay's sender goes on with the next batches."""
    import laggard.monitor.relay as relay_mod
    from laggard.monitor.relay import Relay, RelayConfig
    from laggard.wire.client import CollectorDown

    calls = []

    def broken(batches):
        calls.append(len(batches))
        raise RuntimeError("boom")

    monkeypatch.setattr(relay_mod, "encode_pack", broken)
    relay = Relay(f"http://127.0.0.1:{free_port()}", TOKEN, RelayConfig(gather_s=0.0)).start()
    try:
        for seq in (0, 1):  # the second is answered too: the sender thread lived
            with pytest.raises(CollectorDown, match="could not send the batch \\(boom\\)"):
                relay.submit(_batch(0, seq)).result(timeout=30)
        assert calls == [1, 1]
    finally:
        relay.close()


def test_sigterm_sends_what_the_relay_holds_then_exits_0(tmp_path) -> None:
    """SIGTERM while a batch waits in the relay's gathering window: the batch still reaches the
    collector (its tracer gets the answer), the relay exits 0, nothing is reported leaked."""
    import signal
    import time

    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    relay = RelayProc(srv.url, tmp_path, extra=["--gather-ms", "3000"]).start()
    try:
        answer: list = []
        post = threading.Thread(target=lambda: answer.append(
            relay.request("POST", "/api/v1/ops", _batch(0, 0), content_type=CONTENT_TYPE)))
        post.start()
        time.sleep(1.0)  # the batch is in the 3 s gathering window now
        assert srv.request("GET", "/api/v1/jobs")[1] == []
        relay.proc.send_signal(signal.SIGTERM)
        try:
            code = relay.proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the relay did not stop on SIGTERM: {relay.log.read_text()[-2000:]}")
        post.join(30)
        relay.proc = None
        log = relay.log.read_text()
        assert code == 0, log[-2000:]
        assert "Traceback" not in log and "leaked" not in log, log[-2000:]
        assert answer and answer[0][0] == 200 and answer[0][1]["accepted"] == _n_ops(0), answer
        detail = srv.request("GET", "/api/v1/jobs/relayjob")[1]
        assert {r["rank"]: r["num_ops"] for r in detail["ranks"]} == {0: _n_ops(0)}
    finally:
        relay.stop()
        srv.stop()
