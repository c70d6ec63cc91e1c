"""laggard: find, explain and fix stragglers in distributed training.

The public API, loaded lazily (``import laggard`` stays cheap; each name imports its module on
first use)::

    job = laggard.load_job("trace-AR.parquet")
    res = laggard.analyze(job)              # slowdown, attributions, diagnosis
    res.to_json()["findings"]
    laggard.custom_whatif(job, laggard.parse_changes(["worker=dp0:pp0"], [], []))
"""

from __future__ import annotations

import sys as _sys
import types as _types

__version__ = "0.1.0"

_EXPORTS = {
    "Job": "laggard.ops",
    "JobMeta": "laggard.ops",
    "LaggardError": "laggard.ops",
    "LaggardWarning": "laggard.ops",
    "make_table": "laggard.ops",
    "write_native": "laggard.ops",
    "load_job": "laggard.io",
    "analyze": "laggard.analysis",
    "Analysis": "laggard.whatif",
    "custom_whatif": "laggard.whatif_custom",
    "parse_changes": "laggard.whatif_custom",
    "diagnose": "laggard.diagnose",
    "Finding": "laggard.diagnose",
    "DiagnoseConfig": "laggard.diagnose",
    "SynthConfig": "laggard.synth",
    "synthesize": "laggard.synth",
    "synthesize_with_truth": "laggard.synth",
    "parse_injection": "laggard.inject",
    "Tracer": "laggard.tracer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'laggard' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
