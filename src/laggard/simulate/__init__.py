"""Straggler simulation: tail at scale and synchronisation policies (``laggard simulate``).

Modules: ``dists`` (worker-time distributions and specs), ``empirical`` (distributions from a
trace), ``engine`` (chunked, threaded Monte-Carlo), ``theory`` (closed forms and quadrature),
``tail`` (E[max] and p99 against the number of workers), ``policies`` (BSP, backups,
speculation, drop-slowest, over-decomposition, SSP, async), ``plots`` (PNG / SVG).

Importing this package is cheap: names are loaded from their modules on first use.
"""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {name: f"laggard.simulate.{module}" for name, module in {
    "Distribution": "base",
    "parse_dist": "dists",
    "tail_at_scale": "tail",
    "TailResult": "tail",
    "compare_policies": "policies",
    "parse_policy": "policies",
    "PolicyResult": "policies",
    "EmpiricalTrace": "empirical",
    "trace_distribution": "empirical",
}.items()})
