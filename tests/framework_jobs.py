"""Training scripts for the framework tests (tests/integrations/test_frameworks.py), run as real gloo
ranks, each a small DDP job on the CPU: ``python tests/framework_jobs.py MODE`` with the environment
torchrun gives (RANK, WORLD_SIZE, ...), or under ``laggard run``. MODE is ``lightning``, ``hf`` or
``accelerate``; with TRACE_OUT set the script traces itself through laggard.integrations (the
framework's callback, or accelerate's autotrace), otherwise it knows nothing of laggard. SLOW_RANK's
training step sleeps SLOW_MS (a slow device: it takes no CPU); STEPS optimizer steps; with FAIL_AT, every
rank's Lightning training step raises at that batch.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

BATCH = 16
STEPS = int(os.environ.get("STEPS", "15"))
TRACE_OUT = os.environ.get("TRACE_OUT")


def slow(rank: int) -> None:
    if rank == int(os.environ.get("SLOW_RANK", "-1")):
        time.sleep(float(os.environ.get("SLOW_MS", "30")) / 1000)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8))


class SlowMLP(nn.Module):
    """The MLP, its forward slowed on SLOW_RANK."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()
        self.rank = int(os.environ.get("RANK", "0"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slow(self.rank)
        return self.net(x)


def data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(100)
    return TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 8, (n,), generator=g))


def lightning() -> None:
    import pytorch_lightning as pl

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            if batch_idx == int(os.environ.get("FAIL_AT", "-1")):
                raise RuntimeError("failing on purpose")
            slow(self.global_rank)
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    callbacks = []
    if TRACE_OUT:
        from laggard.integrations.lightning import LaggardCallback

        callbacks.append(LaggardCallback(TRACE_OUT, name="lightning-explicit"))
    world = int(os.environ["WORLD_SIZE"])
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp", max_steps=STEPS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=callbacks)
    trainer.fit(Net(), DataLoader(data(STEPS * BATCH * world * 2), batch_size=BATCH))


class DictData(Dataset):
    def __init__(self, n: int) -> None:
        self.inner = data(n)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.inner[i]
        return {"x": x, "labels": y}


class HFNet(nn.Module):
    """A model as transformers.Trainer takes one: keyword inputs, a dict with the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()
        self.rank = int(os.environ.get("RANK", "0"))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        slow(self.rank)
        return {"loss": nn.functional.cross_entropy(self.net(x), labels)}


def hf() -> None:
    from transformers import Trainer, TrainingArguments

    callbacks = []
    if TRACE_OUT:
        from laggard.integrations.hf import LaggardTrainerCallback

        callbacks.append(LaggardTrainerCallback(TRACE_OUT, name="hf-explicit"))
    args = TrainingArguments(output_dir=os.environ["HF_OUT"], max_steps=STEPS, per_device_train_batch_size=BATCH,
                             learning_rate=0.05, use_cpu=True, ddp_backend="gloo", ddp_find_unused_parameters=False,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             remove_unused_columns=False, dataloader_num_workers=0)
    world = int(os.environ["WORLD_SIZE"])
    Trainer(model=HFNet(), args=args, train_dataset=DictData(STEPS * BATCH * world * 2), callbacks=callbacks).train()


def accelerate_loop() -> None:
    from accelerate import Accelerator

    from laggard.integrations.accelerate import autotrace

    accelerator = Accelerator(cpu=True)
    model = SlowMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    world = accelerator.num_processes
    loader = DataLoader(data(STEPS * BATCH * world), batch_size=BATCH, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    with autotrace(accelerator, model, opt, out_dir=TRACE_OUT or "trace", name="accelerate-explicit"):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
    accelerator.end_training()


MODES = {"lightning": lightning, "hf": hf, "accelerate": accelerate_loop}

if __name__ == "__main__":
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # the frameworks' advice on worker counts and the like: noise here
    MODES[sys.argv[1]]()
