"""PyTorch Lightning Trainer.fit, strategy ddp on CPU, a 1-D conv regressor. A Callback's
on_train_batch_end, when trainer.global_step % every == 0, runs pl_module on --extra-batches batches
under torch.no_grad() (a "log sample outputs" callback): on --extra-rank alone (--mode alone) or on every
rank (--mode all). --mode slow: every rank runs it and --extra-rank's emulated device is 1.3x slower.
Accelerator time emulated by a sleep in forward/backward."""
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
ap.add_argument("--extra-rank", type=int, default=-1)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--extra-batches", type=int, default=2)
ap.add_argument("--mode", choices=["alone", "all", "slow"], default="alone")
args = ap.parse_args()
torch.set_num_threads(1)
warnings.filterwarnings("ignore")
rank = int(os.environ.get("RANK", 0))
SLOW = 1.3 if args.mode == "slow" and rank == args.extra_rank else 1.0


class Dev(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(0.010 * SLOW)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.012 * SLOW)
        return g


class Reg(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 16, 5, padding=2)
        self.head = nn.Linear(16 * 32, 1)

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return self.head(Dev.apply(h)).squeeze(1)

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class SampleOutputs(pl.Callback):
    def __init__(self):
        self.events, self.step_ends = [], []
        self.gen = torch.Generator().manual_seed(99)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        k = trainer.global_step
        mine = args.mode != "alone" or trainer.global_rank == args.extra_rank
        if mine and k % args.every == 0:
            t0 = time.time()
            module.eval()
            with torch.no_grad():
                for _ in range(args.extra_batches):
                    module(torch.randn(16, 4, 32, generator=self.gen))
            module.train()
            self.events.append({"step": k, "batches": args.extra_batches, "t0": t0, "t1": time.time()})
        self.step_ends.append(time.time())


g = torch.Generator().manual_seed(50 + rank)
n = 16 * args.steps
ds = torch.utils.data.TensorDataset(torch.randn(n, 4, 32, generator=g), torch.randn(n, generator=g))
dl = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=0, drop_last=True)
cb = SampleOutputs()
torch.manual_seed(0)
trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", 1)), strategy="ddp",
                     max_steps=args.steps, max_epochs=1, enable_checkpointing=False, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                     callbacks=[cb])
trainer.fit(Reg(), train_dataloaders=dl)
with open(f"steps.rank{trainer.global_rank}.json", "w") as f:
    json.dump({"rank": trainer.global_rank, "counter": "trainer.global_step in on_train_batch_end (1-based)",
               "events": cb.events, "step_ends": cb.step_ends}, f)
