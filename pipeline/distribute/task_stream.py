"""One task's documents of one split, as the task tokenized them: not yet rows; and the
checksums that guard every file a task writes until the merge has used it.

A task of `pack build --tasks N` cannot cut rows: where its first row begins depends on how
many tokens the tasks before it hold. So it writes its documents as they come, in its work
folder:

    <split>.tokens   the documents' tokens ([BOS] + ids + EOS each), concatenated, token dtype
    <split>.docs     uint64 pairs (length in tokens, document hash), one per document

Both are append-only; the task's checkpoint records how many tokens and documents of them are
valid, and a resumed task cuts them back to that (as ShardSink does with its partial files).
Once the counts of earlier tasks are known, merge.py cuts rows out of these files, read as
one split's stream over the tasks (`SplitStreams`).

Checksums. A task's files wait on a shared file system, maybe for hours, until other machines
read them; a byte that changes there (bit rot, a bad disk, a careless hand) would go into the
dataset unseen, and `pack stats --verify` would pass, since the shards' hashes are taken as
they are cut. So a finished task records in its done.json, for each file it wrote, its size
and the sha256 of each BLOCK_BYTES block (`file_checksums`), and every reader of a task's
files (placing, merging) reads them through `TaskFile`, which checks each block it touches
before its bytes are used: the cost is a hash of what is read, rounded out to whole blocks, not
of whole files (the merge reads a shard's worth of the last tasks' tokens). The JSON records
themselves (done.json, placed.json, tasks.json) carry the sha256 of their own content
(work_folder.py's `seal`). A damaged file is `TaskDamaged`: one line naming the file and the
task whose re-run writes it again.
"""

import bisect
import contextlib
import hashlib
from pathlib import Path

import numpy as np

from longpack.core import open_write_ahead, writing
from longpack.pipeline.distribute.work_folder import BLOCK_BYTES, DOC_BYTES, TaskDamaged, stream_files


def stream_paths(folder: Path, split: str) -> tuple[Path, Path]:
    return tuple(Path(folder) / name for name in stream_files(split))


