"""Fleet analysis: the `laggard analyze` pipeline mapped over many jobs, one row per job.

``run_fleet(paths, out_dir)`` finds the jobs (``discover``), analyses them on a local process pool
or on Ray (``engines``), batch by batch (``batching``, ``task``), writes ``fleet.parquet`` and a JSON
document per job as they finish (``writer``, ``rows``); ``fleet_stats`` reads the results back into
the fleet's numbers, which ``report`` and ``terminal`` present.
"""

from laggard.fleet.config import FleetConfig
from laggard.fleet.runner import FleetRun, run_fleet

__all__ = ["FleetConfig", "FleetRun", "run_fleet"]
