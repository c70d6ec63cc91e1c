"""Alert rules over window analyses, and their delivery (the log and webhooks).

Rule types (every rule fires once when its condition has held for ``windows`` consecutive
windows, and re-arms when it stops holding):

- ``job_slowdown``: the job's S above ``threshold``;
- ``worker_slowdown``: a worker's S_w above ``threshold`` (with ``relative``: S_w divided by the
  median worker's S_w, so noise every worker shares does not count, and the worker among the worst
  3% that M_W fixes), and its typical step's compute at least ``min_load_ratio`` times its stage
  peers' (``laggard.monitor.window.load_ratios``: a one-off stall raises S_w, not the median step);
- ``new_finding``: a diagnosis finding (cause + workers/stages) not seen before in this job; one of
  low confidence (no detector's signature fits, the slowdown's largest carrier named instead:
  ``laggard.diagnose.fallback``) only with ``low_confidence``;
- ``hang``: a suspected hang (ranks stopped moving: ``laggard.monitor.hangs``), and then the
  verdict over the ranks' hang reports (hang, desync or missing ranks, naming the culprit ranks,
  group, op and sequence number); ``windows`` is ignored. With ``abort: true`` the verdict asks
  the job's tracers to end their hung ranks (``laggard.tracer.abort``; a tracer created with
  ``abort_on_hang=False`` never does).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from laggard.errors import LaggardError
from laggard.report.wording import finding_message, finding_text

log = logging.getLogger("laggard.monitor.alerts")
RULE_TYPES = ("job_slowdown", "worker_slowdown", "new_finding", "hang")


@dataclass(kw_only=True, slots=True)
class Rule:
    id: str
    type: str
    threshold: float = 0.0
    windows: int = 1
    relative: bool = False
    min_load_ratio: float = 0.0  # worker_slowdown: also its typical compute/step this far above its stage peers
    enabled: bool = True
    abort: bool = False  # hang: ask the tracers to end a hung job's ranks once the verdict is in
    # new_finding: also findings of low confidence. Off by default: a clean heavy-tailed job's S sits at
    # 1.03-1.06, so the analysis calls some windows straggling and, no detector firing, names the
    # residual's largest carrier at low confidence; one held 6 windows paged for a clean job (seed 13
    # of bench_monitor's 20 x 1,000 clean steps). Real unexplained straggling trips job-slow (S > 1.15)
    low_confidence: bool = False

    @classmethod
    def from_json(cls, d: Any) -> Rule:
        if not isinstance(d, dict):
            raise LaggardError("a rule is a JSON object with id, type, threshold, windows")
        unknown = set(d) - {"id", "type", "threshold", "windows", "relative", "min_load_ratio", "enabled", "abort",
                            "low_confidence"}
        if unknown:
            raise LaggardError(f"rule {d.get('id')!r}: unknown field(s) {sorted(unknown)}")
        if not isinstance(d.get("id"), str) or not d["id"]:
            raise LaggardError("rule: 'id' must be a non-empty string")
        if d.get("type") not in RULE_TYPES:
            raise LaggardError(f"rule {d['id']!r}: type must be one of {', '.join(RULE_TYPES)}, not {d.get('type')!r}")
        th, k, lr = d.get("threshold", 0.0), d.get("windows", 1), d.get("min_load_ratio", 0.0)
        for name, v in (("threshold", th), ("min_load_ratio", lr)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
                raise LaggardError(f"rule {d['id']!r}: {name} must be a number")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise LaggardError(f"rule {d['id']!r}: windows must be a positive integer")
        for b in ("relative", "enabled", "abort", "low_confidence"):
            if not isinstance(d.get(b, False), bool):
                raise LaggardError(f"rule {d['id']!r}: {b} must be true or false")
        return cls(id=d["id"], type=d["type"], threshold=float(th), windows=k, relative=d.get("relative", False),
                   min_load_ratio=float(lr), enabled=d.get("enabled", True), abort=d.get("abort", False),
                   low_confidence=d.get("low_confidence", False))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def default_rules() -> list[Rule]:
    """Defaults tuned on synthetic jobs with heavy-tailed noise (benchmarks/bench_monitor.py and the
    design notes give the measured detection delay and false alarms)."""
    return [
        # clean noisy jobs sit at S ~1.03-1.06; 1.15 sustained over 3 windows is real straggling
        Rule(id="job-slow", type="job_slowdown", threshold=1.15, windows=3),
        # a 1.10x worker shows S_w / median 1.02-1.07 (less on the first pipeline stage) and a typical
        # step's compute ~1.10x its stage peers'; a stall lifts S_w for up to 2 windows but not the
        # median step (per-op noise puts clean load ratios within ~1.02), so 2 windows suffice
        Rule(id="worker-slow", type="worker_slowdown", threshold=1.02, windows=2, relative=True, min_load_ratio=1.05),
        # findings come and go in noisy windows; one present for 6 windows (18 steps) is reported
        Rule(id="new-finding", type="new_finding", windows=6),
        Rule(id="hang", type="hang"),
    ]


@dataclass(kw_only=True, slots=True)
class Alert:
    job: str
    rule: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)
    kind: str = ""  # the rule's type (job_slowdown, worker_slowdown, new_finding, hang)


@dataclass(kw_only=True)
class RuleState:
    """Consecutive-window counters per (job, rule, subject) and what already fired."""

    counts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    fired: set[tuple[str, str, str]] = field(default_factory=set)
    seen_findings: dict[str, set[str]] = field(default_factory=dict)

    def _tick(self, key: tuple[str, str, str], holds: bool, k: int) -> bool:
        """Count a window; True exactly when the condition has just held for k windows."""
        if not holds:
            self.counts.pop(key, None)
            self.fired.discard(key)
            return False
        n = self.counts[key] = self.counts.get(key, 0) + 1
        if n >= k and key not in self.fired:
            self.fired.add(key)
            return True
        return False

    def of_job(self, job_id: str) -> dict[str, Any]:
        """The job's part, as JSON: what the next collector to analyze the job needs so that it goes
        on counting windows where this one stopped and does not fire again what fired here."""
        return {"counts": sorted([r, s, n] for (j, r, s), n in self.counts.items() if j == job_id),
                "fired": sorted([r, s] for j, r, s in self.fired if j == job_id),
                "seen": sorted(self.seen_findings.get(job_id, ()))}

    def load_job(self, job_id: str, d: dict[str, Any] | None) -> None:
        """The job's part as ``of_job`` gave it, replacing what is held here (None: nothing kept)."""
        self.counts = {k: n for k, n in self.counts.items() if k[0] != job_id}
        self.fired = {k for k in self.fired if k[0] != job_id}
        self.seen_findings.pop(job_id, None)
        if not d:
            return
        self.counts.update({(job_id, r, s): int(n) for r, s, n in d.get("counts", [])})
        self.fired.update((job_id, r, s) for r, s in d.get("fired", []))
        if d.get("seen"):
            self.seen_findings[job_id] = set(d["seen"])


