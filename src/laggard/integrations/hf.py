"""Trace a ``transformers.Trainer`` on every rank: ``Trainer(..., callbacks=[LaggardTrainerCallback("trace")])``.

The session starts in ``on_train_begin``, once the Trainer has made the process group (its
arguments did, through accelerate) and prepared the model and optimizer; the callback gets both in
its keyword arguments. The model hooked is the Trainer's own (unwrapped) model, which the DDP
wrapper calls on every forward; the optimizer is the torch one inside accelerate's
AcceleratedOptimizer, whose ``step`` ends each traced step (one per optimizer update, so a run with
gradient accumulation has ``max_steps`` steps of several microbatches). The session closes at
``on_train_end``. ``TrainerCallback`` has no hook for a failure: after an exception the tracer's own
exit handler writes what was recorded.

Under ``laggard run`` the session the run started traces, and this callback does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from laggard.integrations._session import Session, default_name, start


class LaggardTrainerCallback(TrainerCallback):
    """A Trainer callback that traces training into ``out_dir`` (the job's ``name`` in job.json: the
    model's class name when None). ``tracer_kwargs`` go to ``laggard.tracer.Tracer``. ``session`` is
    the session while training (None before and after)."""

    def __init__(self, out_dir: str | Path = "trace", name: str | None = None, **tracer_kwargs: Any) -> None:
        self.out_dir = Path(out_dir)
        self.name = name
        self.tracer_kwargs = tracer_kwargs
        self.session: Session | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if self.session is not None:
            return
        self.session = start(model, optimizer, out_dir=self.out_dir, name=self.name or default_name(model),
                             tracer_kwargs=self.tracer_kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close("closed")
