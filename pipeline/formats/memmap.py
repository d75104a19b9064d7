"""longpack's memmap format (`--format memmap`): plain .npy files that np.load(..., mmap_mode="r")
opens directly.

  shard.NNNNN.tokens.npy  [rows, seq] of the token dtype: the common pretokenized layout
  shard.NNNNN.docs.npy    [segments, 3] uint64: (row within the shard, start offset, doc hash),
                          sorted by row then start; every row has a segment at offset 0
and an index.json listing the shards (docs/FORMAT.md has its fields).
"""

import hashlib
import io
from pathlib import Path

import numpy as np

from longpack.core import SettingsError
from longpack.pipeline.formats.base import Shard, ShardError, ShardFormat, StoredFile, load_npy, mapped

INDEX_FORMAT = "longpack-memmap"
VERSION = 1


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _info(name: str, data: bytes) -> dict:
    return {"basename": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class MemmapFormat(ShardFormat):
    name = "memmap"
    entry_keys = ("rows", "tokens", "docs")

    @classmethod
    def check_settings(cls, seq: int, shard_bytes: int, compression: str | None) -> None:
        """Uncompressed files with no offsets; only doc_starts (uint32) bound --seq."""
        if compression is not None:
            raise SettingsError("memmap shards are uncompressed .npy files: drop --compression "
                                "(or use --format mds)")
        if seq > 1 << 32:
            raise SettingsError(f"--seq {seq:,} is too long: document starts are uint32, so the "
                                f"largest --seq is {1 << 32:,}")

    @classmethod
    def for_writing(cls, folder: Path, seq: int, dtype: np.dtype, compression: str | None,
                    size_limit: int) -> "MemmapFormat":
        """Uncompressed always (BuildConfig refuses --compression); shards have no size limit
        of their own."""
        fmt = cls(folder, None)
        fmt.seq, fmt.dtype = seq, np.dtype(dtype)
        return fmt

    @classmethod
    def claims(cls, index: dict) -> bool:
        return index.get("format") == INDEX_FORMAT

    def encode_shard(self, number, rows, segments):
        tokens_name, docs_name = f"shard.{number:05d}.tokens.npy", f"shard.{number:05d}.docs.npy"
        tokens = _npy(rows.astype(rows.dtype.newbyteorder("<"), copy=False))
        docs = _npy(segments.astype("<u8", copy=False).reshape(-1, 3))
        entry = {"rows": len(rows), "segments": len(segments),
                 "tokens": _info(tokens_name, tokens), "docs": _info(docs_name, docs)}
        return {tokens_name: tokens, docs_name: docs}, entry

    def index_json(self, entries):
        return {"format": INDEX_FORMAT, "version": VERSION, "seq": self.seq,
                "dtype": self.dtype.name, "rows": sum(e["rows"] for e in entries),
                "shards": entries}

    def rows_in(self, i):
        return self.entries[i]["rows"]

    def stored(self, i):
        entry = self.entries[i]
        return [StoredFile(entry[part]["basename"], entry[part]["bytes"],
                           entry[part].get("sha256")) for part in ("tokens", "docs")]

    def read_shard(self, i):
        """Shard i, its files memory-mapped."""
        return self._read(i, mapped)

    def _read(self, i, load):
        path = self.shard_file(i)
        tokens = load_npy(path, load, "[rows, seq]")
        docs_path = self.folder / self.stored(i)[1].basename
        segments = load_npy(docs_path, mapped, "[segments, 3]")
        if segments.shape[1] != 3:
            raise ShardError(docs_path, f"shape {segments.shape}, expected [segments, 3]")
        if tokens.shape[0] != self.rows_in(i):
            raise ShardError(path, f"holds {tokens.shape[0]} rows, index.json says "
                                   f"{self.rows_in(i)}")
        return Shard(path, tokens, segments)
