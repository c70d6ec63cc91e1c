"""Hugging Face ``Trainer.train()`` on a tiny GPT-2 built from its config (nothing downloaded), gloo on CPU.

    torchrun --nproc-per-node 4 hf_trainer.py --inject forward --ms 30   # rank 2's forward 30 ms longer

The model's forward is wrapped with the emulated device time (zc_common) and, on the slowed rank, the
injected delay. `traceml run` attaches to the Trainer by itself, so nothing here calls TraceML.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging  # noqa: E402
from zc_common import StepClock, _Device, parse, slowed  # noqa: E402

SEQ = 16


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.ids = torch.randint(0, 256, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.clock = StepClock()

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN003, ANN201
        self.clock.tick()

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003, ANN201
        self.clock.tick()
        self.clock.write(int(os.environ.get("RANK", 0)))


def with_device_time(model: GPT2LMHeadModel, fwd_s: float, bwd_s: float) -> GPT2LMHeadModel:
    """Wrap this instance's forward: its loss passes through the emulated device (zc_common._Device)."""
    orig = model.forward

    @functools.wraps(orig)  # the Trainer keeps the dataset columns its signature names
    def forward(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        out = orig(*a, **kw)
        out["loss"] = _Device.apply(out["loss"], fwd_s, bwd_s)
        return out

    model.forward = forward
    return model


def main() -> None:
    args = parse(batch=4, fwd_ms=20.0, bwd_ms=25.0)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    rank = int(os.environ.get("RANK", 0))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=SEQ))
    extra = args.ms if slowed(args, rank, "forward") else 0.0
    with_device_time(model, (args.fwd_ms + extra) / 1e3, args.bwd_ms / 1e3)
    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, use_cpu=True, ddp_backend="gloo", report_to=[], max_steps=args.steps,
                                  per_device_train_batch_size=args.batch, learning_rate=1e-3, save_strategy="no",
                                  logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True, seed=rank,
                                  ddp_find_unused_parameters=False)
        trainer = Trainer(model=model, args=targs, train_dataset=Tokens(args.batch * args.steps * 4, seed=rank),
                          callbacks=[clock])
        trainer.train()


if __name__ == "__main__":
    main()
