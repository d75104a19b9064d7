"""A model's loss on a build's rows: what the trainer's val loss and `zoo eval` report.

    loss_sum, targets = split_loss(model, rows, n=len(rows), batch_size=8)
    loss = loss_sum / targets                  # nats per real target, however it was batched

`bits_per_byte` turns a loss per token into one per byte of UTF-8 text (the manifest's tokens
and text_bytes), so models of different tokenizers compare.
"""

import contextlib
import math

import torch

from training.data.loader import make_batch
from training.step import autocast

CPU = torch.device("cpu")


def split_loss(model, rows, n: int, batch_size: int, device: torch.device = CPU,
               doc_mask: bool = True, cfg=None, rank: int = 0, world: int = 1
               ) -> tuple[float, int]:
    """(sum of the loss of every real target of rows[0:n], their number) on this process's
    share of the batches. `cfg`: the run's settings, for autocast (None: fp32)."""
    starts = range(0, n, batch_size)
    was_training = model.training
    model.eval()
    loss_sum, targets = 0.0, 0
    try:
        with torch.no_grad():
            for i in starts[rank::world]:
                batch = make_batch([rows.get(r) for r in range(i, min(i + batch_size, n))],
                                   device)
                with autocast(cfg, device) if cfg is not None else contextlib.nullcontext():
                    out = model.loss(batch["input_ids"], batch["targets"],
                                     batch["doc_starts"] if doc_mask else None)
                count = int((batch["targets"] != -100).sum())
                loss_sum += out["ce"].item() * count  # ce is the mean over these targets
                targets += count
    finally:  # a failed evaluation (a damaged val shard) leaves the model as it found it
        model.train(was_training)
    return loss_sum, targets


def bits_per_byte(loss: float, split: dict) -> float | None:
    """A mean loss per token (nats) as bits per byte of text, from a manifest's split counts."""
    if not split.get("text_bytes"):
        return None
    return loss / math.log(2) * split["tokens"] / split["text_bytes"]
