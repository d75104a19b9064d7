"""A folder of plain [N, seq] .npy files with no index.json (the common pretokenized layout), read
only: files in name order, no segments (readers derive document starts from EOS positions when
they know the EOS id), no document hashes, no recorded sizes or checksums to check.
"""

from pathlib import Path

import numpy as np

from longpack.pipeline.formats.base import Shard, ShardFormat, load_npy, mapped


class NpyFolder(ShardFormat):
    name = "npy"

    def __init__(self, folder: Path):
        super().__init__(folder, None)
        self.files = sorted(p for p in self.folder.glob("*.npy")
                            if not p.name.endswith(".docs.npy"))

    @staticmethod
    def holds(folder: Path) -> bool:
        return any(Path(folder).glob("*.npy"))

    def __len__(self):
        return len(self.files)

    def rows_in(self, i):
        return np.load(self.files[i], mmap_mode="r").shape[0]

    def stored(self, i):
        return []

    def shard_file(self, i):
        return self.files[i]

    def read_shard(self, i):
        """Shard i, memory-mapped."""
        return self._read(i, mapped)

    def _read(self, i, load):
        return Shard(self.files[i], load_npy(self.files[i], load, "[rows, seq]"), None)

