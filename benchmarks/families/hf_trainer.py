"""The Hugging Face Trainer: ``transformers.Trainer.train()`` on a tiny GPT-2 built from its config, 4 gloo ranks.

    laggard run --nproc-per-node 4 hf_trainer.py --inject device --rank 1 --factor 1.5

Nothing is downloaded: GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab 256, 16 positions) and random
token sequences (the labels are the inputs; the model shifts them). The Trainer makes the process group
itself (``ddp_backend="gloo"``, ``use_cpu=True``) and wraps the model in DDP; AdamW, ``max_steps`` =
--steps, no saving, no evaluation, no logging, ``report_to`` none.

Device time: each transformer block's and the LM head's forward is wrapped on this model instance: the
module runs REPS times and its output is averaged (the same value, REPS x the real CPU work), then
passes ``common.device_op``. The three ops' device time is DEVICE_SHARE
of --step-ms, a third forward and two thirds backward; the rest is the real model, the Trainer, DDP's
all-reduce on gloo and Python. A callback's ``on_step_begin`` sets the device's step and takes the host
stall (``--inject host``); ``--inject data`` slows the target's data collator by --ms a batch.
With FAMILY_STEP_TIMES=1 each rank prints its median step time at the end.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)
from transformers.utils import logging as hf_logging  # noqa: E402

SEQ, VOCAB = 16, 256
REPS = 1  # real repetitions of each wrapped module's forward
DEVICE_SHARE = 0.6  # of --step-ms: the rest is the real model, the Trainer, the all-reduce, Python
# The Trainer's Python on four ranks takes about a core per step here; a step of 250 ms leaves the
# two cores idle most of it, so a slow device's sleep lengthens the step. Shorter, the ranks are CPU
# bound: one rank's longer sleep hands its core to the others and the job is no slower.
STEP_MS = 250.0


class Tokens(torch.utils.data.Dataset):
    """Random token sequences; each item a dict the model takes (``labels`` are the inputs)."""

    def __init__(self, n: int, seed: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SlowCollator:
    """``default_data_collator`` that takes ``delay_s`` more host time a batch (the slow loader)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return default_data_collator(features)


def on_device(module: torch.nn.Module, dev: common.Device, fwd_ms: float, bwd_ms: float, reps: int) -> None:
    """Wrap this instance's forward: run it ``reps`` times, average the output (a tensor,
    or a tuple's first element), pass it through the emulated device."""
    orig = module.forward

    @functools.wraps(orig)
    def forward(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        outs = [orig(*a, **kw) for _ in range(reps)]
        first = [o[0] if isinstance(o, tuple) else o for o in outs]
        h = first[0]
        for o in first[1:]:
            h = h + o
        h = common.device_op(h / reps if reps > 1 else h, dev, fwd_ms, bwd_ms)
        return (h, *outs[0][1:]) if isinstance(outs[0], tuple) else h

    module.forward = forward


class StepHooks(TrainerCallback):
    """The device's step and the injected host stall at each step's start; the step clock."""

    def __init__(self, dev: common.Device) -> None:
        self.dev = dev
        self.ticks: list[float] = []

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN003, ANN201
        self.ticks.append(time.perf_counter())
        self.dev.step = state.global_step
        self.dev.host_stall()

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003, ANN201
        self.ticks.append(time.perf_counter())


def build(dev: common.Device, device_ms: float) -> GPT2LMHeadModel:
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP broadcasts anyway
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=SEQ, use_cache=False)
    model = GPT2LMHeadModel(cfg)
    mods = [*model.transformer.h, model.lm_head]
    fwd_ms, bwd_ms = device_ms / 3 / len(mods), 2 * device_ms / 3 / len(mods)
    for m in mods:
        on_device(m, dev, fwd_ms, bwd_ms, REPS)
    return model


def main() -> None:
    args = common.parse(step_ms=STEP_MS, batch=4)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    dev = common.Device(args, rank)
    model = build(dev, DEVICE_SHARE * args.step_ms)
    hooks = StepHooks(dev)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, use_cpu=True, ddp_backend="gloo", report_to="none", max_steps=args.steps,
            per_device_train_batch_size=args.batch, learning_rate=1e-3, save_strategy="no", eval_strategy="no",
            logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True, seed=args.seed,
            ddp_find_unused_parameters=False)
        trainer = Trainer(model=model, args=targs,
                          train_dataset=Tokens(args.batch * args.steps * world, seed=args.seed),
                          data_collator=SlowCollator(dev.data_delay_s()), callbacks=[hooks])
        trainer.train()
    common.report_steps(rank, hooks.ticks)


if __name__ == "__main__":
    main()
