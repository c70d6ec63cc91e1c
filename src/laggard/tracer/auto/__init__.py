"""Zero-code tracing: every collective torch.distributed makes, and the training phases, from hooks.

    session = laggard.autotrace(model, optimizer, out_dir="trace/")   # after init_process_group
    ...train as usual...
    session.close()

or, with no change to the script at all, ``laggard run [torchrun flags] SCRIPT [ARGS...]``, which
starts every rank through ``laggard.tracer.auto.boot``. Importing this package does not import torch.
"""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "autotrace": "laggard.tracer.auto.session",
    "AutoTrace": "laggard.tracer.auto.session",
    "end_step": "laggard.tracer.auto.session",
    "install_from_env": "laggard.tracer.auto.session",
    "AutoEnv": "laggard.tracer.auto.env",
    "read_env": "laggard.tracer.auto.env",
})
