"""The replay engine, from the op table up: untraced host time as ops (``gaps``), the dependency
graph (``graph``; its replay plan: ``plan``), the replay (``replay``; steps back to back:
``replay_chain``), the measured job made ready for what-ifs (``baseline``), DP symmetry
(``symmetry``), per-op signals the diagnosis reads (``spikes``: stalled forwards; ``arrivals``:
collective arrival skew) and warm-up steps (``warmup``). Nothing here knows about what-ifs, findings
or reports."""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    **dict.fromkeys(("Baseline", "prepare", "replay_mixed"), "laggard.engine.baseline"),
    **dict.fromkeys(("Graph", "build_graph"), "laggard.engine.graph"),
    **dict.fromkeys(("replay", "replay_steps"), "laggard.engine.replay"),
    **dict.fromkeys(("GapConfig",), "laggard.engine.gaps"),
    **dict.fromkeys(("WarmupConfig", "skip_warmup"), "laggard.engine.warmup"),
})
