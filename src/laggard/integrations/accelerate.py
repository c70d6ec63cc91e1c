"""Trace a training loop written with accelerate: ``autotrace(accelerator, model, optimizer, out_dir=...)``.

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with autotrace(accelerator, model, optimizer, out_dir="trace"):
        for x, y in loader:
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.end_training()

``accelerator.end_training()`` does not close the session: use it as a context manager (as above),
or call ``close()``, on every rank. Call it after ``prepare``: the process group exists from the
Accelerator's creation on, and the prepared model is the one the loop calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import accelerate

from laggard.integrations._session import Session, default_name, start


def autotrace(accelerator: accelerate.Accelerator, model: Any = None, optimizer: Any = None, *,
              out_dir: str | Path = "trace", name: str | None = None, **tracer_kwargs: Any) -> Session:
    """``laggard.autotrace`` for a loop over what ``accelerator`` prepared. ``model``: the model the
    loop calls (its forward is the phase; the prepared one, so that DDP's own work before the forward
    counts as forward), by default the one model the accelerator prepared (every module's outermost
    call when it prepared none or several). ``optimizer``: the one whose step ends a traced step, an
    AcceleratedOptimizer or the torch optimizer inside it, by default the one the accelerator
    prepared (the first to step when none or several). ``name``: the job's name in job.json (the
    model's class name, unwrapped, when None). ``tracer_kwargs`` go to ``laggard.tracer.Tracer``.

    Returns the session, to close (or use in ``with``) on every rank; under ``laggard run`` the one
    the run started, lent (its ``close`` does nothing: the run closes it)."""
    if model is None:
        models = getattr(accelerator, "_models", [])
        model = models[0] if len(models) == 1 else None
    if optimizer is None:
        optimizers = getattr(accelerator, "_optimizers", [])
        optimizer = optimizers[0] if len(optimizers) == 1 else None
    if name is None:
        name = default_name(accelerator.unwrap_model(model) if model is not None else None)
    return start(model, optimizer, out_dir=out_dir, name=name, tracer_kwargs=tracer_kwargs)
