"""MDS (mosaicml-streaming's format, version 2; `--format mds`, the default): the index schema,
the shard entries pack build writes (bytes encoded by mds_write.py) and the rows read back.

MDS shards are decoded here with numpy and zstandard, so reading needs neither torch nor
mosaicml-streaming. Any MDS dataset whose columns are arrays is read (other tools' shards too:
a `bytes` token column, other column orders); docs/FORMAT.md has the layout.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import zstandard

from longpack.core import LongpackError, SettingsError
from longpack.pipeline.formats import mds_write as write_mds
from longpack.pipeline.formats.base import (
    Shard,
    ShardBlocks,
    ShardError,
    ShardFormat,
    StoredFile,
    read_into_scratch,
    rows_per_block,
    rows_per_shard,
)

UNPACK_CHUNK = 1 << 22  # bytes decompressed at a time into the trainer's cache
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

    def row_blocks(self, starts: list[int], seq: int, dtype: np.dtype, block_bytes: int):
        """(first row, rows) of about `block_bytes` at a time, copied into one block array
        after another: each block is valid until the next is taken."""
        k = rows_per_block(block_bytes, seq, dtype)
        block = np.empty((k, seq), dtype)
        for a in range(0, len(starts), k):
            rows = block[:len(starts) - a]
            self.copy_rows(starts[a:a + k], rows)
            yield a, rows

    def flat(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A variable-length array column, every sample's values concatenated, and their counts."""
        start, count, dtype = self.values(name)
        first = np.repeat(start - np.cumsum(count) * dtype.itemsize + count * dtype.itemsize,
                          count)  # each value's sample start, less the values before it
        at = first + np.arange(int(count.sum())) * dtype.itemsize
        return _gather(self.buf, at, dtype), count


class MappedRows:
    """The rows of a decompressed shard read where they lie (read_rows): `rows[r]` is a view of
    row r, `rows[a:b]` a copy of rows a..b-1 [b - a, seq]."""

    def __init__(self, columns: MdsColumns, starts: list[int], seq: int, dtype: np.dtype):
        self.columns, self.starts, self.seq, self.dtype = columns, starts, seq, np.dtype(dtype)
        self.shape = (len(starts), seq)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, r):
        if isinstance(r, slice):
            starts = self.starts[r]
            rows = np.empty((len(starts), self.seq), self.dtype)
            self.columns.copy_rows(starts, rows)
            return rows
        return np.frombuffer(self.columns.raw, self.dtype, self.seq, self.starts[r])


def _stored(info: dict) -> StoredFile:
    return StoredFile(info["basename"], info["bytes"], info["hashes"].get("sha256"))


