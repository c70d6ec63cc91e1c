"""Trace a pytorch-lightning ``Trainer.fit`` on every rank: ``Trainer(callbacks=[LaggardCallback("trace")])``.

The session starts in ``on_fit_start``: the process group exists by then on every rank (the
strategy made it before the ``setup`` hook) and so do the optimizers, which the strategy creates
after that hook. Phases come from hooks on the LightningModule: Lightning's DDP and FSDP strategies
call ``training_step`` through the module's ``__call__`` (its forward redirected), so each
training step is a forward, and the backward and the optimizer step run inside the optimizer's
``step`` (the closure), as the phases expect. The session closes at ``on_fit_end`` (or the
``teardown`` of fit, if that comes first), or with status ``failed: <exception>`` at
``on_exception``.

Under ``laggard run`` the session the run started traces, and this callback does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from laggard.integrations._session import Session, default_name, start


class LaggardCallback(pl.Callback):
    """A Lightning callback that traces fitting into ``out_dir`` (the job's ``name`` in job.json: the
    LightningModule's class name when None). ``tracer_kwargs`` go to ``laggard.tracer.Tracer``.
    ``session`` is the session while fitting (None before and after)."""

    def __init__(self, out_dir: str | Path = "trace", name: str | None = None, **tracer_kwargs: Any) -> None:
        super().__init__()
        self.out_dir = Path(out_dir)
        self.name = name
        self.tracer_kwargs = tracer_kwargs
        self.session: Session | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:
            return
        optimizers = trainer.optimizers
        # with several (a GAN's), the first to step ends each step
        optimizer = optimizers[0] if len(optimizers) == 1 else None
        self.session = start(pl_module, optimizer, out_dir=self.out_dir, name=self.name or default_name(pl_module),
                             tracer_kwargs=self.tracer_kwargs)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close("closed")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._close("closed")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._close(f"failed: {type(exception).__name__}")

    def _close(self, status: str) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close(status)
