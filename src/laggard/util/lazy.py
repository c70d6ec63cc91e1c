"""Lazy public names for a package's ``__init__``: ``import laggard.X`` stays cheap, and each name
imports its module the first time it is used.

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"Tracer": "laggard.tracer.core"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str,
                 exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``, whose public names are the keys of
    ``exports`` (name -> the module that defines it). A resolved name is cached on the package, so
    ``__getattr__`` runs once per name."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(exports) | set(vars(sys.modules[package])))

    return __getattr__, __dir__, sorted(exports)
