"""laggard: find, explain and fix stragglers in distributed training.

The public API, loaded lazily (``import laggard`` stays cheap; each name imports its module on
first use)::

    job = laggard.load_job("trace-AR.parquet")
    res = laggard.analyze(job)              # slowdown, attributions, diagnosis
    res.to_json()["findings"]
    laggard.write_report(res, "report.html")
    laggard.custom_whatif(job, laggard.parse_changes(["worker=dp0:pp0"], [], []))
    laggard.diff(last_week_job, job).to_json()["contributions"]   # why B is slower than A

The package is laid out by layer (see docs/DESIGN.md); modules that moved keep their old import
path with a ``DeprecationWarning`` (``laggard.util.moved``).
"""

from __future__ import annotations

import sys as _sys
import types as _types

from laggard.util import moved as _moved
from laggard.util.lazy import lazy_exports as _lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    **dict.fromkeys(("Job", "JobMeta", "make_table", "write_native"), "laggard.optable.ops"),
    **dict.fromkeys(("LaggardError", "LaggardWarning"), "laggard.errors"),
    "load_job": "laggard.io",
    "analyze": "laggard.analysis.pipeline",
    "AnalysisConfig": "laggard.analysis.config",
    "Analysis": "laggard.results.analysis",
    "Finding": "laggard.results.diagnosis",
    "write_report": "laggard.report.html",
    **dict.fromkeys(("custom_whatif", "parse_changes"), "laggard.whatif.custom"),
    **dict.fromkeys(("diff", "DiffConfig"), "laggard.whatif.diff"),
    "diagnose": "laggard.diagnose",
    "DiagnoseConfig": "laggard.diagnose.config",
    **dict.fromkeys(("SynthConfig", "synthesize", "synthesize_with_truth"), "laggard.groundtruth.synth"),
    "parse_injection": "laggard.groundtruth.inject",
    "Tracer": "laggard.tracer.core",
    **dict.fromkeys(("autotrace", "AutoTrace", "end_step"), "laggard.tracer.auto.session"),
}

__getattr__, _dir, __all__ = _lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])


class _Package(_types.ModuleType):
    """Importing a submodule sets it as an attribute of its package; where a submodule and a public
    function share a name (``laggard.diagnose``), the function stays the public name."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _EXPORTS and isinstance(value, _types.ModuleType):
            self.__dict__.pop(name, None)  # resolved again (to the function) on next access
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
_moved.install()