class TaskStream:
    def __init__(self, folder: Path, split: str, dtype: np.dtype, state: dict | None = None):
        self.dtype = np.dtype(dtype)
        state = state or {"tokens": 0, "docs": 0}
        self.tokens, self.docs = state["tokens"], state["docs"]
        sizes = (self.tokens * self.dtype.itemsize, self.docs * DOC_BYTES)
        self._files = [open_write_ahead(path, size)
                       for path, size in zip(stream_paths(folder, split), sizes)]

    def append(self, tokens: np.ndarray, lengths: np.ndarray, hashes: np.ndarray) -> None:
        docs = np.stack([lengths.astype("<u8"), hashes.astype("<u8")], axis=1)
        for f, data in zip(self._files, (tokens.astype(self.dtype.newbyteorder("<"), copy=False),
                                         docs)):
            with writing(Path(f.name)):
                f.write(data.tobytes())
        self.tokens += len(tokens)
        self.docs += len(docs)

    def state(self) -> dict:
        for f in self._files:
            with writing(Path(f.name)):
                f.flush()
        return {"tokens": self.tokens, "docs": self.docs}

    def close(self) -> None:
        for f in self._files:
            with writing(Path(f.name)):
                f.close()

    def abandon(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()


def read_stream(folder: Path, split: str, dtype: np.dtype, done: dict, task: int, tasks: int
                ) -> tuple["TaskFile", np.ndarray]:
    """(the tokens file, docs [m, 2] uint64) of a finished task's split (`done`: its record):
    the tokens to be read by range (TaskFile.tokens), the docs read whole; both checked."""
    counts = done["counts"]["splits"][split]
    dtype = np.dtype(dtype).newbyteorder("<")
    tokens_name, docs_name = stream_files(split)
    tokens = TaskFile(folder, tokens_name, done, task, tasks, counts["tokens"] * dtype.itemsize)
    docs = TaskFile(folder, docs_name, done, task, tasks, counts["documents"] * DOC_BYTES)
    tokens.check_size()
    doc_array = np.frombuffer(docs.read(0, docs.need), "<u8").reshape(-1, 2)
    return tokens, doc_array


def file_checksums(path: Path, block_bytes: int = BLOCK_BYTES) -> dict:
    """{"bytes": size, "blocks": [sha256 hex of each block_bytes block]} (an empty file: no
    blocks; a file up to one block: one, its sha256)."""
    blocks, size = [], 0
    with open(path, "rb") as f:
        while data := f.read(block_bytes):
            blocks.append(hashlib.sha256(data).hexdigest())
            size += len(data)
    return {"bytes": size, "blocks": blocks}


class TaskFile:
    """A file task `task` wrote, read only through the checksums its done.json records: each
    block a read touches is hashed and compared before its bytes are used (the last block
    read is kept: consecutive shards share their boundary block). A done.json written before
    checksums were recorded (no "files"): the file's size is checked, as then."""

    def __init__(self, folder: Path, name: str, done: dict, task: int, tasks: int, need: int):
        self.path, self.task, self.tasks, self.need = Path(folder) / name, task, tasks, need
        self.record = done.get("files", {}).get(name)
        self.block = done.get("block_bytes", BLOCK_BYTES)
        self._size: int | None = None
        self._last: tuple[int, bytes] | None = None  # (block number, its bytes)

    def damaged(self, what: str) -> TaskDamaged:
        return TaskDamaged(self.path, self.task, self.tasks, what)

    def check_size(self) -> int:
        if self._size is None:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                raise self.damaged(f"missing (task {self.task} wrote it)") from None
            if self.record is not None and size != self.record["bytes"]:
                raise self.damaged(f"{size:,} bytes, not the {self.record['bytes']:,} task "
                                   f"{self.task} wrote (damaged or changed since)")
            if size < self.need:
                raise self.damaged(f"shorter than task {self.task} recorded ({size:,} bytes, "
                                   f"not {self.need:,}): damaged or cut")
            self._size = size
        return self._size

    def read(self, start: int, end: int) -> bytearray:
        """Bytes [start, end) of the file, each block they touch checked."""
        self.check_size()
        out = bytearray(end - start)
        if end <= start:
            return out
        with open(self.path, "rb") as f:
            if self.record is None:
                f.seek(start)
                if f.readinto(out) != len(out):
                    raise self.damaged("shorter than its task recorded")
                return out
            b = self.block
            for k in range(start // b, -(-end // b)):
                data = self._block(f, k)
                lo, hi = max(start, k * b), min(end, (k + 1) * b)
                out[lo - start:hi - start] = data[lo - k * b:hi - k * b]
        return out

    def tokens(self, lo: int, hi: int, dtype: np.dtype) -> np.ndarray:
        """Tokens [lo, hi) of a tokens file."""
        size = np.dtype(dtype).itemsize
        return np.frombuffer(self.read(lo * size, hi * size), np.dtype(dtype).newbyteorder("<"))

    def check(self) -> None:
        """Every block (a finished task run again checks all it wrote)."""
        self.check_size()
        if self.record is not None:
            with open(self.path, "rb") as f:
                for k in range(len(self.record["blocks"])):
                    self._block(f, k)

    def _block(self, f, k: int) -> bytes:
        if self._last is not None and self._last[0] == k:
            return self._last[1]
        f.seek(k * self.block)
        data = f.read(self.block)
        if hashlib.sha256(data).hexdigest() != self.record["blocks"][k]:
            first = k * self.block
            raise self.damaged(f"damaged since task {self.task} wrote it: bytes {first:,} to "
                               f"{first + len(data) - 1:,} do not match their sha256 in its "
                               "done.json")
        self._last = k, data
        return data


class SplitStreams:
    """The tasks' documents of one split, read lazily and checked against their tasks'
    checksums as they are read (task_stream.TaskFile): task j's tokens are global positions
    [offsets[j], offsets[j + 1]). `dones`: the done.json records of tasks 0..len-1 of
    `tasks`."""

    def __init__(self, folders: list[Path], split: str, dtype: np.dtype, dones: list[dict],
                 tasks: int):
        self.folders, self.split, self.dtype = folders, split, np.dtype(dtype)
        self.dones, self.tasks = dones, tasks
        self.counts = [d["counts"]["splits"][split]["tokens"] for d in dones]
        self.offsets = np.concatenate([[0], np.cumsum(self.counts, dtype=np.int64)]).tolist()
        self._open: dict[int, tuple] = {}

    def _task(self, j: int):
        if j not in self._open:
            tokens, docs = read_stream(self.folders[j], self.split, self.dtype, self.dones[j], j,
                                       self.tasks)
            self._open[j] = tokens, docs, np.cumsum(docs[:, 0].astype(np.int64))
        return self._open[j]

    def piece(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tokens [a, b) and the document pieces in them: (tokens, lengths, hashes)."""
        tokens, lengths, hashes = [], [], []
        j = bisect.bisect_right(self.offsets, a) - 1
        while j < len(self.counts) and self.offsets[j] < b:
            if self.counts[j]:
                at = self.offsets[j]
                lo, hi = max(a, at) - at, min(b, self.offsets[j + 1]) - at
                task_tokens, docs, ends = self._task(j)
                first = int(np.searchsorted(ends, lo, side="right"))
                last = int(np.searchsorted(ends, hi, side="left"))  # the document holding hi - 1
                doc_ends = ends[first:last + 1]
                doc_starts = doc_ends - docs[first:last + 1, 0].astype(np.int64)
                tokens.append(task_tokens.tokens(lo, hi, self.dtype))
                lengths.append(np.minimum(doc_ends, hi) - np.maximum(doc_starts, lo))
                hashes.append(docs[first:last + 1, 1])
            j += 1
        if not tokens:
            return np.zeros(0, self.dtype), np.zeros(0, np.int64), np.zeros(0, np.uint64)
        return np.concatenate(tokens), np.concatenate(lengths), np.concatenate(hashes)
