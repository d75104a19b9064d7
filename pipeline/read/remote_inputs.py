"""--input at a URL (s3://BUCKET/PREFIX, a glob under it, or one object): listed once, read as
streams.

    files = expand_remote(dataset, "s3://corpora/fineweb-edu/sample/10BT/")
    with files[0].open() as f: ...        # a seekable file: ranged reads, nothing fetched whole

A prefix is a folder: every object under it matching the dataset's patterns; a glob matches
object names as globs match paths; an object named exactly is taken whatever its name. The
readers take a RemoteInput where they take a local Path (`open`, `name`, `stat().st_size`):
JSON lines (.gz/.zst too) are read front to back in blocks of BLOCK bytes; a parquet file is
read footer first, then row group by row group (pyarrow seeks in the file object), so a
build that stops early (--max-tokens) or resumes mid-file reads only what it needs. The
fingerprint takes each object's URL, size and ETag: a replaced object changes the build.
"""

import fnmatch
from dataclasses import dataclass
from types import SimpleNamespace

from longpack.core import SettingsError, Store, redact, storage_errors

BLOCK = 8 << 20  # bytes a read fetches at least (fsspec's read-ahead block)


@dataclass(frozen=True)
class RemoteInput:
    url: str
    size: int
    etag: str | None
    store: Store

    def __str__(self) -> str:
        return self.url

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def stat(self):
        return SimpleNamespace(st_size=self.size)

    def open(self, mode: str = "rb"):
        """A file object over the object's bytes (ranged reads, BLOCK ahead)."""
        if mode != "rb":
            raise ValueError("inputs are read only")
        rel = self.url[len(self.store.url) + 1:] if self.url != self.store.url else ""
        return _Reading(self.store.open(rel, "rb", block_size=BLOCK, cache_type="readahead"),
                        self.url)

    def describe(self) -> dict:
        return {"path": redact(self.url), "size": self.size, "etag": self.etag}


class _Reading:
    """The store's file object; a failure while reading names the URL in one line."""

    def __init__(self, f, url: str):
        self._f, self._url = f, url

    def __getattr__(self, name):
        attr = getattr(self._f, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with storage_errors(self._url, "read"):
                return attr(*args, **kwargs)
        return call

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):  # line by line, as a local file
        while line := self.readline():
            yield line


def expand_remote(dataset, spec: str) -> list[RemoteInput]:
    """The objects `spec` names (see the module docstring), in URL order."""
    glob = any(c in spec for c in "*?[")
    base = spec[:min(spec.index(c) for c in "*?[" if c in spec)].rsplit("/", 1)[0] \
        if glob else spec.rstrip("/")
    store = Store(base)
    with storage_errors(spec, "list"):
        info = store.info("") if not glob else None
    if info is not None:  # one object, named exactly
        return [_input(store, "", info)]
    found = []
    for rel, meta in store.listing().items():
        url = store.url_of(rel)
        if glob and not fnmatch.fnmatchcase(url, spec) or \
                not glob and not dataset.names.match(rel.rsplit("/", 1)[-1]):
            continue
        found.append(_input(store, rel, meta))
    if not found:
        raise SettingsError(f"--input {redact(spec)}: no {dataset.name} files there (looked for "
                            f"{', '.join(dataset.patterns)}); use --dataset to pick another "
                            "format")
    return sorted(found, key=lambda f: f.url)


def _input(store: Store, rel: str, meta: dict) -> RemoteInput:
    etag = meta.get("ETag") or meta.get("etag") or meta.get("md5Hash") or meta.get("mtime")
    return RemoteInput(store.url_of(rel), int(meta.get("size") or 0),
                       None if etag is None else str(etag).strip('"'), store)
