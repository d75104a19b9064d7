"""`pack build --out s3://bucket/prefix` (any store longpack/core/store.py writes): the build runs
in a local staging folder and its files go up as they finish.

    STAGING/<16 hex of the URL>/out/            the build, exactly as a local --out
    STAGING/<16 hex of the URL>/uploaded.jsonl  what is already up (uploader.py)

Order in the store, so that a reader never takes a partial dataset for a complete one:
  1. URL/.longpack-build/fingerprint.json   first: the prefix holds an unfinished build
  2. shards, as the shard writer finishes them, in the background (uploader.py; each leaves the
     staging disk once up, so it holds a few shards whatever the build's size)
  3. each split's index.json, then skipped.jsonl and the tokenizer's copy, then manifest.json last
  4. the marker goes, then the staging folder.
A re-run (after Ctrl+C, kill -9, a lost connection) resumes the staged build from its
checkpoint; the shards it writes again are checked against the ledger and the store, not sent
again. The bytes in the store are those of a local build of the same command.

What the build may remove or replace in the store follows output_dir.py's rules: only its own
layout (manifest.json, skipped.jsonl, tokenizer.tiktoken or tokenizer.json, SPLIT/index.json,
SPLIT/shard.*, .longpack-build/*) under
a prefix that holds a longpack build (a manifest or the marker); anything else there is
foreign, and the build refuses to start, --overwrite or not. Two machines building into one
URL at once are not kept apart (stores have no locks): one URL, one writer.
"""

import contextlib
import dataclasses
import json
import re
import shutil
from pathlib import Path

from longpack.core import SettingsError, StorageError, Store, redact
from longpack.pipeline.build_state import BuildState
from longpack.pipeline.config import SPLITS, WORK_DIR, BuildConfig
from longpack.pipeline.formats import open_format
from longpack.pipeline.pack.output import ShardOutput
from longpack.pipeline.store.lock import OutputLock
from longpack.pipeline.store.output_dir import FINGERPRINT, differences
from longpack.pipeline.store.uploader import Uploader

MARKER = f"{WORK_DIR}/{FINGERPRINT}"
_SPLIT = "|".join(SPLITS)
_OWN = re.compile(rf"manifest\.json|skipped\.jsonl|tokenizer\.(tiktoken|json)"
                  rf"|({_SPLIT})/(index\.json|shard\.\d{{5,}}\.[a-z.]+)|{re.escape(WORK_DIR)}/.+")


@dataclasses.dataclass
class RemoteSurvey:
    """What the store holds under the URL."""
    sizes: dict[str, int]
    manifest: dict | None
    fingerprint: dict | None  # the build there, finished (manifest) or not (marker)
    own: list[str]
    foreign: list[str]


FRESH = "fresh"  # RemoteOut.prepare: the staged build must start afresh


class RemoteOut:
    """The URL a build goes to, and its staged copy (`staged_out`, the --out the build writes)."""

    def __init__(self, url: str, staged_out: Path):
        self.url, self.staged = url.rstrip("/"), Path(staged_out)
        self.store = Store(self.url)
        self.ledger = self.staged.parent / "uploaded.jsonl"

    def uploader(self) -> Uploader:
        return Uploader(self.store, self.staged, self.ledger)

    # -- the start: what is there --------------------------------------------------------------
    def survey(self) -> RemoteSurvey:
        sizes = self.store.sizes()
        manifest = fingerprint = None
        if "manifest.json" in sizes:
            try:
                manifest = json.loads(self.store.read_bytes("manifest.json"))
                fingerprint = manifest["fingerprint"]
            except (ValueError, KeyError, TypeError):
                manifest = None
        if fingerprint is None and MARKER in sizes:
            try:
                fingerprint = json.loads(self.store.read_bytes(MARKER))
            except ValueError:
                fingerprint = None
        own = [rel for rel in sizes if fingerprint is not None and _OWN.fullmatch(rel)]
        return RemoteSurvey(sizes, manifest, fingerprint, sorted(own),
                            sorted(set(sizes) - set(own)))

    def prepare(self, fingerprint: dict, overwrite: bool) -> dict | str | None:
        """The finished build's manifest when this very build is in the store already; else
        readies the store (the marker up) and returns FRESH when the staged build must start
        afresh (nothing of it is in the store), None when it resumes. Raises SettingsError
        rather than touch a foreign object."""
        s, url = self.survey(), redact(self.url)
        if s.fingerprint is None and s.foreign:
            raise SettingsError(f"{url} is not empty and holds no longpack build ({url}/"
                                f"{s.foreign[0]} is not one of its files); refusing to write "
                                "into it: choose a new or empty --out")
        if s.fingerprint is not None and s.fingerprint != fingerprint and not overwrite:
            raise SettingsError(f"{url} holds a build with different settings "
                                f"({differences(s.fingerprint, fingerprint)}); re-run with the "
                                "same settings to resume it, or pass --overwrite to replace it")
        if s.manifest is not None and s.fingerprint == fingerprint and not overwrite:
            self.store.remove([rel for rel in s.own if rel.startswith(WORK_DIR + "/")])
            return s.manifest
        if s.foreign:
            raise SettingsError(f"{url}/{s.foreign[0]} is not a file of the longpack build in "
                                f"{url}: a build never deletes or replaces an object it did not "
                                "write; move it away and re-run")
        fresh = overwrite or s.fingerprint != fingerprint
        if fresh:  # replace a build, or start afresh: nothing staged or uploaded counts
            # the manifest first: from its removal on no reader takes the prefix as complete
            self.store.remove([rel for rel in s.own if rel == "manifest.json"])
            self.store.remove([rel for rel in s.own if rel != "manifest.json"])
            self.ledger.unlink(missing_ok=True)
        self.store.write_bytes(MARKER, json.dumps(fingerprint).encode())
        return FRESH if fresh else None

    # -- the end: the rest goes up, the manifest last -----------------------------------------
    def finish(self, manifest: dict) -> None:
        """Everything the staged build's manifest lists up in the store, checked; the manifest
        last, then the marker goes. Shards already up (and gone from the staging disk) are
        checked against the ledger and the store."""
        uploader = self.uploader()
        try:
            self._finish(manifest, uploader)
        finally:
            uploader.close()

    def _finish(self, manifest: dict, uploader: Uploader) -> None:
        listed = {"manifest.json", manifest["skipped_log"]}
        for split in manifest["splits"].values():
            folder = self.staged / split["path"]
            fmt = open_format(folder)
            for i in range(len(fmt)):
                for f in fmt.stored(i):
                    rel = f"{split['path']}/{f.basename}"
                    listed.add(rel)
                    self._ensure_shard(uploader, folder / f.basename, rel, f.sha256)
        for split in manifest["splits"].values():
            rel = f"{split['path']}/index.json"
            listed.add(rel)
            uploader.ensure(self.staged / rel)
        uploader.ensure(self.staged / manifest["skipped_log"])
        kept = manifest["tokenizer"].get("file")  # the tokenizer's copy (none: an import's)
        if kept:
            listed.add(kept)
            uploader.ensure(self.staged / kept)
        # shards of an earlier, longer attempt (none when the settings are the same: the bytes
        # are) and the marker stay out of the finished prefix
        stale = [rel for rel in self.survey().own if rel not in listed and rel != MARKER]
        self.store.remove(stale)
        uploader.ensure(self.staged / "manifest.json")
        self.store.remove(list(self.store.sizes(WORK_DIR)))  # the marker: complete now

    def _ensure_shard(self, uploader: Uploader, local: Path, rel: str, sha256: str | None):
        if local.is_file():
            uploader.ensure(local)
            local.unlink()
        elif not uploader.is_up(rel, sha256):
            raise StorageError(f"{redact(self.store.url_of(rel))} is neither in the store nor in "
                               f"the staging folder {self.staged}: re-run with --overwrite")

    def remove_staging(self) -> None:
        """What is staged (a finished build needs none); a held lock's folder goes when the
        lock is let go (lock.py)."""
        shutil.rmtree(self.staged, ignore_errors=True)
        self.ledger.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty while a lock is held in it
            self.staged.parent.rmdir()


