"""NDTimeline traces (ByteDance's Megatron timeline, the OSDI '25 paper's format): ``load`` reads
one into the op table from a reference pipeline instance (``template``), after ``clean`` drops what
cannot be replayed; ``meta`` reads the layout YAML."""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {"read_ndtimeline": "laggard.io.ndtimeline.load"})
