"""Rows of one split -> finished shards in OUT/<split>/, through write-ahead partial files.

Completed rows are appended to `<work>/<split>.NNNNN.rows` (and their segments to `.segs`) as
they are packed: disk writes are sequential and memory holds no shard. When a shard's worth of
rows is there, the shard is encoded from those files and renamed into OUT/<split>/ whole, in
the background: one writer thread (shared by the splits) reads the files back, encodes, hashes,
compresses and writes the shard while the main thread packs on (zstd, sha256 and file writes
release the GIL). The checkpoint waits for the shards in flight, then records how many rows and
segments of the partial files are valid, so a resumed build truncates them to that and carries
on; a partial file is deleted only after a checkpoint that no longer needs it. Each file is
claimed (output_dir.Journal) before it is created in OUT/<split>/, so a later build can prove
it wrote it.
"""

import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np

from longpack.core import open_write_ahead, write_bytes, write_json, writing
from longpack.pipeline.formats import get_format

SEGMENT_BYTES = 3 * 8
MAX_IN_FLIGHT = 2  # shards a sink hands to the writer before it waits: bounds the backlog


def shard_writer() -> ThreadPoolExecutor:
    """The thread that finishes shards, one for all sinks of a build (shards then reach the disk
    in the order they filled)."""
    return ThreadPoolExecutor(1, thread_name_prefix="write")


class ShardSink:
    def __init__(self, fmt: str, split_dir: Path, work_dir: Path, split: str, seq: int,
                 dtype: np.dtype, rows_per_shard: int, compression: str | None,
                 size_limit: int, claim: Callable[[Path], None], writer: ThreadPoolExecutor,
                 state: dict | None = None, publish: Callable[[Path], None] | None = None):
        """`publish`: called (in the writer thread) with each shard file once it is written."""
        self.split_dir, self.work_dir, self.split = split_dir, work_dir, split
        self.claim, self.writer, self.publish = claim, writer, publish
        self.in_flight: deque[Future] = deque()  # shards handed to the writer, oldest first
        self.seq, self.dtype, self.rows_per_shard = seq, np.dtype(dtype), rows_per_shard
        self.format = get_format(fmt).for_writing(split_dir, seq, dtype, compression, size_limit)
        state = state or {"shards": [], "partial_rows": 0, "partial_segments": 0}
        self.entries: list[dict] = list(state["shards"])
        self.partial_rows, self.partial_segments = state["partial_rows"], state["partial_segments"]
        self._obsolete: list[Path] = []
        with writing(split_dir):
            split_dir.mkdir(parents=True, exist_ok=True)
        self._open_partial(truncate_to=(self.partial_rows, self.partial_segments))

    def _partial_paths(self, number: int) -> tuple[Path, Path]:
        stem = f"{self.split}.{number:05d}"
        return self.work_dir / f"{stem}.rows", self.work_dir / f"{stem}.segs"

    def _paths(self) -> tuple[Path, Path]:
        """The partial files of the shard being filled."""
        return self._partial_paths(len(self.entries) + len(self.in_flight))

    def _open_partial(self, truncate_to: tuple[int, int]):
        rows_path, segs_path = self._paths()
        sizes = (truncate_to[0] * self.seq * self.dtype.itemsize, truncate_to[1] * SEGMENT_BYTES)
        self._files = [open_write_ahead(path, size)
                       for path, size in zip((rows_path, segs_path), sizes)]

    def append(self, rows: np.ndarray, segments: np.ndarray) -> None:
        """`segments` rows index into `rows` and are sorted."""
        bounds = np.searchsorted(segments[:, 0], np.arange(len(rows) + 1))
        i = 0
        while i < len(rows):
            take = min(self.rows_per_shard - self.partial_rows, len(rows) - i)
            seg = segments[bounds[i]:bounds[i + take]].copy()
            seg[:, 0] = seg[:, 0] - np.uint64(i) + np.uint64(self.partial_rows)
            for f, data in ((self._files[0], rows[i:i + take]), (self._files[1], seg.astype("<u8"))):
                with writing(Path(f.name)):
                    f.write(data.tobytes())
            self.partial_rows += take
            self.partial_segments += len(seg)
            i += take
            if self.partial_rows == self.rows_per_shard:
                self._finish_shard()

    def _close_partial(self) -> None:
        for f in self._files:
            with writing(Path(f.name)):
                f.close()

    def abandon(self) -> None:
        """After a failure: let the shards in flight end (their errors are this failure's
        consequences or already reported), close the partial files, dropping what a full disk
        refuses (a resume cuts them back to the checkpoint anyway), so nothing is reported twice."""
        wait(self.in_flight)
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()

    def _finish_shard(self) -> None:
        """Hand the full partial files to the writer and start the next shard's."""
        self._close_partial()
        if len(self.in_flight) >= MAX_IN_FLIGHT:
            self._collect(self.in_flight[0])
        number = len(self.entries) + len(self.in_flight)
        self.in_flight.append(self.writer.submit(self._write_shard, number,
                                                 *self._partial_paths(number)))
        self.partial_rows = self.partial_segments = 0
        self._open_partial(truncate_to=(0, 0))

    def _write_shard(self, number: int, rows_path: Path, segs_path: Path) -> dict:
        """In the writer thread: the shard from its partial files, into OUT/<split>/."""
        rows = np.fromfile(rows_path, self.dtype).reshape(-1, self.seq)
        segs = np.fromfile(segs_path, "<u8").reshape(-1, 3)
        files, entry = self.format.encode_shard(number, rows, segs)
        for name, data in files.items():
            self.claim(self.split_dir / name)
            write_bytes(self.split_dir / name, data, fsync=True)
        if self.publish is not None:
            for name in files:
                self.publish(self.split_dir / name)
        return entry

    def _collect(self, until: Future | None = None) -> None:
        """Record the shards the writer has finished, in order, waiting for those up to
        `until` (all in flight: `until=self.in_flight[-1]`); re-raises a shard's error."""
        while self.in_flight and (self.in_flight[0].done() or until is not None):
            future = self.in_flight.popleft()
            self.entries.append(future.result())
            self._obsolete += list(self._partial_paths(len(self.entries) - 1))
            if future is until:
                break

    @property
    def obsolete(self) -> list[Path]:
        """Partial files of finished shards: a checkpoint now lets them go."""
        self._collect()
        return self._obsolete

    def state(self) -> dict:
        """Wait for the shards in flight, flush, and return what a checkpoint must record to
        resume this sink."""
        if self.in_flight:
            self._collect(self.in_flight[-1])
        for f in self._files:
            with writing(Path(f.name)):
                f.flush()
        return {"shards": self.entries, "partial_rows": self.partial_rows,
                "partial_segments": self.partial_segments}

    def delete_obsolete(self) -> None:
        for path in self.obsolete:
            path.unlink(missing_ok=True)
        self._obsolete = []

    def close(self) -> dict:
        """Finish the last shard and write index.json; returns the index."""
        if self.partial_rows:
            self._finish_shard()
        if self.in_flight:
            self._collect(self.in_flight[-1])
        self._close_partial()
        # The partial files stay until the work directory goes (after manifest.json is written):
        # a build killed before then resumes from its last checkpoint, which refers to them.
        index = self.format.index_json(self.entries)
        self.claim(self.split_dir / "index.json")
        write_json(self.split_dir / "index.json", index, fsync=True)
        return index
