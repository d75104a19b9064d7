"""The global order of training rows: a pure function of (seed, epoch, dataset fingerprint).

Global step s takes rows [s * G, (s + 1) * G) of the concatenation of epoch permutations
(G = global batch size in rows): every row appears once per epoch before any repeats, each epoch
is shuffled anew, and a step's rows do not depend on the number of processes. Rank r of W takes
the r-th contiguous slice of the step's rows, so any (W, per-device batch) with the same G
continues the same order. Positioning at step 1,000,000 computes an offset, reads nothing and
skips nothing: O(1) apart from building that epoch's permutation once (a few ms per million
rows; numpy's PCG64 seeded from (seed, epoch, fingerprint) so every machine agrees).

Each step's rows hash to a short id (`batch_hash`) that the trainer logs and keeps in its
checkpoints, so a resumed run can prove it reproduces the steps it replaces.
"""

import hashlib

import numpy as np


def _epoch_seed(seed: int, epoch: int, fingerprint: str) -> int:
    digest = hashlib.sha256(f"{seed}:{epoch}:{fingerprint}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def epoch_permutation(num_rows: int, seed: int, epoch: int, fingerprint: str) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(_epoch_seed(seed, epoch, fingerprint)))
    return rng.permutation(num_rows)


class GlobalOrder:
    def __init__(self, num_rows: int, global_batch: int, seed: int, fingerprint: str):
        if num_rows < 1 or global_batch < 1:
            raise ValueError("need at least one row and a positive global batch")
        self.num_rows, self.global_batch = num_rows, global_batch
        self.seed, self.fingerprint = seed, fingerprint
        self._epochs: dict[int, np.ndarray] = {}  # the permutations in use: two at most

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            if len(self._epochs) >= 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = epoch_permutation(self.num_rows, self.seed, epoch,
                                                    self.fingerprint)
        return self._epochs[epoch]

    def rows(self, start: int, count: int) -> np.ndarray:
        """Global row ids at positions [start, start + count) of the endless epoch sequence."""
        out = np.empty(count, np.int64)
        done = 0
        while done < count:
            epoch, offset = divmod(start + done, self.num_rows)
            take = min(count - done, self.num_rows - offset)
            perm = self.permutation(epoch)
            out[done:done + take] = perm[offset:offset + take]
            done += take
        return out

    def step_rows(self, step: int) -> np.ndarray:
        return self.rows(step * self.global_batch, self.global_batch)

    def rank_rows(self, step: int, rank: int, world: int) -> np.ndarray:
        if self.global_batch % world:
            raise ValueError(f"global batch {self.global_batch} does not split over {world} ranks")
        per = self.global_batch // world
        return self.step_rows(step)[rank * per:(rank + 1) * per]


def batch_hash(rows: np.ndarray) -> str:
    """A short, stable id of a step's global rows (12 hex digits of sha256)."""
    return hashlib.sha256(np.ascontiguousarray(rows, dtype="<i8").tobytes()).hexdigest()[:12]
