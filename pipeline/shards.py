"""Read packed rows back: one reader for MDS, memmap, and plain [N, seq] .npy directories.

    reader = open_split("OUT/train")
    for tokens, starts, hashes in reader.rows(): ...

`starts` are the row's segment offsets (the first is 0); `hashes` the document hash of each
segment (0 = padding), or None when the data records none (plain .npy: starts then come from
EOS positions when `eos_id` is given, else [0]). MDS shards are decoded here with numpy and
zstandard, so reading needs neither torch nor mosaicml-streaming.
"""

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from pipeline.errors import LongpackError
from pipeline.write_memmap import FORMAT as MEMMAP_FORMAT

BYTES_TOKENS = "int64"  # a `bytes` token column: llm-foundry's converter writes int64 ids


def _gather(buf: np.ndarray, at: np.ndarray, dtype) -> np.ndarray:
    """Values of `dtype` at byte positions `at` of `buf` (uint8), which need not be aligned."""
    size = np.dtype(dtype).itemsize
    return buf[at[:, None] + np.arange(size)].view(dtype).reshape(len(at))


class MdsColumns:
    """Where every sample's value of every column lies in a decompressed MDS shard, found for
    all samples at once (numpy over the offsets table; the one loop copies each row's tokens
    out once). The layout, from mosaicml-streaming's MDS writer: u32 sample count n, u32 offsets
    [n + 1], the shard's JSON header (its columns, as index.json has them), then per sample the
    u32 sizes of its variable-size columns followed by each column's bytes in column order."""

    def __init__(self, raw: bytes, shard: dict):
        self.buf = np.frombuffer(raw, np.uint8)
        self.raw, self.shard = raw, shard
        self.n = int(np.frombuffer(raw, "<u4", 1)[0])
        offsets = np.frombuffer(raw, "<u4", self.n + 1, offset=4).astype(np.int64)
        header = json.loads(bytes(raw[8 + 4 * self.n:offsets[0]]))
        differ = [k for k, v in header.items() if shard.get(k) != v]
        if differ:
            raise LongpackError(f"its header disagrees with index.json on "
                                f"{', '.join(sorted(differ))}")
        if offsets[-1] > len(raw):
            raise ValueError(f"its samples end at byte {offsets[-1]:,}, the shard has "
                             f"{len(raw):,}")
        sizes = shard["column_sizes"]
        variable = [i for i, size in enumerate(sizes) if size is None]
        pos = offsets[:-1] + 4 * len(variable)
        self.spans = {}  # column name -> (byte starts [n], byte sizes [n])
        for i, (name, size) in enumerate(zip(shard["column_names"], sizes)):
            if size is None:
                size = _gather(self.buf, offsets[:-1] + 4 * variable.index(i), "<u4")
            size = np.broadcast_to(np.asarray(size, np.int64), (self.n,))
            self.spans[name] = (pos, size)
            pos = pos + size
        wrong = np.flatnonzero(pos != offsets[1:])
        if len(wrong):
            i = int(wrong[0])
            raise ValueError(f"sample {i} is {offsets[i + 1] - offsets[i]} bytes, its columns "
                             f"{pos[i] - offsets[i]}")

    def values(self, name: str) -> tuple[np.ndarray, np.ndarray, np.dtype]:
        """(where each sample's values start in the buffer, how many, their dtype) of an ndarray
        column (fixed or variable shape) or of a bytes column (other tools' byte-encoded token
        column, read as BYTES_TOKENS)."""
        start, size = self.spans[name]
        encoding = self.shard["column_encodings"][self.shard["column_names"].index(name)]
        kind, _, rest = encoding.partition(":")
        if kind == "bytes":
            dtype = np.dtype(BYTES_TOKENS)
        elif kind == "ndarray":
            dtype_name, _, shape = rest.partition(":")
            if not dtype_name:
                raise LongpackError(f"MDS column {name!r} ({encoding}): dynamic dtype not "
                                    "supported")
            dtype = np.dtype(dtype_name)
            if not shape:  # a header byte (ndim << 2 | code of the shape's uint width), shape
                header = self.buf[start].astype(np.int64)
                if (header >> 2 != 1).any():
                    raise LongpackError(f"MDS column {name!r} ({encoding}): values of "
                                        f"{int(header[header >> 2 != 1][0] >> 2)} dimensions; "
                                        "this reader takes 1-D arrays")
                width = 1 << (header & 3)
                length = np.zeros(self.n, np.int64)
                for code in range(4):
                    this = (header & 3) == code
                    length[this] = _gather(self.buf, start[this] + 1, f"<u{1 << code}")
                start, size = start + 1 + width, size - 1 - width
                if (length * dtype.itemsize != size).any():
                    raise ValueError(f"column {name!r}: a value's shape disagrees with its size")
        else:
            raise LongpackError(f"MDS column {name!r} ({encoding}): not an array column; this "
                                "reader needs tokens (and doc_starts, doc_hashes) as ndarray or "
                                "bytes")
        if (size % dtype.itemsize).any() or (size < 0).any():
            raise ValueError(f"column {name!r}: a value's size is not whole {dtype} elements")
        return start, size // dtype.itemsize, dtype

    def row_starts(self, name: str) -> tuple[list[int], int, np.dtype]:
        """(where each sample's value starts, their one length, dtype) of an array column whose
        values all have the same length: the shard's rows."""
        start, count, dtype = self.values(name)
        if len(set(count.tolist())) > 1:
            raise LongpackError(f"rows of different lengths: {sorted(set(count.tolist()))}")
        return start.tolist(), int(count[0]) if self.n else 0, dtype

    def copy_rows(self, starts: list[int], out: np.ndarray):
        """The values starting at byte `starts` (from row_starts) into the rows of `out`."""
        for i, at in enumerate(starts):  # one copy of each row, aligned or not
            out[i] = np.frombuffer(self.raw, out.dtype, out.shape[1], at)

    def flat(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A variable-length array column, every sample's values concatenated, and their counts."""
        start, count, dtype = self.values(name)
        first = np.repeat(start - np.cumsum(count) * dtype.itemsize + count * dtype.itemsize,
                          count)  # each value's sample start, less the values before it
        at = first + np.arange(int(count.sum())) * dtype.itemsize
        return _gather(self.buf, at, dtype), count


# Each thread's buffer for the shard it is reading (read_blocks, and MDS shards however read):
# the largest shard this thread has read, reused for the next. A fresh buffer per shard is a
# fresh mapping for every shard of 32 MiB and more (pack build's default is 64 MiB), and the
# kernel zero-fills each of its pages on first touch (pack stats at 8 GiB of 64 MiB shards: 22.8
# CPU s before, 20.0 with the kept buffer; docs/BENCHMARKS.md). So nothing read out of the buffer may
# keep a view of it once the thread moves on (MdsColumns copies what it reads).
_scratch = threading.local()


def _shard_bytes(path: Path, entry: dict) -> memoryview:
    """An MDS shard's (decompressed) bytes, in this thread's buffer."""
    size = entry["raw_data"]["bytes"]
    if entry["zip_data"]:
        source = zstandard.ZstdDecompressor().stream_reader(path.read_bytes())
    else:
        source = path.open("rb")
    with source:
        got, extra = _read_into_scratch(source, size)
    if got != size or extra:
        raise ValueError(f"it {'decompresses to' if entry['zip_data'] else 'holds'} "
                         f"{'more than ' if extra else ''}{got:,} bytes, index.json says "
                         f"{size:,}")
    return memoryview(_scratch.buf)[:size]


def _read_into_scratch(source, size: int) -> tuple[int, bool]:
    """Up to `size` bytes of `source` (a file, a zstd stream reader) into this thread's buffer;
    (bytes read, whether more follow)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < size:
        buf = _scratch.buf = bytearray(size)
    out = memoryview(buf)[:size]
    got = 0
    while got < size and (n := source.readinto(out[got:])):
        got += n
    return got, bool(source.read(1))


def _rows_per_block(block_bytes: int, seq: int, dtype: np.dtype) -> int:
    return max(1, block_bytes // max(1, seq * dtype.itemsize))


def _mapped(path: Path) -> np.ndarray:
    return np.load(path, mmap_mode="r")


def _read_whole(path: Path) -> np.ndarray:
    """A .npy file's array, read into this thread's buffer (see _shard_bytes): valid until the
    thread reads its next shard."""
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
        got, extra = _read_into_scratch(f, size)
    if got != size or extra:
        raise ValueError(f"its data is {'more than ' if extra else ''}{got:,} bytes, its "
                         f"header says {size:,}")
    array = np.frombuffer(_scratch.buf, dtype, count)
    return array.reshape(shape[::-1]).T if fortran_order else array.reshape(shape)


# What each shard entry of an index.json must have for this reader (and pack stats) to use it.
ENTRY_KEYS = {"mds": ("samples", "raw_data", "zip_data", "column_names", "column_encodings",
                      "column_sizes"),
              "memmap": ("rows", "tokens", "docs")}


def _read_index(path: Path) -> tuple[dict, str]:
    """(index, "mds" or "memmap") of a split's index.json; ShardError naming it when it is not
    JSON or not an index this reader can use, so no reader of it fails on a missing key."""
    try:
        index = json.loads(path.read_bytes())
    except OSError as e:
        raise ShardError(path, f"unreadable ({e.strerror})") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ShardError(path, f"not valid JSON ({e})") from None
    if not isinstance(index, dict) or not isinstance(index.get("shards"), list):
        raise ShardError(path, "has no list of shards: not an MDS or longpack-memmap index")
    kind = "memmap" if index.get("format") == MEMMAP_FORMAT else "mds"
    for i, entry in enumerate(index["shards"]):
        lacks = [k for k in ENTRY_KEYS[kind] if not isinstance(entry, dict) or k not in entry]
        if lacks:
            raise ShardError(path, f"shard {i} of its {kind} index has no {', '.join(lacks)}")
    return index, kind


def starts_from_eos(tokens: np.ndarray, eos_id: int | None) -> np.ndarray:
    if eos_id is None:
        return np.zeros(1, np.uint32)
    after_eos = np.flatnonzero(tokens[:-1] == eos_id) + 1
    return np.concatenate([[0], after_eos]).astype(np.uint32)


class SplitReader:
    def __init__(self, path: Path, eos_id: int | None = None):
        self.path, self.eos_id = Path(path), eos_id
        index_path = self.path / "index.json"
        if index_path.exists():
            self.index, self.kind = _read_index(index_path)
        elif sorted(self.path.glob("*.npy")):
            self.index, self.kind = None, "npy"
        else:
            raise ShardError(self.path, "no index.json and no .npy files")
        self._files: tuple[Path, ...] | None = None

    def shard_files(self) -> tuple[Path, ...]:
        """The shard files in order, listed once (read_shard looks its file up in this list)."""
        if self._files is None:
            if self.kind == "npy":
                files = sorted(p for p in self.path.glob("*.npy")
                               if not p.name.endswith(".docs.npy"))
            elif self.kind == "memmap":
                files = [self.path / s["tokens"]["basename"] for s in self.index["shards"]]
            else:
                files = [self.path / (s["zip_data"] or s["raw_data"])["basename"]
                         for s in self.index["shards"]]
            self._files = tuple(files)
        return self._files

    def rows_in_shard(self, i: int) -> int:
        if self.kind == "mds":
            return self.index["shards"][i]["samples"]
        if self.kind == "memmap":
            return self.index["shards"][i]["rows"]
        return np.load(self.shard_files()[i], mmap_mode="r").shape[0]

    def shards(self) -> Iterator["Shard"]:
        """Each shard's rows [n, seq] and segments [m, 3] (row, start, hash), or None where the
        data records none. A shard that cannot be read raises ShardError naming it; `read_shard`
        reads one by number, so a caller can report it and go on (`pack stats` does)."""
        for i in range(len(self.shard_files())):
            yield self.read_shard(i)

    def read_shard(self, i: int) -> "Shard":
        """Shard i; .npy files are memory-mapped."""
        if self.kind == "mds":
            columns, starts, seq, dtype, segments = self._mds_columns(i)
            tokens = np.empty((len(starts), seq), dtype)
            columns.copy_rows(starts, tokens)
            return Shard(self.shard_files()[i], tokens, segments)
        return self._npy_shard(i, _mapped)

    def read_blocks(self, i: int, block_bytes: int) -> "ShardBlocks":
        """Shard i for one pass over its rows, about `block_bytes` of them at a time, each block
        used while it is still in the CPU's cache. The file is read in one sequential read
        into this thread's buffer (_scratch), and MDS rows are copied into one block after
        another, never into a whole-shard array: the caller must be done with a block before
        it takes the next, and take them all before this thread reads another shard."""
        if self.kind != "mds":
            shard = self._npy_shard(i, _read_whole)
            n, seq = shard.tokens.shape
            k = _rows_per_block(block_bytes, seq, shard.tokens.dtype)
            return ShardBlocks(shard.path, n, seq, shard.tokens.dtype, shard.segments,
                               ((a, shard.tokens[a:a + k]) for a in range(0, n, k)))
        columns, starts, seq, dtype, segments = self._mds_columns(i)
        k = _rows_per_block(block_bytes, seq, dtype)

        def blocks():
            block = np.empty((k, seq), dtype)
            for a in range(0, len(starts), k):
                rows = block[:len(starts) - a]
                columns.copy_rows(starts[a:a + k], rows)
                yield a, rows

        return ShardBlocks(self.shard_files()[i], len(starts), seq, dtype, segments, blocks())

    def _npy_shard(self, i: int, load) -> "Shard":
        path = self.shard_files()[i]
        try:
            tokens = load(path)
        except FileNotFoundError:
            raise ShardError(path, "missing") from None
        except (OSError, ValueError) as e:
            raise ShardError(path, f"unreadable .npy ({e})") from None
        if tokens.ndim != 2:
            raise ShardError(path, f"shape {tokens.shape}, expected [rows, seq]")
        segments = None
        if self.kind == "memmap":
            docs_path = path.with_name(path.name.replace(".tokens.npy", ".docs.npy"))
            try:
                segments = np.load(docs_path, mmap_mode="r")
            except FileNotFoundError:
                raise ShardError(docs_path, "missing") from None
            except (OSError, ValueError) as e:
                raise ShardError(docs_path, f"unreadable .npy ({e})") from None
            if segments.ndim != 2 or segments.shape[1] != 3:
                raise ShardError(docs_path, f"shape {segments.shape}, expected [segments, 3]")
            entry = self.index["shards"][i]
            if tokens.shape[0] != entry["rows"]:
                raise ShardError(path, f"holds {tokens.shape[0]} rows, index.json says "
                                       f"{entry['rows']}")
        return Shard(path, tokens, segments)

    def _mds_columns(self, i: int):
        """(columns, where each row starts, seq, dtype, segments) of MDS shard i, its bytes in
        this thread's buffer (_shard_bytes)."""
        entry, path = self.index["shards"][i], self.shard_files()[i]
        try:
            columns = MdsColumns(_shard_bytes(path, entry), entry)
            if columns.n != entry["samples"]:
                raise ShardError(path, f"holds {columns.n} rows, index.json says "
                                       f"{entry['samples']}")
            if "tokens" not in columns.spans:
                raise ShardError(path, "has no 'tokens' column")
            starts, seq, dtype = columns.row_starts("tokens")
            segments = None
            if "doc_starts" in columns.spans:
                doc_starts, count = columns.flat("doc_starts")
                hashes = (columns.flat("doc_hashes") if "doc_hashes" in columns.spans
                          else (np.zeros(len(doc_starts), np.uint64), count))
                if not np.array_equal(hashes[1], count):
                    raise ValueError("doc_hashes and doc_starts differ in length")
                segments = np.stack([np.repeat(np.arange(columns.n, dtype=np.uint64), count),
                                     doc_starts.astype(np.uint64),
                                     hashes[0].astype(np.uint64)], axis=1)
        except FileNotFoundError:
            raise ShardError(path, "missing") from None
        except ShardError:
            raise
        except LongpackError as e:  # a header or a column this reader cannot use
            raise ShardError(path, str(e)) from None
        except Exception as e:  # zstd errors, truncated buffers, bad offsets
            raise ShardError(path, f"cannot be decoded ({type(e).__name__}: {e})") from None
        return columns, starts, seq, dtype, segments

    def rows(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """(tokens, starts, hashes) of each row; see the module docstring."""
        for shard in self.shards():
            if shard.segments is None:
                for row in shard.tokens:
                    yield row, starts_from_eos(row, self.eos_id), None
                continue
            bounds = np.searchsorted(shard.segments[:, 0], np.arange(len(shard.tokens) + 1))
            for r, row in enumerate(shard.tokens):
                seg = shard.segments[bounds[r]:bounds[r + 1]]
                yield row, seg[:, 1].astype(np.uint32), seg[:, 2]


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


def open_split(path, eos_id: int | None = None) -> SplitReader:
    return SplitReader(Path(path), eos_id)
