"""Where the trainer's rows come from: a build of `pack build` (OUT), local or remote.

    build = open_build("OUT" or "s3://bucket/OUT", cache=Path("run/shard-cache"), ...)
    tokens, starts, hashes = build.train.get(i)    # global row i

- memmap shards (local): memory-mapped `.npy` files; a row is a slice (pipeline/shards.py).
- MDS shards, local or at a URL mosaicml-streaming can read (s3://, gs://, ...): a
  `streaming.StreamingDataset` in random-access mode. A shard is fetched (a local build is
  copied) and decompressed into the cache when one of its rows is first asked for, and the
  coldest shards are evicted beyond `cache_limit`. The build directory is never written to.
  The cache lives under the build's fingerprint, so a cache left by other shards is never read.
- `seq` shorter than the build's rows: each row is cut into row_seq / seq windows; sample
  i is window i % k of row i // k. A document running into a window starts it (offset 0).

Rows come as (tokens [seq], starts, hashes): segment starts (first 0) and document hashes
(0 = padding), what training/batch.py turns into a model's batch.
"""

import bisect
import hashlib
import itertools
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import LongpackError
from pipeline.shards import SplitReader


class DataError(LongpackError):
    pass


def is_remote(location: str) -> bool:
    return "://" in location


def dataset_fingerprint(manifest: dict) -> str:
    """16 hex digits of the build's manifest fingerprint: what a checkpoint is tied to."""
    text = json.dumps(manifest["fingerprint"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_manifest(location: str, cache: Path) -> dict:
    """OUT/manifest.json, fetched into the cache first when OUT is remote."""
    if is_remote(location):
        from streaming.base.storage import CloudDownloader

        # Always the remote's current one, under a name of this process's own (under torchrun
        # every rank fetches it at once).
        local = cache / f"manifest.{os.getpid()}.json"
        try:
            CloudDownloader.direct_download(location.rstrip("/") + "/manifest.json", str(local))
            return json.loads(local.read_text())
        except Exception as e:  # the cloud clients raise many kinds
            raise DataError(f"cannot fetch {location}/manifest.json ({type(e).__name__}: {e}); "
                            "check the URL and credentials, or copy the build locally") from None
        finally:
            local.unlink(missing_ok=True)
    else:
        path = Path(location) / "manifest.json"
        if not path.is_file():
            raise DataError(f"{path} not found: --shards must be the --out of a finished pack "
                            "build")
    return json.loads(path.read_text())


class MemmapRows:
    """Rows of local memmap shards; the OPEN_SHARDS most recently used stay mapped (two file
    descriptors each), so a build of any number of shards stays under the open-file limit."""

    OPEN_SHARDS = 256

    def __init__(self, split_dir: Path):
        self.reader = SplitReader(split_dir)
        counts = [self.reader.rows_in_shard(k) for k in range(len(self.reader.shard_files()))]
        self.bounds = [0, *itertools.accumulate(counts)]
        self._open: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return self.bounds[-1]

    def _shard(self, k: int):
        if k in self._open:
            self._open.move_to_end(k)
            return self._open[k]
        shard = self.reader.read_shard(k)
        # Plain ndarray views of the maps: np.memmap's own indexing costs microseconds a row.
        tokens, segments = np.asarray(shard.tokens), np.asarray(shard.segments)
        # Segments of row r: rows first[r] .. first[r + 1] of docs.npy (sorted by row).
        first = np.searchsorted(segments[:, 0], np.arange(len(tokens) + 1))
        self._open[k] = (tokens, segments, first)
        while len(self._open) > self.OPEN_SHARDS:
            self._open.popitem(last=False)
        return tokens, segments, first

    def get(self, i: int):
        k = bisect.bisect_right(self.bounds, i) - 1
        (tokens, segments, first), r = self._shard(k), i - self.bounds[k]
        seg = segments[first[r]:first[r + 1]]
        return tokens[r], seg[:, 1].astype(np.int64), seg[:, 2]


class StreamingRows:
    def __init__(self, remote: str, local: Path, cache_limit: str):
        from pipeline.streaming_compat import import_streaming

        streaming = import_streaming()
        try:
            self.dataset = streaming.StreamingDataset(
                remote=remote, local=str(local), shuffle=False, batch_size=1,
                cache_limit=cache_limit, keep_zip=False)
        except (ValueError, FileNotFoundError) as e:
            raise DataError(f"mosaicml-streaming cannot open {remote} (cache {local}): {e}") \
                from None

    def __len__(self) -> int:
        # All rows of the split; len(StreamingDataset) is one rank's share of an epoch.
        return self.dataset.num_samples

    def get(self, i: int):
        sample = self.dataset.get_item(int(i))
        return (sample["tokens"], sample["doc_starts"].astype(np.int64),
                sample["doc_hashes"])


class Windows:
    """Samples of `seq` tokens cut from rows of `row_seq` (a multiple of seq)."""

    def __init__(self, rows, row_seq: int, seq: int):
        self.rows, self.k, self.seq = rows, row_seq // seq, seq

    def __len__(self) -> int:
        return len(self.rows) * self.k

    def get(self, i: int):
        tokens, starts, hashes = self.rows.get(i // self.k)
        a = (i % self.k) * self.seq
        first = int(np.searchsorted(starts, a, side="right")) - 1  # the segment running into a
        last = int(np.searchsorted(starts, a + self.seq, side="left"))
        return (tokens[a:a + self.seq], np.maximum(starts[first:last] - a, 0),
                hashes[first:last])


@dataclass
class Build:
    manifest: dict
    fingerprint: str
    seq: int
    train: object
    val: object | None  # None when the build made no val rows


def open_build(location: str, cache: Path, cache_limit: str, seq: int | None = None) -> Build:
    cache.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(location, cache)
    fingerprint = dataset_fingerprint(manifest)
    row_seq = manifest["seq"]
    seq = seq or row_seq
    if seq < 2 or row_seq % seq:
        raise DataError(f"--seq {seq}: the build's rows are {row_seq} tokens; use a divisor of "
                        f"it (at least 2), or rebuild with pack build --seq {seq}")
    splits = {}
    for split in ("train", "val"):
        path = manifest["splits"][split]["path"]
        if manifest["splits"][split]["rows"] == 0:
            if split == "train":
                raise DataError(f"{location}: the train split has no rows")
            splits[split] = None  # no evaluation
            continue
        if manifest["format"] == "mds":
            remote = location.rstrip("/") + "/" + path if is_remote(location) \
                else str(Path(location, path).resolve())
            rows = StreamingRows(remote, cache / fingerprint / split, cache_limit)
        elif is_remote(location):
            raise DataError(f"{location}: memmap builds are read from local disk; copy it "
                            "locally or build with --format mds to stream it")
        else:
            rows = MemmapRows(Path(location) / path)
        splits[split] = Windows(rows, row_seq, seq) if seq != row_seq else rows
    return Build(manifest, fingerprint, seq, splits["train"], splits["val"])
