"""A model's loss on a build's rows: what the trainer's val loss and `zoo eval` report.

    loss_sum, targets = split_loss(model, rows, n=len(rows), batch_size=8)
    loss = loss_sum / targets                  # nats per real target, however it was batched

`bits_per_byte` turns a loss per token into one per byte of UTF-8 text (the manifest's tokens
and text_bytes), so models of different tokenizers compare.
"""

import contextlib
import math

import torch

from longpack.training.data.loader import documents, make_batch
from longpack.training.step import autocast

CPU = torch.device("cpu")


def split_loss(model, rows, n: int, batch_size: int, device: torch.device = CPU,
               doc_mask: bool = True, cfg=None, rank: int = 0, world: int = 1,
               reading=contextlib.nullcontext) -> tuple[float, int]:
    """(sum of the loss of every real target of rows[0:n], their number) on this process's
    share of the batches: every `world`-th batch from `rank`. `cfg`: the run's settings, for
    autocast (None: fp32).

    Every process runs ceil(batches / world) forwards, whatever n: a sharded model's forward
    gathers its weights from all the processes, so one that ran short would leave the others
    waiting for it forever. A process short of a batch runs rows[0:batch_size] with every
    target masked (-100), which adds nothing to either number. n = 0: no forward anywhere.
    For the same reason, with other processes this one reads all its rows before its first
    forward, inside `reading()` (the trainer's distributed.failing_together): a row that cannot
    be read (a damaged val shard) then stops every process there, not this one alone mid-way
    while the others wait in a forward. One process reads as it goes (`zoo eval` of a whole
    split holds one batch at a time)."""
    starts = range(0, n, batch_size)
    mine = starts[rank::world]
    forwards = -(-len(starts) // world)

    def read():  # each forward's rows, and whether its targets are all masked
        for k in range(forwards):
            i = mine[k] if k < len(mine) else 0
            yield [rows.get(r) for r in range(i, min(i + batch_size, n))], k >= len(mine)

    batches = read()
    if world > 1:
        with reading():
            batches = list(batches)
    was_training = model.training
    model.eval()
    loss_sum, targets = 0.0, 0
    try:
        with torch.no_grad():
            for chosen, padding in batches:
                batch = make_batch(chosen, device)
                if padding:
                    batch["targets"].fill_(-100)
                with autocast(cfg, device) if cfg is not None else contextlib.nullcontext():
                    out = model.loss(batch["input_ids"], batch["targets"],
                                     documents(batch) if doc_mask else None)
                count = int((batch["targets"] != -100).sum())
                if count:  # ce is the mean over these targets; a batch of padding adds nothing
                    loss_sum += out["ce"].item() * count
                    targets += count
    finally:  # a failed evaluation (a damaged val shard) leaves the model as it found it
        model.train(was_training)
    return loss_sum, targets


def bits_per_byte(loss: float, split: dict) -> float | None:
    """A mean loss per token (nats) as bits per byte of text, from a manifest's split counts."""
    if not split.get("text_bytes"):
        return None
    return loss / math.log(2) * split["tokens"] / split["text_bytes"]
