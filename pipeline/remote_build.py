"""`pack build --out s3://bucket/prefix` (any store pipeline/storage.py writes): the build runs
in a local staging folder and its files go up as they finish.

    STAGING/<16 hex of the URL>/out/            the build, exactly as a local --out
    STAGING/<16 hex of the URL>/uploaded.jsonl  what is already up (uploader.py)

Order in the store, so that a reader never takes a partial dataset for a complete one:
  1. URL/.longpack-build/fingerprint.json   first: the prefix holds an unfinished build
  2. shards, as the shard writer finishes them, in the background (uploader.py; each leaves the
     staging disk once up, so it holds a few shards whatever the build's size)
  3. each split's index.json, then skipped.jsonl, then manifest.json last
  4. the marker goes, then the staging folder.
A re-run (after Ctrl+C, kill -9, a lost connection) resumes the staged build from its
checkpoint; the shards it writes again are checked against the ledger and the store, not sent
again. The bytes in the store are those of a local build of the same command.

What the build may remove or replace in the store follows output_dir.py's rules: only its own
layout (manifest.json, skipped.jsonl, SPLIT/index.json, SPLIT/shard.*, .longpack-build/*) under
a prefix that holds a longpack build (a manifest or the marker); anything else there is
foreign, and the build refuses to start, --overwrite or not. Two machines building into one
URL at once are not kept apart (stores have no locks): one URL, one writer.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from pipeline.build import Build
from pipeline.config import SPLITS, WORK_DIR, BuildConfig
from pipeline.errors import SettingsError
from pipeline.formats import open_format
from pipeline.output_dir import FINGERPRINT, differences
from pipeline.output_lock import OutputLock
from pipeline.storage import StorageError, Store, redact
from pipeline.uploader import Uploader

MARKER = f"{WORK_DIR}/{FINGERPRINT}"
_SPLIT = "|".join(SPLITS)
_OWN = re.compile(rf"manifest\.json|skipped\.jsonl|({_SPLIT})/(index\.json|shard\.\d{{5,}}\.[a-z.]+)"
                  rf"|{re.escape(WORK_DIR)}/.+")


def staging_root(cfg: BuildConfig) -> Path:
    """This URL's staging folder: under --staging, else the user's cache."""
    base = Path(cfg.staging) if cfg.staging else Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longpack" / "staging"
    return base / hashlib.sha256(cfg.out.rstrip("/").encode()).hexdigest()[:16]


@dataclasses.dataclass
class RemoteSurvey:
    """What the store holds under the URL."""
    sizes: dict[str, int]
    manifest: dict | None
    fingerprint: dict | None  # the build there, finished (manifest) or not (marker)
    own: list[str]
    foreign: list[str]


class RemoteBuild:
    def __init__(self, cfg: BuildConfig, show_progress: bool | None = None):
        self.url = cfg.out.rstrip("/")
        self.store = Store(self.url)
        self.root = staging_root(cfg)
        self.staged = self.root / "out"
        self.cfg, self.show_progress = cfg, show_progress
        self.already_complete = False

    def run(self) -> dict:
        """Build (or resume, or find complete) the URL; returns its manifest."""
        self.store.check_writable()  # credentials, endpoint, bucket: before any work
        with OutputLock(self.root, what=f"the staging folder of {redact(self.url)}"):
            build = Build(dataclasses.replace(self.cfg, out=str(self.staged), staging=None),
                          show_progress=self.show_progress)
            found = self._prepare(build.fingerprint)
            if found is not None:
                self.already_complete = True
                self._remove_staging()
                return found
            self.store.write_bytes(MARKER, json.dumps(build.fingerprint).encode())
            uploader = Uploader(self.store, self.staged, self.root / "uploaded.jsonl")
            try:
                build.publish = uploader.put
                manifest = build.run()
                uploader.drain()
                self._finish(manifest, uploader)
            finally:
                uploader.close()
            self._remove_staging()  # the lock's folder goes with the lock
        return manifest

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

    def _prepare(self, fingerprint: dict) -> dict | None:
        """The finished build's manifest when this very build is in the store already; else
        readies store and staging for building (resuming what is staged when it is this
        build's), or raises SettingsError rather than touch a foreign object."""
        s, url, overwrite = self.survey(), redact(self.url), self.cfg.overwrite
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
        if overwrite or s.fingerprint != fingerprint:  # replace a build, or start afresh
            # the manifest first: from its removal on no reader takes the prefix as complete
            self.store.remove([rel for rel in s.own if rel == "manifest.json"])
            self.store.remove([rel for rel in s.own if rel != "manifest.json"])
            self._remove_staging()
        return None

    # -- the end: the rest goes up, the manifest last -----------------------------------------
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
        # shards of an earlier, longer attempt (none when the settings are the same: the bytes
        # are) and the marker stay out of the finished prefix
        stale = [rel for rel in self.survey().own if rel not in listed and rel != MARKER]
        self.store.remove(stale)
        uploader.ensure(self.staged / "manifest.json")
        self.store.remove([MARKER])

    def _ensure_shard(self, uploader: Uploader, local: Path, rel: str, sha256: str | None):
        if local.is_file():
            uploader.ensure(local)
            local.unlink()
        elif not uploader.is_up(rel, sha256):
            raise StorageError(f"{redact(self.store.url_of(rel))} is neither in the store nor in "
                               f"the staging folder {self.staged}: re-run with --overwrite")

    def _remove_staging(self) -> None:
        """What is staged (a finished build needs none, a fresh one must not find any); the
        held lock's folder goes when the lock is let go (output_lock.py)."""
        shutil.rmtree(self.staged, ignore_errors=True)
        (self.root / "uploaded.jsonl").unlink(missing_ok=True)
