"""Lightning ``Trainer.fit``: the MLP as a LightningModule, strategy ddp on CPU, devices from the launcher.

    torchrun --nproc-per-node 4 lightning_fit.py --inject forward --ms 30   # rank 2's training_step 30 ms longer
    torchrun --nproc-per-node 4 lightning_fit.py                            # clean

`traceml run` attaches its Lightning callback by itself, so nothing here calls TraceML.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from zc_common import StepClock, loader_for, model_for, parse, slowed  # noqa: E402


class Module(pl.LightningModule):
    def __init__(self, args, rank: int) -> None:  # noqa: ANN001
        super().__init__()
        self.args, self.rank_ = args, rank
        args_clean = type(args)(**{**vars(args), "inject": "none"})  # the slow step is injected below
        self.net = model_for(args_clean, rank)
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def training_step(self, batch, _i):  # noqa: ANN001, ANN201
        if slowed(self.args, self.rank_, "forward"):
            time.sleep(self.args.ms / 1e3)  # the slow device, in this rank's training_step
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(pl.Callback):
    def __init__(self) -> None:
        self.clock = StepClock()

    def on_train_batch_start(self, *_a) -> None:  # noqa: ANN002
        self.clock.tick()

    def on_train_end(self, trainer, _m) -> None:  # noqa: ANN001
        self.clock.tick()
        self.clock.write(trainer.global_rank)


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    rank = int(os.environ.get("RANK", 0))
    clock = Clock()
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), strategy="ddp",
                         max_steps=args.steps, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                         callbacks=[clock])
    trainer.fit(Module(args, rank), train_dataloaders=loader_for(args, rank))


if __name__ == "__main__":
    main()
