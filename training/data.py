"""Rows of a built split by global index, for the sampler's order.

memmap shards are opened memory-mapped (a row is a slice); an MDS shard is decoded whole when a
row of it is first asked for and the last few are kept (SHARD_CACHE), which suits this in-process
path for tests and small runs. Reading MDS through mosaicml-streaming's loader (remote, bounded
cache, worker processes) is still to come (issue 5).
"""

import hashlib
import json
from collections import OrderedDict
from pathlib import Path

import numpy as np

from pipeline.shards import SplitReader

SHARD_CACHE = 4


def dataset_fingerprint(out: Path) -> str:
    """16 hex digits of the build's manifest fingerprint: what a checkpoint is tied to."""
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    text = json.dumps(manifest["fingerprint"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RowSource:
    def __init__(self, split_dir: Path):
        self.reader = SplitReader(Path(split_dir))
        counts = [self.reader.rows_in_shard(i) for i in range(len(self.reader.shard_files()))]
        self.bounds = np.concatenate([[0], np.cumsum(counts)])
        self._cache: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def _shard(self, k: int):
        if k not in self._cache:
            self._cache[k] = self.reader.read_shard(k)
            while len(self._cache) > SHARD_CACHE:
                self._cache.popitem(last=False)
        self._cache.move_to_end(k)
        return self._cache[k]

    def get(self, i: int):
        """(tokens [seq], starts, hashes) of global row i."""
        k = int(np.searchsorted(self.bounds, i, side="right") - 1)
        shard, r = self._shard(k), i - int(self.bounds[k])
        seg = shard.segments[shard.segments[:, 0] == r]
        return np.asarray(shard.tokens[r]), seg[:, 1].astype(np.int64), seg[:, 2]
