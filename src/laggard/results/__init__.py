"""Results as plain data: what the what-if analysis (``Analysis``) and the diagnosis (``Diagnosis``,
``Finding``) produce, and their JSON documents. They render nothing: ``laggard.report`` does."""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "Analysis": "laggard.results.analysis",
    "Explained": "laggard.results.analysis",
    "Diagnosis": "laggard.results.diagnosis",
    "Finding": "laggard.results.diagnosis",
    "Contribution": "laggard.results.diff",
    "DiffResult": "laggard.results.diff",
    "TopState": "laggard.results.top",
})
