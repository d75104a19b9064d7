"""One task's documents of one split, as the task tokenized them: not yet rows; and the
checksums that guard every file a task writes until the merge has used it.

A task of `pack build --tasks N` cannot cut rows: where its first row begins depends on how
many tokens the tasks before it hold. So it writes its documents as they come, in its work
folder:

    <split>.tokens   the documents' tokens ([BOS] + ids + EOS each), concatenated, token dtype
    <split>.docs     uint64 pairs (length in tokens, document hash), one per document

Both are append-only; the task's checkpoint records how many tokens and documents of them are
valid, and a resumed task cuts them back to that (as ShardSink does with its partial files).
Once the counts of earlier tasks are known, merge.py cuts rows out of these files.

Checksums. A task's files wait on a shared file system, maybe for hours, until other machines
read them; a byte that changes there (bit rot, a bad disk, a careless hand) would go into the
dataset unseen, and `pack stats --verify` would pass, since the shards' hashes are taken as
they are cut. So a finished task records in its done.json, for each file it wrote, its size
and the sha256 of each BLOCK_BYTES block (`file_checksums`), and every reader of a task's
files (placing, merging) reads them through `TaskFile`, which checks each block it touches
before its bytes are used: the cost is a hash of what is read, rounded out to whole blocks, not
of whole files (the merge reads a shard's worth of the last tasks' tokens). The JSON records
themselves (done.json, placed.json, tasks.json) carry the sha256 of their own content
(`seal`). A damaged file is `TaskDamaged`: one line naming the file and the task whose re-run
writes it again.
"""

import contextlib
import hashlib
import json
from pathlib import Path

import numpy as np

from longpack.atomic import open_write_ahead, writing
from longpack.errors import SettingsError

DOC_BYTES = 2 * 8
BLOCK_BYTES = 1 << 24  # 16 MiB: a 1.3 G-token task's tokens have 160 block sums in done.json
SEAL = "record_sha256"


class TaskDamaged(SettingsError):
    """A file of task `task` is not what that task wrote: re-running the task writes it again
    (a finished task run again checks its files and runs again from its start when one is
    damaged, task_build.py)."""

    def __init__(self, path: Path, task: int, tasks: int, what: str):
        super().__init__(f"{path}: {what}; re-run task {task} to write it again (the build's "
                         f"command with --tasks {tasks} --task-index {task}), then `pack merge` "
                         "if it does not merge by itself")
        self.path, self.task = Path(path), task


def stream_files(split: str) -> tuple[str, str]:
    return f"{split}.tokens", f"{split}.docs"


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


def seal(record: dict) -> dict:
    """The record with the sha256 of its own content added (under SEAL)."""
    body = {k: v for k, v in record.items() if k != SEAL}
    return {**body, SEAL: _digest(body)}


def seal_broken(record: dict) -> bool:
    """True if the record's SEAL is not its content's (a record without one, written before
    records were sealed, is taken as it is)."""
    return SEAL in record and record[SEAL] != _digest({k: v for k, v in record.items()
                                                       if k != SEAL})


def _digest(body: dict) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_record(path: Path) -> tuple[dict | None, str | None]:
    """(a JSON record, None), (None, what is wrong with it), or (None, None) if there is no
    file. Nothing but a readable JSON object whose seal holds is a record."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (FileNotFoundError, NotADirectoryError):  # a folder above it is a file: none
        return None, None
    except IsADirectoryError:
        return None, "a folder, not a file"
    except UnicodeDecodeError:
        return None, "not UTF-8 text (damaged)"
    try:
        record = json.loads(text)
    except ValueError as e:
        return None, f"not JSON ({e}; damaged or cut)"
    if not isinstance(record, dict):
        return None, f"not a JSON object but {type(record).__name__} (damaged)"
    if seal_broken(record):
        return None, "its content does not match its sha256 (damaged since it was written)"
    return record, None


def shape_error(value, shape, where: str = "") -> str | None:
    """Where `value` first differs from `shape`: a type or tuple of types (bool is not an int
    here), a dict (these keys at least, each of its shape) or a list of one shape (a list of
    such). None when it fits."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where or 'it'} is not an object"
        for key, sub in shape.items():
            if key not in value:
                return f"no {where + '.' if where else ''}{key}"
            if (wrong := shape_error(value[key], sub, f"{where + '.' if where else ''}{key}")):
                return wrong
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is not a list"
        return next((w for i, v in enumerate(value)
                     if (w := shape_error(v, shape[0], f"{where}[{i}]"))), None)
    types = shape if isinstance(shape, tuple) else (shape,)
    if (isinstance(value, bool) and int in types and bool not in types) or not isinstance(
            value, types):
        return f"{where} is {json.dumps(value)[:40]}, not {' or '.join(t.__name__ for t in types)}"
    return None
