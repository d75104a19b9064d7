"""Encode one memmap shard: plain .npy files that np.load(..., mmap_mode="r") opens directly.

  shard.NNNNN.tokens.npy  [rows, seq] of the token dtype: the common pretokenized layout
  shard.NNNNN.docs.npy    [segments, 3] uint64: (row within the shard, start offset, doc hash),
                          sorted by row then start; every row has a segment at offset 0
and an index.json listing the shards (docs/FORMAT.md has its fields).
"""

import hashlib
import io

import numpy as np

FORMAT = "longpack-memmap"
VERSION = 1


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _info(name: str, data: bytes) -> dict:
    return {"basename": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def encode_shard(number: int, rows: np.ndarray, segments: np.ndarray
                 ) -> tuple[dict[str, bytes], dict]:
    tokens_name, docs_name = f"shard.{number:05d}.tokens.npy", f"shard.{number:05d}.docs.npy"
    tokens = _npy(rows.astype(rows.dtype.newbyteorder("<"), copy=False))
    docs = _npy(segments.astype("<u8", copy=False).reshape(-1, 3))
    entry = {"rows": len(rows), "segments": len(segments),
             "tokens": _info(tokens_name, tokens), "docs": _info(docs_name, docs)}
    return {tokens_name: tokens, docs_name: docs}, entry


def index_json(entries: list[dict], seq: int, dtype: np.dtype) -> dict:
    return {"format": FORMAT, "version": VERSION, "seq": seq, "dtype": np.dtype(dtype).name,
            "rows": sum(e["rows"] for e in entries), "shards": entries}
