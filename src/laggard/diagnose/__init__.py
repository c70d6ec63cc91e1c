"""Root causes with evidence, the share of the slowdown each explains, and the fix to apply.

Each cause has a signature in the trace (production experience, as on-call engineers read it), read
by one detector module each: ``worker``, ``stage``, ``sequence``, ``gc``, ``comm``, ``launch``. A
signature only nominates a candidate. Its ``score`` comes from a targeted what-if: replay the job
with only what the finding names made healthy (set to what its peers do), and measure the share of
the job's slowdown (measured step time over ideal) that disappears; ``gain`` is the predicted
speed-up of that fix. Several causes at once share the slowdown jointly (``explain``: Shapley values
over the candidate fixes): each finding's ``share``, and the combined gain and interaction of
fixing all of them. Thresholds: ``DiagnoseConfig``.
"""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

# loaded on first use: the CLI reads the default threshold from ``config`` without the detectors
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    **dict.fromkeys(("DiagnoseConfig", "HEALTHY_THRESHOLD"), "laggard.diagnose.config"),
    "DEFAULT_THRESHOLD": "laggard.diagnose.config",
    "candidates": "laggard.diagnose.nominate",
    **dict.fromkeys(("cannot_judge", "diagnose", "too_little"), "laggard.diagnose.run"),
    "ranked": "laggard.diagnose.explain",
    "Candidate": "laggard.diagnose.findings",
    **dict.fromkeys(("Diagnosis", "Finding"), "laggard.results.diagnosis"),
})
