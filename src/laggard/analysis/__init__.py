"""The full analysis of a job, composed: warm-up steps skipped, the what-if analysis, then its
diagnosis (``pipeline.analyze``), under one nested ``AnalysisConfig`` (``config``)."""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "analyze": "laggard.analysis.pipeline",
    "partition_hint": "laggard.analysis.partition",
    **dict.fromkeys(("AnalysisConfig", "HEALTHY_THRESHOLD", "resolve_config"), "laggard.analysis.config"),
})
