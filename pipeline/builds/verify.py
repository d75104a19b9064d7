"""Every shard is checked before any of its rows is trained on, once per run (docs/TRAIN.md,
"Rows and their order"): a zstd frame carries no checksum and a .npy file none at all, so a
flipped byte or ids rewritten by another tool would otherwise train silently.

A check: the files its rows are read from (its format's `unpacked` files, local, fetched or left
in the cache) against the sha256 its split's index.json records, and its ids against the
build's vocabulary. A failure is a DataError naming the shard (and the row, for an id).

Once per run: the verdicts are anonymous shared memory made before the loader forks, so the
trainer and all its workers share one table. The first process that needs a shard claims and
checks it; the others wait for its verdict (a claim whose process is gone is taken over).
"""

import mmap
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from longpack.core import DataError, LongpackError, sha256_file

UNCHECKED, CHECKING, GOOD, BAD = 0, 1, 2, 3
MESSAGE_BYTES = 512  # per shard; a page is touched only when its shard's check fails
WAIT_SECONDS = 0.001  # between looks at a shard another process is checking


class ShardChecks:
    """The verdict on each of `count` shards, shared by the processes forked after it is made.
    Memory: a state byte and the claiming process's id per shard, then a message per shard.
    It holds no reference to the rows it checks: a cycle would keep their maps alive until a
    garbage collection, which may then run in a forked worker."""

    def __init__(self, count: int):
        self.count = count
        # Anonymous and shared: a forked worker writes the very bytes the others read.
        self._memory = mmap.mmap(-1, max(1, count * (1 + 4 + MESSAGE_BYTES)))
        # state[k] == GOOD is the rows' fast path (an int read, cheaper than numpy's)
        self.state = self._state = memoryview(self._memory)[:count]
        self._owner = np.ndarray(count, np.int32, buffer=self._memory, offset=count)
        self._messages = 5 * count
        self._lock = multiprocessing.get_context("fork").Lock()

    def ensure(self, k: int, check: Callable[[int], None]) -> None:
        """Return once shard k is known good; raise its DataError if it is bad. `check(k)`
        checks it (raising DataError) when no process has."""
        waited = 0
        while (state := self._state[k]) != GOOD:
            if state == BAD:
                raise DataError(self._message(k))
            if state == CHECKING:
                waited += 1
                if waited % 100 == 0:
                    self._release_if_dead(k)
                time.sleep(WAIT_SECONDS)
                continue
            with self._lock:
                mine = self._state[k] == UNCHECKED
                if mine:
                    self._state[k], self._owner[k] = CHECKING, os.getpid()
            if mine:
                self._run(k, check)

    def unchecked(self) -> int:
        """How many shards are not yet known good."""
        return self.count - self._memory[:self.count].count(GOOD)

    def _run(self, k: int, check: Callable[[int], None]) -> None:
        try:
            check(k)
        except BaseException as e:  # never leave a claim behind: the others would wait forever
            text = str(e) if isinstance(e, LongpackError) else f"{type(e).__name__}: {e}"
            at = self._messages + k * MESSAGE_BYTES
            data = text.encode()[:MESSAGE_BYTES - 1]
            self._memory[at:at + len(data)] = data
            self._state[k] = BAD  # after the message: whoever sees BAD can read it
            raise
        self._state[k] = GOOD

    def _release_if_dead(self, k: int) -> None:
        """A worker stopped (or killed) while it checked shard k leaves its claim: free it."""
        owner = int(self._owner[k])
        if not _running(owner):
            with self._lock:
                if self._state[k] == CHECKING and self._owner[k] == owner:
                    self._state[k] = UNCHECKED

    def _message(self, k: int) -> str:
        at = self._messages + k * MESSAGE_BYTES
        return self._memory[at:at + MESSAGE_BYTES].split(b"\0", 1)[0].decode(errors="replace")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # field 3 of /proc/PID/stat is the state; Z: exited, not yet reaped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:  # no /proc: os.kill's answer stands
        return True


def size_problem(path: Path, size: int) -> str | None:
    """What is wrong with a shard file given its size in index.json (missing, another size), or
    None: a stat, what can be known before reading it."""
    try:
        got = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    return None if got == size else f"{got:,} bytes, index.json says {size:,} (truncated or replaced)"


def file_problem(path: Path, size: int, sha256: str | None) -> str | None:
    """What is wrong with a shard file given its size and sha256 in index.json, or None."""
    if sha256 is None:
        return "index.json records no sha256 for it, so it cannot be checked; rebuild it"
    problem = size_problem(path, size)
    if problem:
        return problem
    if sha256_file(path) != sha256:
        return ("its bytes differ from the sha256 in index.json (damaged: flipped bits, or "
                "rewritten by another tool)")
    return None


def check_ids(name, blocks: Iterator[tuple[int, np.ndarray]], vocab_size: int) -> None:
    """Raise DataError naming the first row of `blocks` ((first row, rows) in order) that holds
    an id beyond the vocabulary."""
    for first, rows in blocks:
        if not len(rows):
            continue
        row_max = rows.max(axis=1)
        bad = np.flatnonzero(row_max >= vocab_size)
        if len(bad):
            r = int(bad[0])
            raise DataError(f"{name}: row {first + r} holds token id {int(row_max[r]):,}, beyond "
                            f"the vocabulary ({vocab_size:,} ids, the build's "
                            "tokenizer.vocab_size, which the model takes); this shard was not "
                            "made with the build's tokenizer: rebuild it with pack build")
