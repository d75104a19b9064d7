"""The bytes of one MDS shard (mosaicml-streaming's format, version 2) from packed rows; its
index.json entry is mds.py's.

Written here rather than with streaming's MDSWriter so that every shard goes to disk under a
temporary name and is renamed whole, and so that a build can resume shard by shard (MDSWriter
writes index.json from `__exit__` even when the body raised, and cannot continue a dataset).
The layout is streaming's (streaming/base/format/mds/writer.py and encodings.py, v0.13):

  raw shard = u32 n | u32 offsets[n+1] | config JSON | sample 0 | ... | sample n-1
  offsets are absolute byte positions of each sample (offsets[n] = file length);
  config JSON = json.dumps(config, sort_keys=True), config as in `shard_config` below;
  sample = u32 size of each variable-size column, in column order | each column's bytes.

Columns, sorted by name as MDS stores them:
  doc_hashes  ndarray:uint64        document hash of each segment of the row (0 = padding)
  doc_starts  ndarray:uint32        offset where each segment starts (the first is 0)
  tokens      ndarray:<dtype>:<seq> the row, fixed size, what llm-foundry's text loader reads
A variable-shape ndarray is encoded as one byte (ndim << 2 | shape dtype code, code 0..3 =
uint8..uint64, the smallest that holds the length) | the length in that dtype | the values.
"""

import json

import numpy as np
import zstandard

SHAPE_CODES = ((1 << 8, 0, np.uint8), (1 << 16, 1, np.uint16), (1 << 32, 2, np.uint32))
MAX_SHARD_BYTES = (1 << 32) - 1  # offsets are u32 positions in the raw shard, offsets[n] its end


def column_spec(seq: int, dtype: np.dtype) -> tuple[list[str], list[str], list[int | None]]:
    names = ["doc_hashes", "doc_starts", "tokens"]
    encodings = ["ndarray:uint64", "ndarray:uint32", f"ndarray:{np.dtype(dtype).name}:{seq}"]
    sizes = [None, None, seq * np.dtype(dtype).itemsize]
    return names, encodings, sizes


def shard_config(seq: int, dtype: np.dtype, compression: str | None, size_limit: int) -> dict:
    names, encodings, sizes = column_spec(seq, dtype)
    return {"version": 2, "format": "mds", "compression": compression, "hashes": ["sha256"],
            "size_limit": size_limit, "column_names": names, "column_encodings": encodings,
            "column_sizes": sizes}


def max_sample_bytes(seq: int, itemsize: int) -> int:
    """The largest sample a row can make: at most one segment per token (starts are distinct
    offsets below seq), so each vector holds at most seq values."""
    width = next((np.dtype(d).itemsize for limit, _, d in SHAPE_CODES if seq < limit), 8)
    return 8 + (1 + width + 8 * seq) + (1 + width + 4 * seq) + seq * itemsize


def max_raw_shard_bytes(seq: int, itemsize: int, rows: int, config: dict) -> int:
    """The largest raw shard of `rows` rows; it must not pass MAX_SHARD_BYTES."""
    config_bytes = len(json.dumps(config, sort_keys=True).encode("utf-8"))
    return 4 + 4 * (rows + 1) + config_bytes + rows * max_sample_bytes(seq, itemsize)


def _vector(values: np.ndarray) -> bytes:
    n = len(values)  # always >= 1: every row has a segment at offset 0
    limit, code, shape_dtype = next(c for c in SHAPE_CODES if n < c[0])
    return bytes([(1 << 2) | code]) + np.array([n], shape_dtype).tobytes() + values.tobytes()


def encode_raw_shard(rows: np.ndarray, segments: np.ndarray, config: dict) -> bytes:
    """`segments` is [m, 3] uint64 (row within this shard, start, hash), sorted by row."""
    bounds = np.searchsorted(segments[:, 0], np.arange(len(rows) + 1))
    parts, sizes = [], []
    for r in range(len(rows)):
        seg = segments[bounds[r]:bounds[r + 1]]
        hashes = _vector(seg[:, 2].astype("<u8"))
        starts = _vector(seg[:, 1].astype("<u4"))
        parts += [np.array([len(hashes), len(starts)], "<u4").tobytes(), hashes, starts, rows[r]]
        sizes.append(8 + len(hashes) + len(starts) + rows[r].nbytes)
    config_bytes = json.dumps(config, sort_keys=True).encode("utf-8")
    head = 4 + 4 * (len(rows) + 1) + len(config_bytes)
    offsets = head + np.concatenate([[0], np.cumsum(sizes)])
    return b"".join([np.array([len(rows)], "<u4").tobytes(), offsets.astype("<u4").tobytes(),
                     config_bytes, *parts])


def compress(data: bytes, compression: str | None) -> bytes:
    if compression is None:
        return data
    level = int(compression.split(":")[1]) if ":" in compression else 3
    # threads=-1: one worker per core. zstd gives the same bytes for any worker count >= 1
    # (not for 0, its single-threaded mode), so shards stay identical across machines, and the
    # last shards of a build, compressed after the main loop, use every core.
    return zstandard.ZstdCompressor(level=level, threads=-1).compress(data)
