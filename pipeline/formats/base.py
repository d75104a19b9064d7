"""What a shard format is to longpack: one class per format (mds.py, memmap.py,
npy.py; __init__.py is the registry) that owns the index schema, the shard files and
their byte counts and sha256, encoding a shard and reading its rows back. docs/FORMAT.md is the
spec of the bytes; everything above the formats (pack/writers.py, shards.py, stats, manifest,
pipeline/builds/reader.py) speaks only this interface. The trainer reads rows at random through
`unpacked`, `unpack` and `read_rows`: whatever a format is, it trains from a local folder or a
URL with no change to the trainer.

A format object is one split's folder: opened on its index.json to be read (`formats.open_split`
finds which format it is), or made by `for_writing` to write one.
"""

import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from longpack.core import LongpackError


class ShardError(LongpackError):
    """A file of a split (a shard, its index.json) or the split's folder that cannot be used:
    `path` names it, `what` says why, so a caller can report it and go on."""

    def __init__(self, path: Path, what: str):
        super().__init__(f"{path}: {what}")
        self.path, self.what = Path(path), what


@dataclass
class Shard:
    path: Path
    tokens: np.ndarray  # [rows, seq]
    segments: np.ndarray | None  # [m, 3] uint64 (row within shard, start, hash), sorted


@dataclass
class ShardBlocks:
    path: Path
    rows: int
    seq: int
    dtype: np.dtype
    segments: np.ndarray | None  # as Shard's
    blocks: Iterator[tuple[int, np.ndarray]]  # (first row, rows [k, seq]), in order, once


@dataclass(frozen=True)
class StoredFile:
    """A shard file as its index records it (the two index schemas keep the sha256 in different
    places; each format reads its own into this)."""

    basename: str
    bytes: int
    sha256: str | None


