"""PyTorch Lightning: ``Trainer.fit`` on a small convolutional net with BatchNorm, DDP over 4 gloo ranks.

    laggard run --nproc-per-node 4 lightning_cnn.py --inject device --rank 2 --factor 1.5

The user's program as Lightning users write it: a ``LightningModule`` (three conv + BatchNorm + ReLU
blocks on 8 x 8 single-channel images, global pooling, a linear head, cross-entropy, SGD with momentum)
and ``pl.Trainer(strategy="ddp")`` on the CPU; Lightning makes the process group and the DDP wrapper
itself. BatchNorm's running statistics are buffers, so DDP broadcasts them from rank 0 before each
forward. Each rank reads its own random data (``use_distributed_sampler=False``: a plain DataLoader,
``--inject data`` slows the target's collate by --ms a batch).

Device time: each block's output passes ``common.device_op``; the blocks' device time is DEVICE_SHARE of
--step-ms, a third forward and two thirds backward. The rest is the real convolutions, Lightning's loop,
DDP's all-reduce on gloo and Python. A callback's ``on_train_batch_start`` sets the device's step and
takes the host stall (``--inject host``). With FAMILY_STEP_TIMES=1 each rank prints its median step time.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

SIDE, CLASSES, CHANNELS = 8, 10, (8, 16, 16)
DEVICE_SHARE = 0.7  # of --step-ms: the rest is the real convolutions, Lightning, the all-reduce, Python
# Lightning's loop and DDP on four ranks take a few ms of host CPU a step each; at 120 ms the two cores
# are mostly idle, so a slow device's sleep lengthens the step instead of handing its core to the others.
STEP_MS = 120.0


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, dev: common.Device, fwd_ms: float, bwd_ms: float) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.bn = nn.BatchNorm2d(c_out)
        self.dev, self.fwd_ms, self.bwd_ms = dev, fwd_ms, bwd_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return common.device_op(torch.relu(self.bn(self.conv(x))), self.dev, self.fwd_ms, self.bwd_ms)


class CNN(pl.LightningModule):
    def __init__(self, dev: common.Device, device_ms: float) -> None:
        super().__init__()
        fwd_ms, bwd_ms = device_ms / 3 / len(CHANNELS), 2 * device_ms / 3 / len(CHANNELS)
        chans = (1, *CHANNELS)
        self.blocks = nn.Sequential(*[ConvBlock(a, b, dev, fwd_ms, bwd_ms) for a, b in zip(chans, chans[1:],
                                                                                            strict=False)])
        self.head = nn.Linear(CHANNELS[-1], CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(x.view(-1, 1, SIDE, SIDE))
        return self.head(h.mean(dim=(2, 3)))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class StepHooks(pl.Callback):
    """The device's step and the injected host stall at each batch's start; the step clock."""

    def __init__(self, dev: common.Device) -> None:
        self.dev = dev
        self.ticks: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.ticks.append(time.perf_counter())
        self.dev.step = trainer.global_step
        self.dev.host_stall()

    def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.ticks.append(time.perf_counter())


def main() -> None:
    args = common.parse(step_ms=STEP_MS, batch=16)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", module="pytorch_lightning")  # its advice on workers and logging
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    dev = common.Device(args, rank)
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP broadcasts anyway
    model = CNN(dev, DEVICE_SHARE * args.step_ms)
    hooks = StepHooks(dev)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp", max_steps=args.steps, max_epochs=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, use_distributed_sampler=False,
                         callbacks=[hooks])
    trainer.fit(model, common.loader(args, dev, SIDE * SIDE, CLASSES, seed=args.seed * 101 + rank))
    common.report_steps(rank, hooks.ticks)


if __name__ == "__main__":
    main()
