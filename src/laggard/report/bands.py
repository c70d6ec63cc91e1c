"""Health bands of a slowdown S (good / warn / bad): the one rule behind the colours of the HTML
report's cards and of the terminal summary. The values are fixed colour bands, not the user's
``--healthy-threshold`` (which decides whether a job gets findings at all)."""

from __future__ import annotations

from laggard.diagnose.config import HEALTHY_THRESHOLD

# 5% slower than with no stragglers (waste 1 - 1/S ~ 5% of the GPU time): the default healthy
# threshold (1.05, its reason in laggard.diagnose.config), so a job turns yellow where laggard, by
# default, starts calling it unhealthy.
WARN_AT = HEALTHY_THRESHOLD
# 20% slower (a sixth of the GPU time wasted): well above the 1.0-1.1 that healthy jobs show, so red.
BAD_AT = 1.2


def band(s: float) -> str:
    """'bad' at S >= BAD_AT, 'warn' at S >= WARN_AT, else 'good' (NaN too: it compares False)."""
    return "bad" if s >= BAD_AT else "warn" if s >= WARN_AT else "good"
