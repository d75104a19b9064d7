"""The shard cache of a build read back: the local files of shards not read where they lie
(fetched from a URL, or unpacked), at most `limit` bytes, one folder per split under the
build's fingerprint.

Files go in under a temporary name and are renamed; sizes are read from the folder itself, so
what another process or an earlier run left counts too. To make room the least recently used
shards leave, never one in use by a process of the run (fetched, unpacked, checked, opened) nor
the one going in. The table of last use, users and generation is anonymous shared memory made
before the loader forks, like builds/verify.py's verdicts; a process compares a shard's
generation before using its maps and drops maps of removed files, giving their disk back.
"""

import contextlib
import mmap
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np


class ShardCache:
    def __init__(self, folder: Path, files: list[list[str]], limit: int):
        """`files[k]`: the names of shard k's files in `folder`; `limit` in bytes."""
        self.folder, self.files, self.limit = Path(folder), files, limit
        count = len(files)
        self._memory = mmap.mmap(-1, max(1, 16 * count))
        self.used = np.ndarray(count, np.int64, buffer=self._memory)
        self.users = np.ndarray(count, np.int32, buffer=self._memory, offset=8 * count)
        self.generation = np.ndarray(count, np.int32, buffer=self._memory, offset=12 * count)
        self._lock = multiprocessing.get_context("fork").Lock()
        self._shard_of = {name: k for k, names in enumerate(files) for name in names}

    @contextlib.contextmanager
    def using(self, k: int):
        """Shard k is in use inside: its files stay."""
        with self._lock:
            self.users[k] += 1
        self.touch(k)
        try:
            yield
        finally:
            with self._lock:
                self.users[k] -= 1

    def touch(self, k: int) -> None:
        self.used[k] = time.monotonic_ns()

    def holds(self, k: int, sizes: list[int]) -> bool:
        """Whether shard k's files are in the folder, each of its size in `sizes`."""
        for name, size in zip(self.files[k], sizes):
            try:
                if (self.folder / name).stat().st_size != size:
                    return False
            except FileNotFoundError:
                return False
        return True

    def make_room(self, k: int, need: int) -> None:
        """Remove the least recently used shards' files (not shard k's, none in use) until
        `need` more bytes fit under the limit, or nothing more can go."""
        with self._lock:
            try:
                entries = list(os.scandir(self.folder))
            except FileNotFoundError:
                return
            total, present = 0, {}  # every file's bytes; shard -> its files' bytes
            for entry in entries:
                try:
                    size = entry.stat().st_size
                except FileNotFoundError:  # removed by another process just now
                    continue
                total += size
                j = self._shard_of.get(entry.name)
                if j is not None:
                    present[j] = present.get(j, 0) + size
            for j in sorted(present, key=lambda j: self.used[j]):
                if total + need <= self.limit:
                    break
                if j != k and not self.users[j]:
                    self._remove(j)
                    total -= present[j]

    def remove(self, k: int) -> None:
        """Shard k's files leave the cache (maps of them stay readable)."""
        with self._lock:
            self._remove(k)

    def _remove(self, k: int) -> None:
        for name in self.files[k]:
            (self.folder / name).unlink(missing_ok=True)
        self.generation[k] += 1