class ShardFormat:
    name: ClassVar[str]  # --format and manifest.json's "format"
    entry_keys: ClassVar[tuple[str, ...]] = ()  # what each index.json shard entry must have
    compressed: ClassVar[bool] = False  # its files may hold fewer bytes than the rows (raw_bytes)
    default_compression: ClassVar[str] = "none"  # --compression when not given
    claims_any: ClassVar[bool] = False  # takes any index no other format claims: asked last

    def __init__(self, folder: Path, index: dict | None):
        self.folder, self.index = Path(folder), index
        self.entries: list[dict] = index["shards"] if index else []

    @classmethod
    def claims(cls, index: dict) -> bool:
        """Whether an index.json (a dict with a list of shards) is this format's."""
        return False

    # ------------------------------------------------------------------ writing
    @classmethod
    def check_settings(cls, seq: int, shard_bytes: int, compression: str | None) -> None:
        """Refuse up front, naming the flag, a --seq, --shard-bytes or --compression (None for
        none) whose shards this format could not hold or no reader open."""

    @classmethod
    def for_writing(cls, folder: Path, seq: int, dtype: np.dtype, compression: str | None,
                    size_limit: int) -> "ShardFormat":
        """A format object writing a split of rows of `seq` tokens of `dtype` into `folder`
        (pack build's --compression, None for none, and --shard-bytes)."""
        raise NotImplementedError

    def encode_shard(self, number: int, rows: np.ndarray, segments: np.ndarray
                     ) -> tuple[dict[str, bytes], dict]:
        """({basename: file bytes}, the shard's index.json entry); `segments` is [m, 3] uint64
        (row within this shard, start, hash), sorted by row."""
        raise NotImplementedError

    def index_json(self, entries: list[dict]) -> dict:
        raise NotImplementedError

    # ------------------------------------------------------------------ the index
    def __len__(self) -> int:
        return len(self.entries)

    def rows_in(self, i: int) -> int:
        raise NotImplementedError

    def stored(self, i: int) -> list[StoredFile]:
        """Shard i's files on disk, as the index records them (none: the format records none)."""
        raise NotImplementedError

    def raw_bytes(self, i: int) -> int:
        """Shard i's bytes before compression (formats that are `compressed`)."""
        raise NotImplementedError

    def shard_file(self, i: int) -> Path:
        """The file that names shard i (in messages, and the one to read first)."""
        return self.folder / self.stored(i)[0].basename

    # ------------------------------------------------------------------ rows
    def read_shard(self, i: int) -> Shard:
        raise NotImplementedError

    def read_blocks(self, i: int, block_bytes: int) -> ShardBlocks:
        """Shard i for one pass over its rows, about `block_bytes` of them at a time. The file
        is read in one sequential read into this thread's buffer (read_into_scratch): the
        caller must take every block before this thread reads another shard."""
        shard = self._read(i, read_whole)
        n, seq = shard.tokens.shape
        k = rows_per_block(block_bytes, seq, shard.tokens.dtype)
        return ShardBlocks(shard.path, n, seq, shard.tokens.dtype, shard.segments,
                           ((a, shard.tokens[a:a + k]) for a in range(0, n, k)))

    def _read(self, i: int, load) -> Shard:
        """Shard i with its .npy files opened by `load` (mapped or read_whole)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ rows at random
    def unpacked(self, i: int) -> list[StoredFile]:
        """The files shard i's rows are read from at random, as the index records them (their
        sha256 is what the trainer checks): its stored files, unless the format stores them
        compressed; then `unpack` makes these from them."""
        return self.stored(i)

    def unpack(self, i: int, stored: list[Path], out: list[Path]) -> None:
        """Write shard i's `unpacked` files to `out` (in their order) from its stored files at
        `stored` (in the order of `stored(i)`), in bounded memory; ShardError naming the stored
        file that cannot be unpacked."""
        raise NotImplementedError(f"{self.name} shards are read as they are stored")

    def read_rows(self, i: int, folder: Path | None = None) -> Shard:
        """Shard i for reading rows at random, its `unpacked` files in `folder` (default: the
        split's folder) memory-mapped, not read: `tokens[r]` is row r (a view), `tokens[a:b]`
        rows a..b-1, and a row costs only what it reads. A format whose `read_shard` maps its
        files has nothing to add; one that unpacks reads its unpacked files here."""
        if folder is None or Path(folder) == self.folder:
            return self.read_shard(i)
        there = copy.copy(self)  # the same index, its files in `folder`
        there.folder = Path(folder)
        return there.read_shard(i)


def rows_per_shard(shard_bytes: int, seq: int, itemsize: int) -> int:
    """--shard-bytes in rows: as many whole rows as fit, at least one."""
    return max(1, shard_bytes // (seq * itemsize))


def rows_per_block(block_bytes: int, seq: int, dtype: np.dtype) -> int:
    return max(1, block_bytes // max(1, seq * np.dtype(dtype).itemsize))


def load_npy(path: Path, load, shape: str) -> np.ndarray:
    """A 2-D .npy file opened by `load`; ShardError naming it when it is missing, unreadable or
    not 2-D (`shape` says what it should be, e.g. "[rows, seq]")."""
    try:
        array = load(path)
    except FileNotFoundError:
        raise ShardError(path, "missing") from None
    except (OSError, ValueError) as e:
        raise ShardError(path, f"unreadable .npy ({e})") from None
    if array.ndim != 2:
        raise ShardError(path, f"shape {array.shape}, expected {shape}")
    return array


def mapped(path: Path) -> np.ndarray:
    return np.load(path, mmap_mode="r")


# Each thread's buffer for the shard it is reading (read_blocks, and MDS shards however read):
# the largest shard this thread has read, reused for the next. A fresh buffer per shard is a
# fresh mapping for every shard of 32 MiB and more (pack build's default is 64 MiB), and the
# kernel zero-fills each of its pages on first touch (pack stats at 8 GiB of 64 MiB shards: 22.8
# CPU s before, 20.0 with the kept buffer; docs/BENCHMARKS.md). So nothing read out of the buffer
# may keep a view of it once the thread moves on (MdsColumns copies what it reads).
_scratch = threading.local()


def read_into_scratch(source, size: int) -> tuple[memoryview, int, bool]:
    """Up to `size` bytes of `source` (a file, a zstd stream reader) into this thread's buffer;
    (the buffer's first `size` bytes, bytes read, whether more follow)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < size:
        buf = _scratch.buf = bytearray(size)
    out = memoryview(buf)[:size]
    got = 0
    while got < size and (n := source.readinto(out[got:])):
        got += n
    return out, got, bool(source.read(1))


def read_whole(path: Path) -> np.ndarray:
    """A .npy file's array, read into this thread's buffer: valid until the thread reads its
    next shard."""
    with path.open("rb") as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f".npy format version {version}; this reader takes 1.0 and 2.0")
        header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
        shape, fortran_order, dtype = header(f)
        if dtype.hasobject:
            raise ValueError("an array of Python objects, not of token ids")
        count = int(np.prod(shape))
        size = count * dtype.itemsize
        buf, got, extra = read_into_scratch(f, size)
    if got != size or extra:
        raise ValueError(f"its data is {'more than ' if extra else ''}{got:,} bytes, its "
                         f"header says {size:,}")
    array = np.frombuffer(buf, dtype, count)
    return array.reshape(shape[::-1]).T if fortran_order else array.reshape(shape)