def evaluate_window(rules: list[Rule], state: RuleState, job_id: str, doc: dict[str, Any],
                    load_ratio: dict[int, float] | None = None) -> list[Alert]:
    """Alerts raised by one new window analysis of ``job_id`` (``doc``: the analysis JSON;
    ``load_ratio``: ``laggard.monitor.window.load_ratios`` of the same window)."""
    out: list[Alert] = []
    for rule in rules:
        if not rule.enabled:
            continue
        if rule.type == "job_slowdown":
            s = doc["slowdown"]
            if state._tick((job_id, rule.id, ""), s is not None and s > rule.threshold, rule.windows):
                out.append(Alert(job=job_id, rule=rule.id, message=f"job {job_id}: slowdown {s:.3f} above "
                                 f"{rule.threshold:g} for {rule.windows} windows", detail={"slowdown": s}))
        elif rule.type == "worker_slowdown":
            out.extend(_worker_alerts(rule, state, job_id, doc, load_ratio or {}))
        elif rule.type == "new_finding":
            present = set()
            for f in doc.get("findings", []):
                if f.get("confidence") == "low" and not rule.low_confidence:
                    continue
                key = f"{f['cause']}:w{f.get('workers')}:s{f.get('stages')}"
                present.add(key)
                seen = state.seen_findings.setdefault(job_id, set())
                if state._tick((job_id, rule.id, key), True, rule.windows) and key not in seen:
                    seen.add(key)
                    out.append(Alert(job=job_id, rule=rule.id, message="new finding: " + finding_message(f, job=job_id),
                                     detail={"finding": f, "text": finding_text(f).to_json()}))
            for key in [k for k in state.counts if k[0] == job_id and k[1] == rule.id and k[2] not in present]:
                state._tick(key, False, rule.windows)
    return out


