"""Explicit tracing from the training frameworks' own extension points, over ``laggard.autotrace``.

    from laggard.integrations.lightning import LaggardCallback        # pytorch-lightning
    trainer = Trainer(..., callbacks=[LaggardCallback(out_dir="trace")])

    from laggard.integrations.hf import LaggardTrainerCallback        # transformers.Trainer
    trainer = Trainer(..., callbacks=[LaggardTrainerCallback(out_dir="trace")])

    from laggard.integrations.accelerate import autotrace             # accelerate, a loop of one's own
    with autotrace(accelerator, model, optimizer, out_dir="trace"):
        ...

Each starts a session on every rank once the process group exists and closes it when training
ends. Under ``laggard run`` (or beside a session the program started itself) the session already
active traces, and these do nothing: one process has one session.

Importing this package imports none of the frameworks: each module imports its own, and is meant to
be imported by programs that have it (``pip install laggard[lightning]`` or ``laggard[hf]``).
"""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "LaggardCallback": "laggard.integrations.lightning",
    "LaggardTrainerCallback": "laggard.integrations.hf",
})
