"""`pack stats s3://BUCKET/BUILD`: the same report as for a local build, read from the store.

    with RemoteView("s3://bucket/build", verify=True) as remote:
        report = stats_report._collect(remote.local, ..., open_reader=remote.reader)

The manifest, the build's copy of its tokenizer and each split's index.json are fetched into a
temporary folder laid out as the build is (so everything that reads a local build's layout reads
it unchanged), and the store is listed once for the objects' sizes: a shard missing from the
store or of another size than its index says is a problem, as a local one is. Each shard is
fetched into that folder when the scan reads it (a few at a time, as the scan's threads read
local shards ahead) and removed as soon as it is read: nothing of the shards is kept. With
--verify each fetched file's sha256 is checked against its index entry (a local build's are
checked before the scan; here the one fetch serves both). A prefix holding an unfinished build
(store/remote_build.py's marker, no manifest) is one line, as a local unfinished build is.
"""

import json
import shutil
import tempfile
from pathlib import Path

from longpack.core import LongpackError, Store, redact
from longpack.pipeline.config import SPLITS, WORK_DIR
from longpack.pipeline.formats.shards import ShardError, SplitReader
from longpack.pipeline.store.output_dir import FINGERPRINT
from longpack.pipeline.store.uploader import digests
from longpack.pipeline.tokenize.kept import COPY_NAMES


class RemoteView:
    def __init__(self, url: str, verify: bool):
        self.url, self.verify = redact(url.rstrip("/")), verify
        self.store = Store(url)
        self.local: Path | None = None

    def __enter__(self) -> "RemoteView":
        self.sizes = self.store.sizes()
        if not self.sizes:
            raise LongpackError(f"{self.url}: nothing there (no manifest.json, no shards)")
        if "manifest.json" not in self.sizes and f"{WORK_DIR}/{FINGERPRINT}" in self.sizes:
            raise LongpackError(f"{self.url}: an unfinished build (no manifest.json yet); re-run "
                                "the same pack build command to finish it")
        self.local = Path(tempfile.mkdtemp(prefix="longpack-stats."))
        try:
            # and the build's copy of its tokenizer, checked and read as a local build's
            for rel in ["manifest.json", "skipped.jsonl", *COPY_NAMES.values()] + [
                    f"{s}/index.json" for s in SPLITS]:
                if rel in self.sizes:
                    (self.local / rel).parent.mkdir(parents=True, exist_ok=True)
                    self.store.get_file(rel, self.local / rel)
            self._splits_the_manifest_lists()
        except BaseException:
            shutil.rmtree(self.local, ignore_errors=True)
            raise
        return self

    def _splits_the_manifest_lists(self) -> None:
        """A split folder for each split the manifest lists that holds objects (a split lost
        from the store has none: the report then says it is missing, as for a local one)."""
        try:
            manifest = json.loads((self.local / "manifest.json").read_text())
            listed = [s.get("path", name) for name, s in manifest["splits"].items()]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return  # stats_files reads it again and says what is wrong
        for folder in listed:
            if any(rel.startswith(folder + "/") for rel in self.sizes):
                (self.local / folder).mkdir(parents=True, exist_ok=True)

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.local, ignore_errors=True)

    def reader(self, path: Path, eos_id: int | None = None) -> "RemoteSplitReader":
        return RemoteSplitReader(path, eos_id, self, path.relative_to(self.local).as_posix())


class RemoteSplitReader(SplitReader):
    """A split whose shards are in the store: each fetched into the split's temporary folder
    when read, and removed once read (the formats read a shard's files whole, so nothing is
    read from them after)."""

    remote = True

    def __init__(self, path: Path, eos_id, view: RemoteView, split: str):
        super().__init__(path, eos_id)
        self.view, self.split = view, split

    def stored_size(self, basename: str) -> int | None:
        return self.view.sizes.get(f"{self.split}/{basename}")

    def stored_sha256(self, basename: str) -> str:
        raise NotImplementedError("checked as each shard is fetched")

    def stored_bytes(self) -> int:
        return sum(size for rel, size in self.view.sizes.items()
                   if rel.startswith(self.split + "/"))

    def read_blocks(self, i: int, block_bytes: int):
        fetched = self._fetch(i)
        try:
            return super().read_blocks(i, block_bytes)
        finally:
            for path in fetched:
                path.unlink(missing_ok=True)

    def read_shard(self, i: int):
        fetched = self._fetch(i)
        try:
            return super().read_shard(i)
        finally:
            for path in fetched:
                path.unlink(missing_ok=True)

    def _fetch(self, i: int) -> list[Path]:
        """Shard i's files into the split's folder; with --verify, each checked against the
        sha256 its index records (ShardError naming the object otherwise)."""
        fetched = []
        try:
            for info in self.format.stored(i):
                rel, path = f"{self.split}/{info.basename}", self.path / info.basename
                if rel not in self.view.sizes:
                    continue  # reported missing (file_checks); reading it says so again
                self.view.store.get_file(rel, path)
                fetched.append(path)
                if self.view.verify and info.sha256 and digests(path)[0] != info.sha256:
                    raise ShardError(path, "checksum mismatch (sha256): the object differs from "
                                           "what the build wrote (damaged or replaced in the "
                                           "store)")
        except BaseException:
            for path in fetched:
                path.unlink(missing_ok=True)
            raise
        return fetched
