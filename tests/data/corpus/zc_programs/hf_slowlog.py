"""(b) Hugging Face Trainer.train(): a 2-layer BertForSequenceClassification built from a config
(nothing downloaded), random token data, gloo on CPU. A TrainerCallback.on_step_end on --slow-rank,
when state.global_step % every == 0 (1-based optimizer steps), sleeps --ms (logging to a slow remote
store). Accelerator time is emulated by a sleep in the classifier's forward/backward."""
import argparse
import json
import os
import tempfile
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--slow-rank", type=int, default=-1)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--ms", type=float, default=0.0)
args = ap.parse_args()
torch.set_num_threads(1)
hf_logging.set_verbosity_error()
rank = int(os.environ.get("RANK", 0))
SEQ, BATCH = 24, 8


class Dev(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(0.015)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.020)
        return g


class DevMod(torch.nn.Module):
    def forward(self, x):
        return Dev.apply(x)


class Toks(torch.utils.data.Dataset):
    def __init__(self, n):
        gen = torch.Generator().manual_seed(7 + rank)
        self.ids = torch.randint(5, 500, (n, SEQ), generator=gen)
        self.lab = torch.randint(0, 2, (n,), generator=gen)

    def __len__(self):
        return len(self.lab)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.lab[i]}


class SlowRemoteLog(TrainerCallback):
    def __init__(self):
        self.stalls, self.step_ends = [], []

    def on_step_end(self, targs, state, control, **kw):
        k = state.global_step
        if rank == args.slow_rank and k % args.every == 0:
            t0 = time.time()
            _ = json.dumps({"step": k, "lr": 1e-3})  # tiny payload
            time.sleep(args.ms / 1000)  # slow remote store
            self.stalls.append({"step": k, "t0": t0, "t1": time.time()})
        self.step_ends.append(time.time())


torch.manual_seed(0)
cfg = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=SEQ, num_labels=2)
model = BertForSequenceClassification(cfg)
head = model.classifier
model.classifier = torch.nn.Sequential()
model.classifier.add_module("dev", DevMod())
model.classifier.add_module("lin", head)
cb = SlowRemoteLog()
with tempfile.TemporaryDirectory() as out:
    targs = TrainingArguments(output_dir=out, use_cpu=True, ddp_backend="gloo", report_to=[], max_steps=args.steps,
                              per_device_train_batch_size=BATCH, learning_rate=5e-4, save_strategy="no",
                              logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True, seed=rank,
                              ddp_find_unused_parameters=False)
    Trainer(model=model, args=targs, train_dataset=Toks(BATCH * args.steps * 2), callbacks=[cb]).train()
with open(f"steps.rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "counter": "state.global_step in on_step_end (1-based)", "stalls": cb.stalls,
               "step_ends": cb.step_ends}, f)
