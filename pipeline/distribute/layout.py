"""Where the rows and shards of a build split into tasks fall, and how a shard is cut out of
the tasks' documents (task_stream.py).

A split's tokens are its tasks' tokens in task order: task i's lie at global positions
[offset(i), offset(i) + tokens(i)), where offset(i) is the sum of the earlier tasks' counts (a
prefix sum). Row r is tokens [r * seq, (r + 1) * seq), shard k rows [k * R, (k + 1) * R)
(R = rows per shard), exactly as in a single-machine build. Every full shard is written by the
task holding its last token: once the tasks up to it are counted, that task knows its offset,
and every token of the shard lies in it or in tasks before it, which are done. So the tasks
write all full shards between them, in parallel, each about its own share; a shard that began
in earlier tasks is read from their files. Only the split's last shard (partial: its padded
row, or fewer than R rows) is left to the merge: one per split, whatever the tasks or tokens.
Which shards a task owns is work_folder.owned_shards: its placed.json is checked against it.

Cutting a shard: its tokens and the document pieces in them (the first document may have
begun in an earlier row, the last one go on in the next) are fed to the same RowPacker a
single-machine build uses. A document piece starting at a row start gives that row a segment
(0, its hash), exactly what the packer gives a row that opens with a continued document, so the
rows and segments are the single-machine build's, bit for bit.
"""

import numpy as np

from pipeline.pack.packer import RowPacker


class SplitLayout:
    """One split: tasks' token counts -> offsets, rows and shards."""

    def __init__(self, counts: list[int], seq: int, rows_per_shard: int, last_row: str):
        self.counts, self.seq, self.rows_per_shard = counts, seq, rows_per_shard
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
        self.total = self.offsets[-1]
        self.pad = last_row == "pad"
        self.rows = -(-self.total // seq) if self.pad else self.total // seq
        self.shards = -(-self.rows // rows_per_shard)
        self.padding = self.rows * seq - self.total if self.pad else 0
        self.dropped = 0 if self.pad else self.total - self.rows * seq

    def span(self, k: int) -> tuple[int, int, bool]:
        """(first token, end token, padded) of shard k: padded when it holds the split's last,
        partial row (its tokens then end at the split's end)."""
        rows = min(self.rows_per_shard, self.rows - k * self.rows_per_shard)
        start = k * self.rows_per_shard * self.seq
        end = start + rows * self.seq
        return start, min(end, self.total), end > self.total


def cut_shard(layout: SplitLayout, streams, k: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Shard k's rows [n, seq] and segments [m, 3] (row, start, hash), as a single-machine
    build's packer makes them, from the split's documents (`streams`: task_stream.py's
    SplitStreams)."""
    start, end, padded = layout.span(k)
    packer = RowPacker(layout.seq, streams.dtype)
    rows, segments = packer.add(*streams.piece(start, end))
    if padded:
        last, last_segments, _, _ = packer.finish("pad", eos_id)
        last_segments[:, 0] += np.uint64(len(rows))
        rows, segments = np.concatenate([rows, last]), np.concatenate([segments, last_segments])
    return rows, segments
