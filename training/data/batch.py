"""Rows of a build -> what a model in archs/ takes: input_ids, targets, doc_starts.

A row of `seq` tokens gives input_ids = row[:-1] and targets = row[1:] (seq - 1 predictions), so
no token of another row is needed. Targets that are padding (the hash-0 segment, see
docs/FORMAT.md) are -100, ignored by the loss. doc_starts is the row's segment starts below
seq - 1, padded with -1 to the batch's widest row: the archs/ convention (first start 0). A
compiled run pads it to the row's length (`full_width`).
The token after an EOS stays a target: it is predicted from the ending document alone, since
attention never crosses the boundary.

Two halves, because a loader worker builds the batch in its own process: `collate` (in the
worker, into a shared-memory slot, training/data/loader.py) keeps the tokens in the build's dtype and
says where padding starts, a few small numpy arrays (torch tensors would each take a new
shared-memory segment, which costs more than the whole batch at these sizes); `model_inputs` (in
the trainer) widens them to the int64 tensors the model takes.
"""

import numpy as np
import torch

from pipeline import PAD_HASH

CPU = torch.device("cpu")


def collate(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]],
            out: np.ndarray | None = None) -> dict:
    """rows: (tokens [seq], starts, hashes or None) as training/data/builds.py gives them; the tokens
    are stacked into `out` when given (a loader worker's shared-memory slot)."""
    tokens = np.stack([t for t, _, _ in rows], out=out)
    T = tokens.shape[1] - 1
    pad_from = np.full(len(rows), T, dtype=np.int64)  # first target index that is padding
    starts = []
    for b, (_, s, h) in enumerate(rows):
        if h is not None and len(h) and h[-1] == PAD_HASH:
            pad_from[b] = max(int(s[-1]) - 1, 0)  # predicting padding teaches nothing
        starts.append(s[s < T])
    doc_starts = np.full((len(rows), max(len(s) for s in starts)), -1, dtype=np.int64)
    for b, s in enumerate(starts):
        doc_starts[b, :len(s)] = s
    return {"tokens": tokens, "pad_from": pad_from, "doc_starts": doc_starts}


def model_inputs(batch: dict, device: torch.device = CPU) -> dict:
    """collate's arrays -> int64 tensors on `device`. The tokens travel in their stored width and
    are widened there (on a GPU: a quarter of the bytes over the bus for uint16 tokens)."""
    tokens = batch["tokens"]
    if tokens.dtype.kind == "u" and tokens.dtype.itemsize > 1:
        # torch's unsigned 16/32-bit types have few kernels: move the same bytes as signed
        # integers, then undo the sign extension after widening.
        tokens = tokens.view(tokens.dtype.str.replace("u", "i"))
        mask = (1 << 8 * tokens.dtype.itemsize) - 1
    else:
        mask = None
    moved = [_to(torch.from_numpy(a), device)
             for a in (tokens, batch["pad_from"], batch["doc_starts"])]
    tokens, pad_from, doc_starts = moved
    tokens = tokens.long()
    if mask is not None:
        tokens &= mask
    input_ids, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].clone()
    padding = torch.arange(targets.shape[1], device=device) >= pad_from[:, None]
    targets.masked_fill_(padding, -100)
    return {"input_ids": input_ids, "targets": targets, "doc_starts": doc_starts}


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)  # pinned: the copy does not block


def make_batch(rows: list, device: torch.device = CPU) -> dict:
    return model_inputs(collate(rows), device)



def full_width(doc_starts: torch.Tensor, seq: int) -> torch.Tensor:
    """doc_starts [B, K] padded with -1 to [B, seq], one column per position of the row (the
    most documents a row can hold): the same shape for every batch. collate makes it as wide as
    the batch's most documents, which changes from batch to batch, and torch.compile would
    compile the model again at each new width (docs/BENCHMARKS.md, the first GPU). The padding
    changes no number: every model reads doc_starts up to its first -1
    (tests/test_train_compile.py counts the graphs)."""
    return torch.nn.functional.pad(doc_starts, (0, seq - doc_starts.shape[1]), value=-1)
