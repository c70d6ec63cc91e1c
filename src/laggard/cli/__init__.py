"""The `laggard` command. ``base`` holds the app, the one-line error handling and the list of
command modules; each command module (``analyze``, ``mitigate``, ``demo``, ``hang``, ``fleet``,
``dessim``, ``simulate``, ``collectives``, ``monitor``) has ``register(app)``."""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, dict.fromkeys(("app", "entry", "main"), "laggard.cli.base"))
