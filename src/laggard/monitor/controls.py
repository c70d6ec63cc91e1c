"""The collector's job controls and views: tracing, dump requests, kill switches, action logs,
rules, and the job list and detail (``Collector`` has them; the HTTP routes call them)."""

from __future__ import annotations

import time
from typing import Any

from laggard.errors import LaggardError
from laggard.monitor.alerts import Alert, Rule
from laggard.monitor.window import JobWindow


class UnknownJob(LaggardError):
    """A job id the collector has not seen (answered with 404)."""


_ACTION_FIELDS = {"step": int, "kind": str, "ranks": list, "reason": str}  # each logged action has these


def check_actions(actions: Any) -> None:
    """A controller's action log (``laggard.mitigate.controller.Action.to_json``), or one-line ``LaggardError``."""
    if not isinstance(actions, list) or len(actions) > 10_000 or not all(isinstance(a, dict) for a in actions):
        raise LaggardError("actions: expected a JSON list of (at most 10,000) action objects")
    for i, a in enumerate(actions):
        bad = [k for k, t in _ACTION_FIELDS.items() if not isinstance(a.get(k), t) or isinstance(a.get(k), bool)]
        bad += [k for k in ("step_s_before", "step_s_after")
                if a.get(k) is not None and (not isinstance(a[k], int | float) or isinstance(a[k], bool))]
        if bad or not all(isinstance(r, int) and not isinstance(r, bool) for r in a["ranks"]):
            raise LaggardError(f"actions[{i}]: expected step (int), kind, reason (str), ranks (list of int) and "
                               f"step_s_before/step_s_after (number or null); bad: {', '.join(bad) or 'ranks'}")


class JobControls:
    """What an operator or a controller asks of a job (a part of ``Collector``)."""

    def job(self, job_id: str) -> JobWindow:
        win = self.windows.get(job_id)
        if win is None:
            raise UnknownJob(f"no job {job_id!r}")
        return win

    def request_dump(self, job_id: str) -> int:
        """Ask the job's tracers to dump their Flight Recorder buffers (they see it within a poll)."""
        with self._lock:
            win = self.job(job_id)
            win.dump_request += 1
            # the verdict over the reports is published too (an alert only for a suspected hang)
            win.hangs.open(win.dump_request, time.time(), suspected=win.hang_was_suspected)
            request = win.dump_request
        self._keep(job_id)
        return request

    def set_tracing(self, job_id: str, on: bool) -> None:
        with self._lock:
            self.job(job_id).tracing = on
            self.store.set_tracing(job_id, on)

    def set_act(self, job_id: str, on: bool) -> None:
        """The job's controllers poll this: False stops their actions. Stored before it is answered."""
        with self._lock:
            self.job(job_id)
            self.store.set_act(job_id, on)
            self.act.setdefault(job_id, {"act": True, "actions": []})["act"] = on

    def actions(self, job_id: str) -> dict[str, Any]:
        """The job's kill switch and action log (``GET .../actions``)."""
        with self._lock:
            self.job(job_id)
            st = self.act.get(job_id, {"act": True, "actions": []})
            return {"id": job_id, "act": st["act"], "actions": list(st["actions"])}

    def set_actions(self, job_id: str, actions: Any) -> int:
        """The controller's action log (it sends all of it each time), stored; a new ``drain`` goes to
        the webhooks as an alert, for the scheduler."""
        check_actions(actions)
        with self._lock:
            self.job(job_id)
            self.store.set_actions(job_id, actions)
            st = self.act.setdefault(job_id, {"act": True, "actions": []})
            old, st["actions"] = len(st["actions"]), actions
        self._raise([Alert(job=job_id, rule="act-drain", message=f"job {job_id}: drain DP rank(s) {a.get('ranks')} "
                           f"at step {a.get('step')}: {a.get('reason')}", detail={"action": "drain", **a})
                     for a in actions[old:] if a.get("kind") == "drain"])
        return len(actions)

    def set_rules(self, specs: Any) -> list[Rule]:
        if not isinstance(specs, list):
            raise LaggardError("rules: expected a JSON list of rule objects")
        rules = [Rule.from_json(d) for d in specs]
        ids = [r.id for r in rules]
        if len(set(ids)) != len(ids):
            raise LaggardError(f"rules: duplicate rule id(s) {sorted({i for i in ids if ids.count(i) > 1})}")
        self.store.set_rules([r.to_json() for r in rules])
        self.rules = rules
        return rules

    def summaries(self) -> list[dict[str, Any]]:
        """Every job's line: a job another collector holds as that collector last kept it (its window
        is there; this one may have been sent none of it)."""
        kept = {}
        if any(not self.cluster.owns(j) for j in self.windows):
            try:
                kept = self.store.job_states("summary")
            except OSError:  # the database is down (StoreDown): this collector's own view of each job
                kept = {}
        with self._lock:
            out = []
            for j, w in self.windows.items():
                line = kept.get(j) if not self.cluster.owns(j) else None
                out.append({**(line or w.summary()), "analyzed_by": self.cluster.owner_of(j)})
            return out

    def detail(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            out = self.job(job_id).detail(self.cfg.top_k)
            out["analyzed_by"] = self.cluster.owner_of(job_id)
            out.update(self.act.get(job_id, {"act": True, "actions": []}))
        out["alerts"] = [a for a in self.store.alerts(job_id, limit=50)]
        return out