class MdsFormat(ShardFormat):
    name = "mds"
    entry_keys = ("samples", "raw_data", "zip_data", "column_names", "column_encodings",
                  "column_sizes")
    compressed = True
    default_compression = "zstd"
    claims_any = True  # any index.json with a list of shards: other tools' MDS too

    @classmethod
    def check_settings(cls, seq: int, shard_bytes: int, compression: str | None) -> None:
        """MDS stores sample positions as u32 (write_mds.MAX_SHARD_BYTES), and a row of
        one-token documents carries a segment per token (12 bytes more per token): a shard
        must fit even then. The tokenizer, which picks 2- or 4-byte tokens, is not loaded yet,
        so both are checked."""
        limit = write_mds.MAX_SHARD_BYTES

        def largest(seq: int, itemsize: int, rows: int, size_limit: int) -> int:
            config = write_mds.shard_config(seq, f"uint{8 * itemsize}", compression, size_limit)
            return write_mds.max_raw_shard_bytes(seq, itemsize, rows, config)

        if largest(seq, 4, 1, shard_bytes) > limit:
            lo, hi = 2, seq  # the longest row that fits a shard alone, by bisection
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if largest(mid, 4, 1, shard_bytes) <= limit else (lo, mid - 1)
            raise SettingsError(f"--seq {seq:,} is too long for MDS: a shard's sample offsets "
                                "are 32-bit and one such row may take "
                                f"{largest(seq, 4, 1, shard_bytes):,} bytes; the largest --seq "
                                f"is {lo:,} (or use --format memmap)")
        if any(largest(seq, i, rows_per_shard(shard_bytes, seq, i), shard_bytes) > limit
               for i in (2, 4)):
            def most_bytes(itemsize: int, size_limit: int) -> int:
                head = largest(seq, itemsize, 0, size_limit)
                fit = (limit - head) // (write_mds.max_sample_bytes(seq, itemsize) + 4)
                return (fit + 1) * seq * itemsize - 1

            most = shard_bytes  # the config records the value itself: settle its length
            for _ in range(3):
                most = min(most_bytes(i, most) for i in (2, 4))
            raise SettingsError(f"--shard-bytes {shard_bytes:,} is too large for MDS with --seq "
                                f"{seq:,}: a shard's sample offsets are 32-bit; the largest "
                                f"--shard-bytes is {most:,}")

    @classmethod
    def for_writing(cls, folder: Path, seq: int, dtype: np.dtype, compression: str | None,
                    size_limit: int) -> "MdsFormat":
        fmt = cls(folder, None)
        fmt.config = write_mds.shard_config(seq, dtype, compression, size_limit)
        return fmt

    @classmethod
    def claims(cls, index: dict) -> bool:
        return True  # any index.json with a list of shards that no other format claims

    def encode_shard(self, number, rows, segments):
        config = self.config
        raw = write_mds.encode_raw_shard(rows, segments, config)
        raw_name = f"shard.{number:05d}.mds"
        raw_info = {"basename": raw_name, "bytes": len(raw),
                    "hashes": {"sha256": hashlib.sha256(raw).hexdigest()}}
        entry = {**config, "samples": len(rows), "raw_data": raw_info, "zip_data": None}
        if config["compression"] is None:
            return {raw_name: raw}, entry
        zipped = write_mds.compress(raw, config["compression"])
        zip_name = f"{raw_name}.zstd"
        entry["zip_data"] = {"basename": zip_name, "bytes": len(zipped),
                             "hashes": {"sha256": hashlib.sha256(zipped).hexdigest()}}
        return {zip_name: zipped}, entry

    def index_json(self, entries):
        return {"version": 2, "shards": entries}

    def rows_in(self, i):
        return self.entries[i]["samples"]

    def stored(self, i):
        entry = self.entries[i]
        return [_stored(entry["zip_data"] or entry["raw_data"])]

    def raw(self, i: int) -> StoredFile:
        """The decompressed shard (what the rows are read from, and its sha256)."""
        return _stored(self.entries[i]["raw_data"])

    def raw_bytes(self, i):
        return self.raw(i).bytes

    def read_shard(self, i):
        """Shard i decoded: its rows copied out of this thread's buffer into one array."""
        columns, starts, seq, dtype, segments = self._columns(i)
        tokens = np.empty((len(starts), seq), dtype)
        columns.copy_rows(starts, tokens)
        return Shard(self.shard_file(i), tokens, segments)

    def read_blocks(self, i, block_bytes):
        """Rows copied into one block after another, never into a whole-shard array."""
        columns, starts, seq, dtype, segments = self._columns(i)
        return ShardBlocks(self.shard_file(i), len(starts), seq, dtype, segments,
                           columns.row_blocks(starts, seq, dtype, block_bytes))

    def unpacked(self, i):
        """The decompressed shard: what the rows are read from at random (a compressed shard
        cannot be read at a row)."""
        return [self.raw(i)]

    def unpack(self, i, stored, out):
        """Decompress the stored shard, a chunk at a time, into out[0]."""
        entry, size = self.entries[i], self.entries[i]["raw_data"]["bytes"]
        source, got = stored[0], 0
        try:
            with source.open("rb") as f, out[0].open("wb") as w:
                reader = (zstandard.ZstdDecompressor().stream_reader(f) if entry["zip_data"]
                          else f)
                while chunk := reader.read(UNPACK_CHUNK):
                    got += len(chunk)
                    if got > size:
                        break
                    w.write(chunk)
        except FileNotFoundError:
            raise ShardError(source, "missing") from None
        except zstandard.ZstdError as e:
            raise ShardError(source, f"cannot be decompressed ({type(e).__name__}: {e})") from None
        if got != size:
            raise ShardError(source, f"decompresses to {'more than ' if got > size else ''}"
                                     f"{got:,} bytes, index.json says {size:,}")

    def read_rows(self, i, folder=None):
        """The decompressed shard in `folder` memory-mapped: `tokens[r]` is a view of row r
        in the map, `tokens[a:b]` a copy of rows a..b-1."""
        path = Path(folder or self.folder) / self.raw(i).basename
        try:
            raw = np.memmap(path, np.uint8, "r")
        except FileNotFoundError:
            raise ShardError(path, "missing") from None
        except (OSError, ValueError) as e:  # an empty file cannot be mapped
            raise ShardError(path, f"unreadable ({e})") from None
        columns, starts, seq, dtype, segments = self._columns(i, raw, path)
        return Shard(self.shard_file(i), MappedRows(columns, starts, seq, dtype), segments)

    def _bytes(self, i: int) -> memoryview:
        """Shard i's (decompressed) bytes, in this thread's buffer."""
        entry, path = self.entries[i], self.shard_file(i)
        size = entry["raw_data"]["bytes"]
        if entry["zip_data"]:
            source = zstandard.ZstdDecompressor().stream_reader(path.read_bytes())
        else:
            source = path.open("rb")
        with source:
            buf, got, extra = read_into_scratch(source, size)
        if got != size or extra:
            raise ValueError(f"it {'decompresses to' if entry['zip_data'] else 'holds'} "
                             f"{'more than ' if extra else ''}{got:,} bytes, index.json says "
                             f"{size:,}")
        return buf

    def _columns(self, i: int, raw=None, path: Path | None = None):
        """(columns, where each row starts, seq, dtype, segments) of shard i: of its
        decompressed bytes `raw` read from `path`, else of its file read into this thread's
        buffer (_bytes)."""
        entry, path = self.entries[i], path or self.shard_file(i)
        try:
            columns = MdsColumns(self._bytes(i) if raw is None else raw, entry)
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
