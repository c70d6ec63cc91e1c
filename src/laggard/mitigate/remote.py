"""The controller's line to the outside: the collector's findings and kill switch, the dashboard's
action list, and the scheduler's webhook. Standard library HTTP only (``urllib``), on one rank.

``mitigate/`` sits in layer 3 beside ``wire/`` (the tracer's collector client), so it cannot import
that client; what it needs is two small JSON requests, which the standard library does without
loading httpx or the analysis stack into the training process.

* ``CollectorLink`` polls ``GET /api/v1/jobs/ID`` from a daemon thread (the training thread never
  waits on the network) and keeps the last answer: ``act`` (the collector's kill switch,
  ``PATCH /api/v1/jobs/ID {"act": false}``) and the causes of the current findings.
* ``post_actions`` sends the action log to ``POST /api/v1/jobs/ID/actions`` (the dashboard shows it).
* ``post_webhook`` sends a ``drain`` action with its evidence to a scheduler's webhook.
Failures are logged once per kind and otherwise ignored: the job trains on whatever the network does.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("laggard.mitigate.controller")

# the collector's finding causes the controller acts on, as bits of the gathered flag
FINDING_GC = 1  # "gc": planned GC on every rank
FINDING_SEQUENCE = 2  # "sequence-imbalance": balanced packing
_CAUSE_BITS = {"gc": FINDING_GC, "sequence-imbalance": FINDING_SEQUENCE}


def _request(url: str, token: str | None, body: Any = None, method: str = "GET", timeout_s: float = 5.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - a URL the user configured
        raw = resp.read()
    return json.loads(raw) if raw else None


def finding_bits(findings: list[dict[str, Any]]) -> int:
    """The causes of a detail document's findings the controller acts on, as bits."""
    bits = 0
    for f in findings or []:
        bits |= _CAUSE_BITS.get(str(f.get("cause")), 0)
    return bits


@dataclass(slots=True)
class CollectorLink:
    """Polls the collector's view of one job; ``act`` and ``bits`` are the last answer's."""

    url: str
    job_id: str
    token: str | None = None
    poll_s: float = 2.0
    act: bool = True
    bits: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _failed: set[str] = field(default_factory=set)

    def start(self) -> CollectorLink:
        self._thread = threading.Thread(target=self._run, name="laggard-act-poll", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.poll_s)

    def poll(self) -> None:
        try:
            doc = _request(f"{self.url.rstrip('/')}/api/v1/jobs/{self.job_id}", self.token)
        except Exception as e:  # noqa: BLE001 - the collector may be down or not know the job yet
            self._once("poll", f"collector poll failed ({type(e).__name__}: {e}); acting on local measurements")
            return
        if isinstance(doc, dict):
            self.act = doc.get("act", True) is not False
            self.bits = finding_bits(doc.get("findings", []))

    def post_actions(self, actions: list[dict[str, Any]]) -> None:
        try:
            _request(f"{self.url.rstrip('/')}/api/v1/jobs/{self.job_id}/actions", self.token, actions, "POST")
        except Exception as e:  # noqa: BLE001
            self._once("post", f"could not send the actions to the collector ({type(e).__name__}: {e})")

    def _once(self, kind: str, msg: str) -> None:
        if kind not in self._failed:
            self._failed.add(kind)
            log.warning(msg)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


def post_webhook(url: str, payload: dict[str, Any], token: str | None = None) -> bool:
    """POST one action to a scheduler's webhook; False (logged) when it fails."""
    try:
        _request(url, token, payload, "POST")
        return True
    except Exception as e:  # noqa: BLE001 - a webhook that is down must not stop training
        log.warning("drain webhook %s failed: %s: %s", url, type(e).__name__, e)
        return False
