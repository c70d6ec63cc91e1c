"""(c) PyTorch Lightning Trainer.fit, strategy ddp on CPU: a small 1-D conv regressor. A Callback's
on_train_batch_end on --slow-rank, when trainer.global_step % every == 0 (optimizer steps done, 1-based),
sleeps --ms (a metrics push). Accelerator time emulated by a sleep in forward/backward."""
import argparse
import json
import os
import time
import warnings

import pytorch_lightning as pl
import torch
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--slow-rank", type=int, default=-1)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--ms", type=float, default=0.0)
args = ap.parse_args()
torch.set_num_threads(1)
warnings.filterwarnings("ignore")
rank = int(os.environ.get("RANK", 0))


class Dev(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(0.010)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.012)
        return g


class Reg(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 16, 5, padding=2)
        self.head = nn.Linear(16 * 32, 1)

    def training_step(self, batch, i):
        x, y = batch
        h = torch.relu(self.conv(x)).flatten(1)
        return nn.functional.mse_loss(self.head(Dev.apply(h)).squeeze(1), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class MetricsPush(pl.Callback):
    def __init__(self):
        self.stalls, self.step_ends = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        k = trainer.global_step
        if trainer.global_rank == args.slow_rank and k % args.every == 0:
            t0 = time.time()
            time.sleep(args.ms / 1000)
            self.stalls.append({"step": k, "batch_idx": batch_idx, "t0": t0, "t1": time.time()})
        self.step_ends.append(time.time())


g = torch.Generator().manual_seed(50 + rank)
n = 16 * args.steps
ds = torch.utils.data.TensorDataset(torch.randn(n, 4, 32, generator=g), torch.randn(n, generator=g))
dl = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=0, drop_last=True)
cb = MetricsPush()
torch.manual_seed(0)
trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", 1)), strategy="ddp",
                     max_steps=args.steps, max_epochs=1, enable_checkpointing=False, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                     callbacks=[cb])
trainer.fit(Reg(), train_dataloaders=dl)
with open(f"steps.rank{trainer.global_rank}.json", "w") as f:
    json.dump({"rank": trainer.global_rank, "counter": "trainer.global_step in on_train_batch_end (1-based)",
               "stalls": cb.stalls, "step_ends": cb.step_ends}, f)
