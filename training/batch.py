"""Rows of a build -> what a model in archs/ takes: input_ids, targets, doc_starts.

A row of `seq` tokens gives input_ids = row[:-1] and targets = row[1:] (seq - 1 predictions), so
no token of another row is needed. Targets that are padding (the hash-0 segment, see
docs/FORMAT.md) are -100, ignored by the loss. doc_starts is the row's segment starts below
seq - 1, padded with -1 to the batch's widest row: the archs/ convention (first start 0).
The token after an EOS stays a target: it is predicted from the ending document alone, since
attention never crosses the boundary.
"""

import numpy as np
import torch

from pipeline.split import PAD_HASH


def make_batch(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]) -> dict:
    """rows: (tokens [seq], starts, hashes or None) as pipeline.shards.SplitReader gives them."""
    tokens = torch.from_numpy(np.stack([np.asarray(t, dtype=np.int64) for t, _, _ in rows]))
    input_ids, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    T = input_ids.shape[1]
    starts = []
    for b, (_, s, h) in enumerate(rows):
        s = np.asarray(s, dtype=np.int64)
        if h is not None and len(h) and h[-1] == PAD_HASH:
            targets[b, max(int(s[-1]) - 1, 0):] = -100  # predicting padding teaches nothing
        starts.append(s[s < T])
    width = max(len(s) for s in starts)
    doc_starts = torch.full((len(rows), width), -1, dtype=torch.long)
    for b, s in enumerate(starts):
        doc_starts[b, : len(s)] = torch.from_numpy(s)
    return {"input_ids": input_ids, "targets": targets, "doc_starts": doc_starts}
