"""The op table: one row per op on one worker (Arrow), the one model every layer above reads.

``ops``: the schema, validation (``conform``), ``Job`` / ``JobMeta`` and the native writer;
``template``: replicating one pipeline instance over steps and DP ranks (importers, generators);
``tracedir``: the tracer's directory format (file names, per-rank state files, completeness check).
"""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    **dict.fromkeys(("COMM_KINDS", "KINDS", "OP_SCHEMA", "Job", "JobMeta", "conform", "make_table", "parse_steps",
                     "select_steps", "write_native"), "laggard.optable.ops"),
    **dict.fromkeys(("check_trace", "read_states"), "laggard.optable.tracedir"),
})
