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

Under --packing best-fit (BestFitLayout) rows are made window by window (pack/best_fit.py): a
document's window follows from its position in the split's stream, i.e. from its task's offset,
but how many rows a window makes depends on its documents' lengths. So the layout reads the
lengths of the tasks' documents in task order (their .docs files, 16 bytes a document, not
their tokens) and counts each window's rows with the packer's own rule (`plan_rows`); the
prefix sum of those counts says where each window's rows fall. A full shard is placed by the
task holding the last token of the window its last row comes from, once that window is whole
(a document reached its end): every window up to it is then whole, in that task or before.
The split's last window, packed only when every task is done, and the shards holding its rows
are the merge's. A shard is cut by packing each window it holds rows of with `pack_window`,
the single build's function, from that window's documents. Cost: placing task i reads the
lengths of every document of tasks 0..i and plans them (a Python step per document); the merge
does it once for all.
"""

import numpy as np

from longpack.pipeline.pack.best_fit import WINDOW_ROWS, pack_window, plan_rows, window_ends
from longpack.pipeline.pack.packer import RowPacker


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

    def cut(self, streams, k: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
        return cut_shard(self, streams, k, eos_id)


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


class BestFitLayout:
    """One split of a best-fit build over its tasks: its windows (a range of the split's
    tokens, the rows they make, the task holding their last document), read task by task
    (`extend`, in task order), the last one once every task is read (`close`)."""

    def __init__(self, seq: int, rows_per_shard: int, window_rows: int = WINDOW_ROWS):
        self.seq, self.rows_per_shard, self.window = seq, rows_per_shard, window_rows * seq
        self.bounds = [0]  # window w: tokens [bounds[w], bounds[w + 1])
        self.row_ends = [0]  # window w: rows [row_ends[w], row_ends[w + 1])
        self.last_task: list[int] = []  # of each window: the task holding its last document
        self.whole = 0  # windows whole (a document reached their end): all but a closed last
        self.total = 0  # tokens of the tasks read
        self.tasks_read = 0
        self.open: list[np.ndarray] = []  # the lengths of the open window's documents
        self.closed = False

    def extend(self, lengths: np.ndarray) -> None:
        """The next task's documents, by their lengths in tokens."""
        lengths = np.asarray(lengths, np.int64)
        a = 0
        for b in window_ends(self.total, lengths, self.window).tolist():
            self._window(self.open + [lengths[a:b]], self.tasks_read)
            a = b
        self.whole = len(self.last_task)
        if a < len(lengths):
            self.open.append(lengths[a:])
        self.total += int(lengths.sum())
        self.tasks_read += 1

    def close(self) -> None:
        """Every task is read: the open window is the split's last (packed by `finish` in a
        single build)."""
        if not self.closed and self.open:
            self._window(self.open, self.tasks_read - 1)
        self.closed = True

    def _window(self, parts: list[np.ndarray], task: int) -> None:
        lengths = np.concatenate(parts)
        self.bounds.append(self.bounds[-1] + int(lengths.sum()))
        self.row_ends.append(self.row_ends[-1] + len(plan_rows(lengths, self.seq)))
        self.last_task.append(task)
        self.open = []

    @property
    def rows(self) -> int:
        return self.row_ends[-1]

    @property
    def shards(self) -> int:
        return -(-self.rows // self.rows_per_shard)

    @property
    def padding(self) -> int:
        return self.rows * self.seq - self.total

    dropped = 0  # best-fit has no --last-row drop (BuildConfig refuses it)

    def owned(self, i: int) -> range:
        """The full shards task i places: those whose last row is of a whole window whose last
        document is in task i (read the tasks up to i first). Contiguous, as windows and
        tasks go in the same order."""
        if self.tasks_read <= i:
            raise ValueError(f"task {i}'s documents are not read yet")
        full = self.row_ends[self.whole] // self.rows_per_shard
        last_rows = (np.arange(full, dtype=np.int64) + 1) * self.rows_per_shard - 1
        windows = np.searchsorted(self.row_ends, last_rows, side="right") - 1
        mine = np.flatnonzero(np.asarray(self.last_task, np.int64)[windows] == i)
        return range(int(mine[0]), int(mine[-1]) + 1) if len(mine) else range(0)

    def cut(self, streams, k: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard k's rows [n, seq] and segments [m, 3] (row, start, hash), as the single
        build's packer makes them: each window it holds rows of, packed from its documents
        (`streams`: task_stream.py's SplitStreams)."""
        lo = k * self.rows_per_shard
        hi = min(lo + self.rows_per_shard, self.rows)
        first = int(np.searchsorted(self.row_ends, lo, side="right")) - 1
        last = int(np.searchsorted(self.row_ends, hi - 1, side="right")) - 1
        rows, segments = [], []
        for w in range(first, last + 1):
            made, segs, _ = pack_window(*streams.piece(self.bounds[w], self.bounds[w + 1]),
                                        self.seq, eos_id)
            at = self.row_ends[w]  # the window's first row in the split
            a, b = max(lo, at) - at, min(hi, self.row_ends[w + 1]) - at
            mine = segs[(segs[:, 0] >= a) & (segs[:, 0] < b)]
            mine[:, 0] -= np.uint64(a)  # rows of the window's cut -> rows of the shard
            mine[:, 0] += np.uint64(max(at, lo) - lo)
            rows.append(made[a:b])
            segments.append(mine)
        return np.concatenate(rows), np.concatenate(segments)
