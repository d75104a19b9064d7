"""Rows of one split -> finished shards in OUT/<split>/, through write-ahead partial files.

Completed rows are appended to `<work>/<split>.NNNNN.rows` (and their segments to `.segs`) as
they are packed: disk writes are sequential and memory holds no shard. When a shard's worth of
rows is there, the shard is encoded from those files and renamed into OUT/<split>/ whole. The
checkpoint records how many rows and segments of the partial files are valid, so a resumed build
truncates them to that and carries on; a partial file is deleted only after a checkpoint that
no longer needs it. Each file is claimed (output_dir.Journal) before it is created in
OUT/<split>/, so a later build can prove it wrote it.
"""

import contextlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline import write_mds, write_memmap
from pipeline.atomic import write_bytes, write_json, writing
from pipeline.errors import SettingsError

SEGMENT_BYTES = 3 * 8


class ShardSink:
    def __init__(self, fmt: str, split_dir: Path, work_dir: Path, split: str, seq: int,
                 dtype: np.dtype, rows_per_shard: int, compression: str | None,
                 size_limit: int, claim: Callable[[Path], None], state: dict | None = None):
        self.fmt, self.split_dir, self.work_dir, self.split = fmt, split_dir, work_dir, split
        self.claim = claim
        self.seq, self.dtype, self.rows_per_shard = seq, np.dtype(dtype), rows_per_shard
        self.mds_config = write_mds.shard_config(seq, dtype, compression, size_limit)
        state = state or {"shards": [], "partial_rows": 0, "partial_segments": 0}
        self.entries: list[dict] = list(state["shards"])
        self.partial_rows, self.partial_segments = state["partial_rows"], state["partial_segments"]
        self.obsolete: list[Path] = []
        with writing(split_dir):
            split_dir.mkdir(parents=True, exist_ok=True)
        self._open_partial(truncate_to=(self.partial_rows, self.partial_segments))

    def _paths(self) -> tuple[Path, Path]:
        stem = f"{self.split}.{len(self.entries):05d}"
        return self.work_dir / f"{stem}.rows", self.work_dir / f"{stem}.segs"

    def _open_partial(self, truncate_to: tuple[int, int]):
        rows_path, segs_path = self._paths()
        sizes = (truncate_to[0] * self.seq * self.dtype.itemsize, truncate_to[1] * SEGMENT_BYTES)
        self._files = []
        for path, size in zip((rows_path, segs_path), sizes):
            if path.exists() and path.stat().st_size < size or not path.exists() and size:
                raise SettingsError(f"resume state does not match {path} (shorter than its "
                                    "checkpoint); re-run with --overwrite to rebuild")
            with writing(path):
                f = open(path, "ab")
                self._files.append(f)
                f.truncate(size)

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
        """After a failure: close the partial files, dropping what a full disk refuses (a
        resume cuts them back to the checkpoint anyway), so nothing is reported twice."""
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()

    def _finish_shard(self) -> None:
        self._close_partial()
        rows_path, segs_path = self._paths()
        rows = np.fromfile(rows_path, self.dtype).reshape(-1, self.seq)
        segs = np.fromfile(segs_path, "<u8").reshape(-1, 3)
        number = len(self.entries)
        if self.fmt == "mds":
            files, entry = write_mds.encode_shard(number, rows, segs, self.mds_config)
        else:
            files, entry = write_memmap.encode_shard(number, rows, segs)
        for name, data in files.items():
            self.claim(self.split_dir / name)
            write_bytes(self.split_dir / name, data, fsync=True)
        self.entries.append(entry)
        self.obsolete += [rows_path, segs_path]
        self.partial_rows = self.partial_segments = 0
        self._open_partial(truncate_to=(0, 0))

    def state(self) -> dict:
        """Flush, and return what a checkpoint must record to resume this sink."""
        for f in self._files:
            with writing(Path(f.name)):
                f.flush()
        return {"shards": self.entries, "partial_rows": self.partial_rows,
                "partial_segments": self.partial_segments}

    def delete_obsolete(self) -> None:
        for path in self.obsolete:
            path.unlink(missing_ok=True)
        self.obsolete = []

    def close(self) -> dict:
        """Finish the last shard and write index.json; returns the index."""
        if self.partial_rows:
            self._finish_shard()
        self._close_partial()
        # The partial files stay until the work directory goes (after manifest.json is written):
        # a build killed before then resumes from its last checkpoint, which refers to them.
        if self.fmt == "mds":
            index = write_mds.index_json(self.entries)
        else:
            index = write_memmap.index_json(self.entries, self.seq, self.dtype)
        self.claim(self.split_dir / "index.json")
        write_json(self.split_dir / "index.json", index, fsync=True)
        return index
