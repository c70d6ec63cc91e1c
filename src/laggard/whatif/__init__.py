"""What-if analysis over the replay engine: the paper's attributions (``core``: S, S_t, S_dp,
S_stage, S_w, M_W, M_S) and custom what-ifs (``custom``: selectors and ``--fix/--zero/--scale/...``
changes) and two runs compared (``diff``: B replayed with A's durations part by part), and a whole-layer
pipeline split with its replayed speed-up (``partition``). The result is ``laggard.results.Analysis``;
the diagnosis sits one layer up."""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    **dict.fromkeys(("analyze", "by_dp_rank_step_times", "DP_REDUCTION_MIN", "TOP_WORKER_SHARE"),
                    "laggard.whatif.core"),
    **dict.fromkeys(("Analysis", "Explained"), "laggard.results.analysis"),
    **dict.fromkeys(("Baseline", "prepare", "replay_mixed"), "laggard.engine.baseline"),
    **dict.fromkeys(("ACTIONS", "Change", "WhatIfResult", "apply_changes", "custom_whatif", "parse_changes",
                     "select_ops", "whatif_command"), "laggard.whatif.custom"),
    **dict.fromkeys(("DiffConfig", "diff"), "laggard.whatif.diff"),
    **dict.fromkeys(("PartitionPlan", "plan_partition"), "laggard.whatif.partition"),
})
