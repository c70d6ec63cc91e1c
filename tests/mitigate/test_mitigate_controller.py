"""The runtime controller's pieces in one process: the split, the thresholds, the collector's kill
switch and findings, the drain webhook and the actions file (the exchange is replaced by the rows
four ranks would send; tests/mitigate/test_mitigate_controller_dist.py runs the real one)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from laggard.errors import LaggardError
from laggard.mitigate import ActConfig, Controller, split_samples
from laggard.mitigate.controller import kill_switch_on


def test_split_is_proportional_to_speed_and_keeps_the_batch() -> None:
    assert split_samples(64, [1.0, 1.0, 1.6, 1.0], 4) == [18, 18, 11, 17]
    assert split_samples(64, [1.0] * 4, 4) == [16] * 4
    # a very slow rank stays at the floor; the others share the rest
    assert split_samples(64, [1.0, 1.0, 100.0, 1.0], 4) == [20, 20, 4, 20]
    for times in ([1.0, 2.0, 3.0], [0.3, 0.3, 0.31], [5.0, 1.0, 1.0]):
        counts = split_samples(50, times, 2)
        assert sum(counts) == 50 and min(counts) >= 2
    with pytest.raises(LaggardError):
        split_samples(7, [1.0] * 4, 2)


def test_config_mistakes_are_errors() -> None:
    with pytest.raises(LaggardError):
        ActConfig(recover_ratio=1.2, slow_ratio=1.1)
    with pytest.raises(LaggardError):
        ActConfig(every_steps=0)
    with pytest.raises(LaggardError):
        Controller(global_batch=4, dp_rank=0, dp_size=4, min_samples=2)


def test_the_environment_kill_switch() -> None:
    assert kill_switch_on({"LAGGARD_ACT": "0"}) and kill_switch_on({"LAGGARD_ACT": "off"})
    assert not kill_switch_on({}) and not kill_switch_on({"LAGGARD_ACT": "1"})


class _Collector:
    """A stand-in for the collector: GET /api/v1/jobs/j answers ``doc``, POSTs are kept."""

    def __init__(self) -> None:
        self.doc: dict = {"act": True, "findings": []}
        self.posts: list[tuple[str, object]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self._answer(outer.doc)

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("content-length") or 0)
                outer.posts.append((self.path, json.loads(self.rfile.read(n))))
                self._answer({"ok": True})

            def _answer(self, doc: object) -> None:
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def collector():
    c = _Collector()
    yield c
    c.server.shutdown()


def _drive(ctl: Controller, per_sample: list[float], steps: range, link=None) -> None:  # noqa: ANN001
    """Steps with the exchange replaced by what four ranks with these times per sample would send."""
    def rows() -> list[list[float]]:
        allowed = 0.0 if link is not None and not link.act else 1.0
        bits = float(link.bits) if link is not None else 0.0
        return [[float(d), c * t * ctl.cfg.every_steps, float(c * ctl.cfg.every_steps), 0.1 * ctl.cfg.every_steps,
                 float(ctl.cfg.every_steps), allowed, bits, 1.0] for d, (c, t) in enumerate(zip(ctl.counts, per_sample,
                                                                                                 strict=True))]

    ctl._exchange = rows  # type: ignore[method-assign]
    for k in steps:
        if link is not None:
            link.poll()
        ctl.step(k, 0.1)


def test_collector_findings_kill_switch_and_dashboard(collector: _Collector, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    ctl = Controller(global_batch=64, dp_rank=0, dp_size=4, min_samples=4, actions_path=path,
                     collector_url=collector.url, job_id="j", token="t")
    ctl.link.stop()  # polled by hand below, for a deterministic test
    collector.doc = {"act": True, "findings": [{"cause": "gc"}, {"cause": "worker"}]}
    _drive(ctl, [1e-3] * 4, range(10), ctl.link)
    assert ctl.planned_gc and [a.kind for a in ctl.actions] == ["planned-gc"]
    assert json.loads(path.read_text())[0]["kind"] == "planned-gc"
    assert collector.posts and collector.posts[-1][0] == "/api/v1/jobs/j/actions"
    # the collector's act: false: the slow rank is left alone
    collector.doc = {"act": False, "findings": [{"cause": "sequence-imbalance"}]}
    _drive(ctl, [1e-3, 1e-3, 2e-3, 1e-3], range(10, 40), ctl.link)
    assert [a.kind for a in ctl.actions] == ["planned-gc"] and not ctl.shifted
    collector.doc = {"act": True, "findings": []}
    _drive(ctl, [1e-3, 1e-3, 2e-3, 1e-3], range(40, 60), ctl.link)
    assert [a.kind for a in ctl.actions] == ["planned-gc", "rebalance"] and ctl.counts[2] < 16
    ctl.close()
    doc = json.loads(path.read_text())
    assert [d["kind"] for d in doc] == ["planned-gc", "rebalance"]
    assert set(doc[1]) >= {"step", "kind", "ranks", "reason", "step_s_before", "step_s_after"}


def test_a_rank_too_slow_to_absorb_is_drained_through_the_webhook(collector: _Collector) -> None:
    ctl = Controller(global_batch=64, dp_rank=0, dp_size=4, min_samples=4, webhook_url=collector.url + "/hook")
    _drive(ctl, [1e-3, 1e-3, 1e-3, 5e-3], range(30))
    kinds = [a.kind for a in ctl.actions]
    assert kinds[:2] == ["rebalance", "drain"] and kinds.count("drain") == 1
    drain = ctl.actions[1]
    assert drain.ranks == [3] and drain.evidence["ratio_to_median"][3] == pytest.approx(5.0)
    path, body = collector.posts[0]
    assert path == "/hook" and body["action"] == "drain" and body["ranks"] == [3]


def test_with_two_ranks_the_slow_one_is_measured_against_the_other() -> None:
    """The median of two ranks is their mean: a 1.2x rank would read 1.09x against it and be left alone."""
    ctl = Controller(global_batch=32, dp_rank=0, dp_size=2, min_samples=4)
    _drive(ctl, [1e-3, 1.2e-3], range(10))
    assert [a.kind for a in ctl.actions] == ["rebalance"] and ctl.counts == [17, 15]
    assert ctl.actions[0].evidence["ratio_to_median"] == [pytest.approx(1 / 1.2, abs=1e-3), 1.2]


def test_ranks_not_found_slow_share_their_part_evenly() -> None:
    """Noise between healthy ranks (under slow_ratio) does not make one of them carry more: the first
    split of a 1.6x rank among 4 is the speed split of (1, 1, 1.6, 1), not of the noisy readings."""
    noisy = [0.93e-3, 1.0e-3, 1.6e-3, 1.06e-3]
    ctl = Controller(global_batch=64, dp_rank=0, dp_size=4, min_samples=4)
    _drive(ctl, noisy, range(10))
    assert [a.kind for a in ctl.actions] == ["rebalance"] and ctl.counts == [18, 18, 11, 17]
    raw = Controller(global_batch=64, dp_rank=0, dp_size=4, min_samples=4, config=ActConfig(pool_healthy=False))
    _drive(raw, noisy, range(10))
    assert raw.counts == split_samples(64, noisy, 4) != [18, 18, 11, 17]
