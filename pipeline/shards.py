"""Read packed rows back: one reader for MDS, memmap, and plain [N, seq] .npy directories.

    reader = open_split("OUT/train")
    for tokens, starts, hashes in reader.rows(): ...

`starts` are the row's segment offsets (the first is 0); `hashes` the document hash of each
segment (0 = padding), or None when the data records none (plain .npy: starts then come from
EOS positions when `eos_id` is given, else [0]). MDS shards are decoded here with numpy and
zstandard, so reading needs neither torch nor mosaicml-streaming.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from pipeline.errors import LongpackError
from pipeline.write_memmap import FORMAT as MEMMAP_FORMAT

SHAPE_DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)


def _decode_column(encoding: str, data: memoryview):
    kind, _, rest = encoding.partition(":")
    if kind == "ndarray":
        dtype, _, shape = rest.partition(":")
        if not dtype:
            raise LongpackError(f"MDS column encoding {encoding!r}: dynamic dtype not supported")
        if shape:
            return np.frombuffer(data, dtype).reshape([int(x) for x in shape.split(",")])
        ndim, code = data[0] >> 2, data[0] & 3
        sdt = np.dtype(SHAPE_DTYPES[code])
        shape = np.frombuffer(data[1:1 + ndim * sdt.itemsize], sdt)
        return np.frombuffer(data[1 + ndim * sdt.itemsize:], dtype).reshape(shape)
    if kind == "bytes":
        return bytes(data)
    if kind == "str":
        return bytes(data).decode("utf-8")
    if kind == "int":
        return int(np.frombuffer(data, np.int64)[0])
    if kind in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                "float32", "float64"):
        return np.frombuffer(data, kind)[0]
    raise LongpackError(f"MDS column encoding {encoding!r} is not supported by this reader")


def decode_mds_shard(raw: bytes, shard: dict) -> Iterator[dict]:
    """Samples of one decompressed MDS shard, as dicts of column name -> value."""
    names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
    buf = memoryview(raw)
    n = int(np.frombuffer(buf[:4], "<u4")[0])
    offsets = np.frombuffer(buf[4:4 + 4 * (n + 1)], "<u4")
    n_dynamic = sum(s is None for s in sizes)
    for i in range(n):
        sample = buf[offsets[i]:offsets[i + 1]]
        dynamic = iter(np.frombuffer(sample[:4 * n_dynamic], "<u4"))
        pos = 4 * n_dynamic
        out = {}
        for name, enc, size in zip(names, encodings, sizes):
            size = int(next(dynamic)) if size is None else size
            out[name] = _decode_column(enc, sample[pos:pos + size])
            pos += size
        if pos != len(sample):
            raise ValueError(f"sample {i} is {len(sample)} bytes, its columns {pos}")
        yield out


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
            self.index = json.loads(index_path.read_text())
            self.kind = "memmap" if self.index.get("format") == MEMMAP_FORMAT else "mds"
        elif sorted(self.path.glob("*.npy")):
            self.index, self.kind = None, "npy"
        else:
            raise LongpackError(f"{self.path}: no index.json and no .npy files; is this a "
                                "pack build output split (OUT/train or OUT/val)?")

    def shard_files(self) -> list[Path]:
        if self.kind == "npy":
            return sorted(p for p in self.path.glob("*.npy") if not p.name.endswith(".docs.npy"))
        if self.kind == "memmap":
            return [self.path / s["tokens"]["basename"] for s in self.index["shards"]]
        return [self.path / (s["zip_data"] or s["raw_data"])["basename"]
                for s in self.index["shards"]]

    def rows_in_shard(self, i: int) -> int:
        if self.kind == "mds":
            return self.index["shards"][i]["samples"]
        if self.kind == "memmap":
            return self.index["shards"][i]["rows"]
        return np.load(self.shard_files()[i], mmap_mode="r").shape[0]

    def shards(self, bytes_dtype: str = "int64") -> Iterator["Shard"]:
        """Each shard's rows [n, seq] and segments [m, 3] (row, start, hash), or None where the
        data records none. A shard that cannot be read raises ShardError naming it; `read_shard`
        reads one by number, so a caller can report it and go on (`pack stats` does)."""
        for i in range(len(self.shard_files())):
            yield self.read_shard(i, bytes_dtype)

    def read_shard(self, i: int, bytes_dtype: str = "int64", in_memory: bool = False) -> "Shard":
        """Shard i; .npy files are memory-mapped unless `in_memory` (one sequential read)."""
        path = self.shard_files()[i]
        if self.kind == "mds":
            return self._mds_shard(self.index["shards"][i], path, bytes_dtype)
        try:
            tokens = np.load(path, mmap_mode=None if in_memory else "r")
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

    def _mds_shard(self, entry: dict, path: Path, bytes_dtype: str) -> "Shard":
        try:
            data = path.read_bytes()
            if entry["zip_data"]:
                data = zstandard.ZstdDecompressor().decompress(data)
            n = int(np.frombuffer(data[:4], "<u4")[0])
            first_sample = int(np.frombuffer(data[4:8], "<u4")[0])
            config = json.loads(data[8 + 4 * n:first_sample])  # between offsets and samples
            differ = [k for k, v in config.items() if entry.get(k) != v]
            if differ:
                raise ShardError(path, f"its header disagrees with index.json on "
                                       f"{', '.join(sorted(differ))}")
            samples = list(decode_mds_shard(data, entry))
        except FileNotFoundError:
            raise ShardError(path, "missing") from None
        except ShardError:
            raise
        except Exception as e:  # zstd errors, truncated buffers, bad offsets
            raise ShardError(path, f"cannot be decoded ({type(e).__name__}: {e})") from None
        if len(samples) != entry["samples"]:
            raise ShardError(path, f"holds {len(samples)} rows, index.json says "
                                   f"{entry['samples']}")
        rows = []
        for sample in samples:
            tokens = sample.get("tokens")
            if isinstance(tokens, bytes):  # other tools' byte-encoded token column
                tokens = np.frombuffer(tokens, bytes_dtype)
            if tokens is None:
                raise ShardError(path, "has no 'tokens' column")
            rows.append(tokens)
        if len({len(r) for r in rows}) > 1:
            raise ShardError(path, "rows of different lengths: "
                                   f"{sorted({len(r) for r in rows})}")
        tokens = np.stack(rows) if rows else np.zeros((0, 0), np.uint16)
        segments = None
        if samples and "doc_starts" in samples[0]:
            segments = np.concatenate([
                np.stack([np.full(len(x["doc_starts"]), r, np.uint64),
                          x["doc_starts"].astype(np.uint64),
                          x.get("doc_hashes", np.zeros(len(x["doc_starts"]), np.uint64))], axis=1)
                for r, x in enumerate(samples)])
        return Shard(path, tokens, segments)

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
    def __init__(self, path: Path, what: str):
        super().__init__(f"{path}: {what}")
        self.path, self.what = Path(path), what


@dataclass
class Shard:
    path: Path
    tokens: np.ndarray  # [rows, seq]
    segments: np.ndarray | None  # [m, 3] uint64 (row within shard, start, hash), sorted


def open_split(path, eos_id: int | None = None) -> SplitReader:
    return SplitReader(Path(path), eos_id)
