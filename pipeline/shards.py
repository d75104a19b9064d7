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

    def rows(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        if self.kind == "mds":
            dctx = zstandard.ZstdDecompressor()
            for shard, path in zip(self.index["shards"], self.shard_files()):
                data = path.read_bytes()
                if shard["zip_data"]:
                    data = dctx.decompress(data)
                for sample in decode_mds_shard(data, shard):
                    tokens = sample["tokens"]
                    if isinstance(tokens, bytes):  # other tools' byte-encoded token column
                        tokens = np.frombuffer(tokens, np.uint16)
                    if "doc_starts" in sample:
                        yield tokens, sample["doc_starts"], sample.get("doc_hashes")
                    else:
                        yield tokens, starts_from_eos(tokens, self.eos_id), None
            return
        for path in self.shard_files():
            tokens = np.load(path, mmap_mode="r")
            if tokens.ndim != 2:
                raise LongpackError(f"{path}: shape {tokens.shape}, expected [rows, seq]")
            docs_path = path.with_name(path.name.replace(".tokens.npy", ".docs.npy"))
            if self.kind == "memmap" and docs_path.exists():
                docs = np.load(docs_path, mmap_mode="r")
                bounds = np.searchsorted(docs[:, 0], np.arange(len(tokens) + 1))
                for r in range(len(tokens)):
                    seg = docs[bounds[r]:bounds[r + 1]]
                    yield tokens[r], seg[:, 1].astype(np.uint32), seg[:, 2]
            else:
                for r in range(len(tokens)):
                    yield tokens[r], starts_from_eos(tokens[r], self.eos_id), None


def open_split(path, eos_id: int | None = None) -> SplitReader:
    return SplitReader(Path(path), eos_id)
