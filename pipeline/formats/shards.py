"""Read packed rows back: one reader for every shard format (__init__.py: MDS, memmap, and plain
[N, seq] .npy folders).

    reader = open_split("OUT/train")
    for tokens, starts, hashes in reader.rows(): ...

`starts` are the row's segment offsets (the first is 0); `hashes` the document hash of each
segment (0 = padding), or None when the data records none (plain .npy: starts then come from
EOS positions when `eos_id` is given, else [0]). How a shard's rows are read is its format's
(format_*.py); this reader walks a split's shards and cuts them into rows.
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from longpack.core import sha256_file
from longpack.pipeline.formats import open_format
from longpack.pipeline.formats.base import Shard, ShardBlocks, ShardError

__all__ = ["Shard", "ShardBlocks", "ShardError", "SplitReader", "open_split", "starts_from_eos"]


def starts_from_eos(tokens: np.ndarray, eos_id: int | None) -> np.ndarray:
    if eos_id is None:
        return np.zeros(1, np.uint32)
    after_eos = np.flatnonzero(tokens[:-1] == eos_id) + 1
    return np.concatenate([[0], after_eos]).astype(np.uint32)


class SplitReader:
    remote = False  # stats_remote.RemoteSplitReader: shards fetched from a store as they are read

    def __init__(self, path: Path, eos_id: int | None = None):
        self.path, self.eos_id = Path(path), eos_id
        self.format = open_format(self.path)
        self.index = self.format.index
        self._files: tuple[Path, ...] | None = None

    def stored_size(self, basename: str) -> int | None:
        """The size of a file of this split as stored, or None where it is missing."""
        path = self.path / basename
        return path.stat().st_size if path.exists() else None

    def stored_sha256(self, basename: str) -> str:
        return sha256_file(self.path / basename)

    def stored_bytes(self) -> int:
        """Every file of the split folder, index included: its size on disk."""
        return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())

    def shard_files(self) -> tuple[Path, ...]:
        """The file naming each shard, in order, listed once."""
        if self._files is None:
            self._files = tuple(self.format.shard_file(i) for i in range(len(self.format)))
        return self._files

    def rows_in_shard(self, i: int) -> int:
        return self.format.rows_in(i)

    def shards(self) -> Iterator[Shard]:
        """Each shard's rows [n, seq] and segments [m, 3] (row, start, hash), or None where the
        data records none. A shard that cannot be read raises ShardError naming it; `read_shard`
        reads one by number, so a caller can report it and go on (`pack stats` does)."""
        for i in range(len(self.format)):
            yield self.read_shard(i)

    def read_shard(self, i: int) -> Shard:
        """Shard i; .npy files are memory-mapped."""
        return self.format.read_shard(i)

    def read_blocks(self, i: int, block_bytes: int) -> ShardBlocks:
        """Shard i for one pass over its rows, about `block_bytes` of them at a time, each block
        used while it is still in the CPU's cache (ShardFormat.read_blocks)."""
        return self.format.read_blocks(i, block_bytes)

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


def open_split(path, eos_id: int | None = None) -> SplitReader:
    return SplitReader(Path(path), eos_id)