def _worker_alerts(rule: Rule, state: RuleState, job_id: str, doc: dict[str, Any], loads: dict[int, float]
                   ) -> list[Alert]:
    workers = [w for w in doc["by_worker"] if w["slowdown"] is not None]
    if not workers:
        return []
    base = float(np.median([w["slowdown"] for w in workers])) if rule.relative else 1.0
    worst = set(doc["M_W_detail"].get("fixed_ranks") or [])
    out = []
    for w in workers:
        score = w["slowdown"] / base
        key = (job_id, rule.id, str(w["rank"]))
        # relative: also among the worst 3% of workers (the ones M_W fixes), so noise shared by many
        # workers or a second-rank wobble does not keep a counter going
        holds = score > rule.threshold and (not rule.relative or w["rank"] in worst)
        # a worker without stage peers has no load ratio: S_w alone decides
        holds = holds and loads.get(w["rank"], float("inf")) >= rule.min_load_ratio
        if state._tick(key, holds, rule.windows):
            what = "S_w / median" if rule.relative else "S_w"
            out.append(Alert(job=job_id, rule=rule.id,
                             message=f"job {job_id}: worker rank {w['rank']} (dp{w['dp_rank']}:pp{w['stage']}) {what} "
                                     f"{score:.3f} above {rule.threshold:g} for {rule.windows} windows",
                             detail={"rank": w["rank"], "dp_rank": w["dp_rank"], "stage": w["stage"],
                                     "slowdown": w["slowdown"], "score": score, "load_ratio": loads.get(w["rank"])}))
    return out


def evaluate_hang(rules: list[Rule], state: RuleState, job_id: str, silent: list[dict[str, Any]]) -> list[Alert]:
    out = []
    for rule in rules:
        if rule.enabled and rule.type == "hang":
            ranks = ",".join(str(s["rank"]) for s in silent)
            if state._tick((job_id, rule.id, ""), bool(silent), 1):
                lines = "; ".join(f"rank {s['rank']} last at step {s['last_step']} op "
                                  f"{(s['last_op'] or {}).get('name')}" for s in silent)
                out.append(Alert(job=job_id, rule=rule.id, message=f"job {job_id}: hang suspected, ranks {ranks} "
                                 f"not moving ({lines})", detail={"silent": silent}, kind="hang"))
    return out


def evaluate_hang_verdict(rules: list[Rule], state: RuleState, job_id: str, pub: dict[str, Any]) -> list[Alert]:
    """An alert per enabled ``hang`` rule for a verdict on a suspected hang (``laggard.monitor.hangs``)."""
    from laggard.monitor.hangs import ALERT_VERDICTS, alert_lines

    if not pub.get("suspected") or pub.get("verdict") not in ALERT_VERDICTS:
        return []
    return [Alert(job=job_id, rule=rule.id, message=alert_lines(pub), detail={"verdict": pub}, kind="hang")
            for rule in rules if rule.enabled and rule.type == "hang"]


class Notifier:
    """Delivers alerts to the log at once and to webhooks from a background thread (never blocks)."""

    def __init__(self, webhooks: list[str], timeout_s: float = 5.0) -> None:
        self.webhooks = list(webhooks)
        self.timeout_s = timeout_s
        self._q: queue.Queue[Alert | None] = queue.Queue(maxsize=10_000)
        self.num_failed = 0
        self._thread = threading.Thread(target=self._run, name="laggard-webhooks", daemon=True)
        self._thread.start()

    def send(self, alert: Alert) -> None:
        log.warning("ALERT %s", alert.message)
        if self.webhooks:
            try:
                self._q.put_nowait(alert)
            except queue.Full:
                self.num_failed += 1

    def _run(self) -> None:
        while (alert := self._q.get()) is not None:
            body = json.dumps({"job": alert.job, "rule": alert.rule, "kind": alert.kind, "message": alert.message,
                               "detail": alert.detail}).encode()
            for url in self.webhooks:
                req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                try:
                    urllib.request.urlopen(req, timeout=self.timeout_s).close()
                except (OSError, ValueError) as e:
                    self.num_failed += 1
                    log.warning("webhook %s failed: %s", url, e)

    def close(self) -> None:
        self._q.put(None)
