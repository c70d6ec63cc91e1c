"""A finding in words: the one renderer every surface uses (terminal, HTML, dashboard, alerts, webhooks).

It reads a finding's JSON form (``Finding.to_json()``, which is also what the collector holds), so the
live monitor words a finding exactly as ``laggard analyze`` does: **what** (the cause in words, where,
and what the reader must know before acting), **evidence**, **fix** and **check** (the `laggard whatif`
command that prints the gain). No data structure is ever shown raw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from laggard.results.diagnosis import step_spans

# the cause as a reader names it (the JSON keeps the short key)
CAUSE_WORDS = {
    "worker": "slow worker",
    "data-loading": "slow input pipeline",
    "stage-imbalance": "stage imbalance",
    "sequence-imbalance": "sequence-length imbalance",
    "gc": "garbage-collection pauses",
    "comm": "slow communication",
    "launch-delay": "launch delay (untraced host time)",
    "extra-work": "work one rank does alone",
    "unexplained": "unexplained slowdown",
    "late-arrival": "late arrival (one step)",
}


@dataclass(frozen=True, slots=True)
class FindingText:
    cause: str  # "slow worker"
    where: str  # "rank 3 (dp1/pp1)" ("" for a job-wide cause)
    qualifier: str  # "" or what to know before acting (low confidence, hidden)
    evidence: str
    consistency: str
    fix: str
    check: str  # the command whose speed-up is the gain ("" when none)
    share: str  # "explains 42% of the slowdown (40% alone)"
    gain: str  # "fixing it: 1.32x faster"
    check_label: str = "check"  # "check the bound" where the gain shown is the whole-layer one
    beyond: str = ""  # why the gain exceeds the job's slowdown S ("" where it does not)

    @property
    def what(self) -> str:
        """The cause and where: "slow worker: rank 3 (dp1/pp1)"."""
        return self.cause + (f": {self.where}" if self.where else "")

    def lines(self) -> list[str]:
        """The finding as labelled lines (alerts, webhooks, plain text)."""
        out = [self.what + self.qualifier, f"{self.share}; {self.gain}", f"evidence: {self.evidence}"]
        if self.consistency:
            out.append(f"consistency: {self.consistency}")
        out.append(f"fix: {self.fix}")
        if self.beyond:
            out.append(f"gain beyond S: {self.beyond}")
        if self.check:
            out.append(f"{self.check_label}: {self.check}")
        return out

    def to_json(self) -> dict[str, str]:
        return {"what": self.what, "cause": self.cause, "where": self.where, "qualifier": self.qualifier,
                "evidence": self.evidence,
                "consistency": self.consistency, "fix": self.fix, "check": self.check, "check_label": self.check_label,
                "share": self.share, "gain": self.gain, "beyond": self.beyond}


def where(f: dict[str, Any], *, max_workers: int = 4) -> str:
    """The ranks (with their DP rank and stage) and, for a stage finding, the stages it names."""
    parts = []
    workers = f.get("workers") or []
    if workers:
        shown = ", ".join(f"rank {w['rank']} (dp{w['dp_rank']}/pp{w['stage']})" for w in workers[:max_workers])
        parts.append(shown + (f" and {len(workers) - max_workers} more" if len(workers) > max_workers else ""))
    stages = f.get("stages") or []
    if stages and f.get("cause") == "stage-imbalance":
        parts.append(("stage " if len(stages) == 1 else "stages ") + ", ".join(str(s) for s in stages))
    steps = f.get("transient_steps") or []
    if parts and steps:  # a transient straggler: the steps it was slow in
        parts[-1] += f" in step{'s' if len(steps) > 1 else ''} {step_spans([int(s) for s in steps])}"
    return "; ".join(parts)


def qualifier(f: dict[str, Any]) -> str:
    """What the reader must know before acting on a finding: a guess (low confidence), or a cause that
    other findings hid (named once they are fixed)."""
    out = ""
    if f.get("cause") == "late-arrival":  # (laggard.diagnose.onestep: read off too few steps to judge)
        out += f" ({f.get('confidence')} confidence: one step cannot tell a steady straggler from a one-off)"
    elif f.get("confidence", "high") != "high":
        out += f" ({f.get('confidence')} confidence: no known cause's signature fits)"
    if f.get("hidden"):
        once = f.get("once_fixed") or {}
        gain, share = once.get("gain"), once.get("share")
        if isinstance(gain, (int, float)) and isinstance(share, (int, float)):
            out += (f" (hidden behind the findings above: once they are fixed, fixing it removes {_pct(share)} of "
                    f"what is left, {gain:.2f}x faster)")
        else:
            out += " (hidden behind the findings above: it shows once they are fixed)"
    return out


def _pct(x: Any) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, (int, float)) else "n/a"


def gain_words(f: dict[str, Any]) -> str:
    """"fixing it: 1.32x faster"; where the fix moves whole layers, the whole-layer gain with the
    continuous bound labelled, or the bound alone (labelled) when the layer count is unknown."""
    gain, layers = f.get("gain"), f.get("gain_layers")
    if not isinstance(gain, (int, float)):
        return "fixing it: gain n/a"
    if isinstance(layers, (int, float)):
        return f"fixing it: {layers:.2f}x faster moving whole layers ({gain:.2f}x is the bound of a continuous split)"
    if f.get("gain_bound"):
        return f"fixing it: up to {gain:.2f}x faster (the bound of a continuous split; whole layers gain less)"
    return f"fixing it: {gain:.2f}x faster"


def finding_text(f: dict[str, Any]) -> FindingText:
    """The words of a finding (its ``to_json()`` form)."""
    cause = str(f.get("cause", ""))
    return FindingText(
        cause=CAUSE_WORDS.get(cause, cause.replace("-", " ")), where=where(f), qualifier=qualifier(f),
        evidence=str(f.get("evidence") or ""),
        consistency=str(f.get("consistency") or ""), fix=str(f.get("fix") or ""), check=str(f.get("whatif") or ""),
        share=f"explains {_pct(f.get('share'))} of the slowdown ({_pct(f.get('score'))} alone)",
        gain=gain_words(f),
        check_label="check the bound" if isinstance(f.get("gain_layers"), (int, float)) else "check",
        beyond=str(f.get("beyond_slowdown") or ""),
    )


def finding_message(f: dict[str, Any], *, job: str | None = None) -> str:
    """One line for an alert's log line and its webhook's ``message``: what, share and gain, evidence, fix."""
    t = finding_text(f)
    head = f"job {job}: " if job else ""
    return f"{head}{t.what}{t.qualifier} ({t.share}; {t.gain}). Evidence: {t.evidence}. Fix: {t.fix}"


__all__ = ["CAUSE_WORDS", "FindingText", "finding_message", "finding_text", "gain_words", "qualifier", "where"]
