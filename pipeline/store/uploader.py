"""Finished files of a staged build go up to the store in the background, then leave the disk.

    uploader = Uploader(store, staged_out, ledger=Path("STAGING/uploaded.jsonl"))
    uploader.put(Path(".../train/shard.00003.mds.zstd"))   # from the shard writer thread
    uploader.ensure(Path(".../train/index.json"))           # here and now (the end's files)
    uploader.close()

One thread uploads, in the order files were put. `put` blocks while MAX_STAGED files wait, so
the staging disk holds at most that many finished shards (plus the build's partial files): the
writer waits, the packer behind it waits, and a slow store slows the build instead of filling
the disk. A file is removed from the staging disk only once its upload has succeeded.

The ledger (JSON lines: path, size, sha256, md5; appended and fsynced before each upload
starts) is how a re-run after kill -9 knows what is already up: a resumed build writes its
shards again, the same bytes, and a file whose sha256 the ledger holds is not sent again when
its object has that size and, where the store's ETag is the plain MD5 of the object (S3 for a
single-part upload), that MD5. The entry is written first because a kill can come between the
end of an upload and any record of it; an object is never visible before its upload completes
(S3 and GCS writes are atomic), and the only objects under a build's prefix are that build's
own, written from the same bytes (remote_build.py removes any other build's first). Without a
ledger (a fresh machine) everything is sent again: nothing is trusted unchecked.
An upload's error is raised by the next put/drain/close, in the writer or the main thread.
"""

import hashlib
import json
import os
import queue
import threading
from pathlib import Path

from longpack.core import StorageError, Store, redact, writing

MAX_STAGED = 4
_CHUNK = 1 << 22


def digests(path: Path) -> tuple[str, str, int]:
    """sha256, md5 and size of a file, in one read."""
    sha, md5, size = hashlib.sha256(), hashlib.md5(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), md5.hexdigest(), size


class Uploader:
    def __init__(self, store: Store, root: Path, ledger: Path):
        self.store, self.root, self.ledger_path = store, root, ledger
        self.uploaded = _read_ledger(ledger)  # relative path -> (sha256, md5, size)
        self.sent = self.skipped = 0  # files uploaded / found already up (for the summary)
        self._ledger_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(MAX_STAGED)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="upload", daemon=True)
        self._thread.start()

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # -- the background thread ---------------------------------------------------------------
    def put(self, path: Path, rel: str | None = None) -> None:
        """Upload `path` (a finished file; to `rel`, default its path under root) in the
        background, then remove it."""
        self._raise()
        while True:  # blocks while the staging is full, but still sees the thread's failure
            try:
                self._queue.put((path, rel), timeout=0.2)
                return
            except queue.Full:
                self._raise()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if self._error is None:
                    self.ensure(*item)
                    item[0].unlink()
            except BaseException as e:  # raised in the build's threads by _raise
                self._error = e
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def drain(self) -> None:
        """Wait until every file put so far is up (or raise the first failure)."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        """Stop the thread (after what was put); raises an upload's failure."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._raise()

    # -- one file, here and now --------------------------------------------------------------
    def is_up(self, rel: str, sha256: str | None = None) -> bool:
        """The ledger holds `rel` (with this sha256, when given) and the store has its object
        with the ledger's size (and MD5, where the ETag is one)."""
        known = self.uploaded.get(rel)
        if known is None or sha256 is not None and known[0] != sha256:
            return False
        return _matches(self.store.info(rel), *known[1:])

    def ensure(self, path: Path, rel: str | None = None) -> None:
        """`path` up in the store (at `rel`, default its path under root), checked: sent
        unless the ledger and the store show these very bytes are there already."""
        rel = rel or self.rel(path)
        sha256, md5, size = digests(path)
        if self.is_up(rel, sha256):
            self.skipped += 1
            return
        self._record(rel, sha256, md5, size)
        self.store.put_file(path, rel)
        if not _matches(self.store.info(rel), md5, size):
            raise StorageError(f"{redact(self.store.url_of(rel))}: the store holds other bytes "
                               f"than {path} after its upload; re-run the same command")
        self.sent += 1

    def _record(self, rel: str, sha256: str, md5: str, size: int) -> None:
        with self._ledger_lock:
            self.uploaded[rel] = (sha256, md5, size)
            with writing(self.ledger_path), open(self.ledger_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"path": rel, "sha256": sha256, "md5": md5, "size": size})
                        + "\n")
                f.flush()
                os.fsync(f.fileno())


def _matches(info: dict | None, md5: str, size: int) -> bool:
    if info is None or int(info.get("size") or 0) != size:
        return False
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    plain_md5 = len(etag) == 32 and all(c in "0123456789abcdef" for c in etag)
    return not plain_md5 or etag == md5


def _read_ledger(path: Path) -> dict[str, tuple[str, int]]:
    """The ledger's entries; a line cut by a kill (the last) is ignored: that upload is
    checked again."""
    out = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                out[entry["path"]] = (entry["sha256"], entry["md5"], int(entry["size"]))
            except (ValueError, KeyError, TypeError):
                continue
    return out