class UploadOutput:
    """`pack build --out URL` on one machine, an Output of build.py: the build staged in
    `cfg.out` (the Destination's local folder) by a ShardOutput, whose shards go up as the
    writer finishes them; the rest, checked, when it completes (the manifest last). The store
    is checked (credentials, endpoint, bucket) as it is made, before any work."""

    def __init__(self, cfg: BuildConfig, url: str):
        self.remote = RemoteOut(url, Path(cfg.out))
        self.remote.store.check_writable()
        self.overwrite = cfg.overwrite
        self.uploader: Uploader | None = None
        self.shards = ShardOutput(cfg, publish=self._publish)
        self.skip_path = self.shards.skip_path
        self.staging_done = False  # the staged copy is of no more use: it goes with the lock
        self.already_complete = False  # the store held this very build before the run

    def _publish(self, path: Path) -> None:
        self.uploader.put(path)

    @contextlib.contextmanager
    def held(self, build):
        """The staging's lock, then the store readied (the marker up) and the staged build's
        lock; yields the store's manifest if it holds this very build already, else the state
        the staged build starts or resumes from. Once complete, the staging goes."""
        with OutputLock(self.remote.staged.parent,
                        what=f"the staging of {redact(self.remote.url)}"):
            found = self.remote.prepare(build.fingerprint, self.overwrite)
            if isinstance(found, dict):  # the very build is in the store already
                self.staging_done = self.already_complete = True
                yield found
            else:
                self.uploader = self.remote.uploader()
                # FRESH: the store held nothing of this build, so nothing staged counts either
                with self.shards.held(build, fresh=found == FRESH) as state:
                    if isinstance(state, dict):  # staged complete, cut short on its way up
                        self._finish_upload(state)
                    yield state
            if self.staging_done:
                self.remote.remove_staging()

    def open(self, state: BuildState, dtype) -> None:
        self.shards.open(state, dtype)

    def emit(self, split, tokens, lengths, hashes) -> None:
        self.shards.emit(split, tokens, lengths, hashes)

    def checkpoint(self, state: BuildState) -> None:
        self.shards.checkpoint(state)

    def wants_checkpoint(self) -> bool:
        return self.shards.wants_checkpoint()

    def finish(self, counts: dict, eos_id: int) -> dict:
        return self.shards.finish(counts, eos_id)

    def stop_writing(self) -> None:
        self.shards.stop_writing()

    def complete(self, build, indexes: dict, timings: dict) -> dict:
        manifest = self.shards.complete(build, indexes, timings)
        self._finish_upload(manifest)
        return manifest

    def _finish_upload(self, manifest: dict) -> None:
        """The rest up, checked, the manifest last (the shards in flight first)."""
        self._close_uploader()
        self.remote.finish(manifest)
        self.staging_done = True

    def abandon(self) -> None:
        self.shards.abandon()

    def close(self) -> None:
        try:
            self._close_uploader()
        finally:
            self.shards.close()

    def _close_uploader(self) -> None:
        if self.uploader is not None:
            uploader, self.uploader = self.uploader, None
            uploader.close()
