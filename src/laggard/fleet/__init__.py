"""Fleet analysis: the `laggard analyze` pipeline mapped over many jobs, one row per job.

``run_fleet(paths, out_dir)`` finds the jobs (``discover``), analyses them on a local process pool
or on Ray (``engines``), batch by batch (``batching``, ``task``), writes ``fleet.parquet`` and a JSON
document per job as they finish (``writer``, ``rows``); ``fleet_stats`` reads the results back into
the fleet's numbers, which ``report`` and ``terminal`` present.
"""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

# loaded on first use: `laggard`'s start-up imports this package for its CLI and must stay light
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "FleetConfig": "laggard.fleet.config", "FleetRun": "laggard.fleet.runner", "run_fleet": "laggard.fleet.runner"})
