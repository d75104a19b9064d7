"""A finished build (the OUT of `pack build` or `pack import`), local or at a URL, read back at
random: the trainer's rows and the zoo's evaluation (docs/TRAIN.md, "Rows and their order").

    build = open_build("OUT" or "s3://bucket/OUT", cache=Path("run/shard-cache"), ...)
    tokens, starts, hashes = build.train.get(i)    # global row i

One reader, `Rows`, for every shard format: a split's index.json names its format (pipeline's
`open_format`), which reads rows at random from memory-mapped files; a shard stored compressed,
or one at a URL, is unpacked or fetched into the cache (builds/cache.py) when a row of it is
first needed. Every shard is checked once per run before any of its rows is returned
(builds/verify.py); a cached copy that fails is made again once before the shard is blamed.
Rows come as (tokens [seq], segment starts (first 0), document hashes (0 = padding)); with
`seq` shorter than the build's rows, sample i is window i % k of row i // k.
"""

import bisect
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longpack.core import DataError, LongpackError, StorageError, Store, is_url, redact
from longpack.pipeline.builds.cache import ShardCache
from longpack.pipeline.builds.verify import GOOD, ShardChecks, check_ids, file_problem, size_problem
from longpack.pipeline.formats import open_format
from longpack.pipeline.formats.base import ShardError
from longpack.pipeline.manifest import manifest_lacks

__all__ = ["Build", "Rows", "Windows", "open_build"]

# --cache-limit as mosaicml-streaming reads it (bytes_to_int in streaming/base/util.py): a
# number with a unit kb..yb (powers of 1024), or whole bytes with or without "b"
SIZE = re.compile(r"(?P<number>\d+(\.\d*)?|\.\d+)\s*(?P<unit>[kmgtpezy]b)|(?P<bytes>\d+)b?")
UNFINISHED = "--shards must be the --out of a finished pack build (its manifest.json comes last)"


def dataset_fingerprint(manifest: dict) -> str:
    """16 hex digits of the build's manifest fingerprint: what a checkpoint is tied to."""
    text = json.dumps(manifest["fingerprint"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fetch(store: Store, rel: str) -> bytes:
    """An object of a build at a URL: DataError when the store has no such object (the build is
    not there, or not whole), StorageError when the store cannot say."""
    if store.info(rel) is None:
        raise DataError(f"cannot fetch {redact(store.url_of(rel))}: not found; {UNFINISHED}")
    return store.read_bytes(rel)


def read_manifest(location: str) -> dict:
    """OUT/manifest.json, read in place or through the store."""
    if is_url(location):
        url = redact(location.rstrip("/") + "/manifest.json")
        text = fetch(Store(location), "manifest.json")
    else:
        url = Path(location) / "manifest.json"
        if not url.is_file():
            raise DataError(f"{url} not found: {UNFINISHED}")
        text = url.read_bytes()
    try:
        manifest = json.loads(text)
    except ValueError as e:  # not UTF-8 too
        raise DataError(f"{url}: not valid JSON ({e}); is the build complete?") from None
    lacks = manifest_lacks(manifest, {"fingerprint": dict})
    if lacks:
        raise DataError(f"{url}: not a longpack manifest (no {', '.join(lacks)}); re-run the "
                        "pack build (or pack import) that wrote it")
    return manifest


def cache_bytes(limit: str) -> int:
    """--cache-limit in bytes (SIZE: kb..yb are powers of 1024)."""
    size = SIZE.fullmatch(str(limit).strip().lower())
    if not size:
        raise DataError(f"cache limit {limit!r}: give a size such as 20gb, 500mb or bytes")
    if size["bytes"]:
        return int(size["bytes"])
    number = float(size["number"]) * 1024 ** ("kmgtpezy".index(size["unit"][0]) + 1)
    if not math.isfinite(number):  # more digits than a float holds
        raise DataError(f"cache limit {limit!r}: too large; give a size such as 20gb or 500mb")
    return int(number)


class Rows:
    """The rows of one split, any format, local or at a URL (see the module docstring). A shard
    is read in place when the build is local and stored as it is read; otherwise through the
    cache. The OPEN_SHARDS most recently used shards stay mapped in each process (two file
    descriptors each for memmap), so a build of any number of shards stays under the
    open-file limit."""

    OPEN_SHARDS = 256

    def __init__(self, fmt, url: str | None, cache: Path, cache_limit: int, vocab_size: int):
        """`fmt`: the split's format object, its folder the split's (local) or `cache` (a
        build at a URL: `url` is the split's)."""
        self.format, self.url, self.vocab_size = fmt, url, vocab_size
        n = len(fmt)
        self.bounds = [0, *itertools.accumulate(fmt.rows_in(k) for k in range(n))]
        self.checks = ShardChecks(n)
        self.in_place = [url is None and fmt.unpacked(k) == fmt.stored(k) for k in range(n)]
        self.cache = None if all(self.in_place) else ShardCache(
            cache, [[f.basename for f in fmt.unpacked(k)] for k in range(n)], cache_limit)
        self._open: OrderedDict = OrderedDict()  # the reading thread's maps
        self._store, self._store_pid = None, None

    def __len__(self) -> int:
        return self.bounds[-1]

    def check(self, i: int) -> None:
        self.checks.ensure(bisect.bisect_right(self.bounds, i) - 1, self._check)

    def unchecked(self) -> int:
        return self.checks.unchecked()

    def get(self, i: int):
        k = bisect.bisect_right(self.bounds, i) - 1
        if self.checks.state[k] != GOOD:
            self.checks.ensure(k, self._check)
        (tokens, segments, first, _), r = self._shard(k), i - self.bounds[k]
        if self.cache is not None:
            self.cache.touch(k)
        seg = segments[first[r]:first[r + 1]]
        return tokens[r], seg[:, 1].astype(np.int64), seg[:, 2]

    def source(self, k: int, name: str | None = None) -> str:
        """A file of shard k in the build (the one naming the shard by default): path or URL."""
        name = name or self.format.stored(k)[0].basename
        return redact(f"{self.url}/{name}") if self.url else str(self.format.folder / name)

    # ------------------------------------------------------------------ the check
    def _check(self, k: int) -> None:
        fmt = self.format
        if self.url is None:  # the build's own files: one truncated is named before any read
            for f in fmt.stored(k):
                problem = size_problem(fmt.folder / f.basename, f.bytes)
                if problem:
                    raise DataError(f"{self.source(k, f.basename)}: {problem}; rebuild it with "
                                    "pack build")
        if self.in_place[k]:
            problem = self._problem(k, fmt.folder)
            if problem:
                raise DataError(f"{problem}; rebuild it with pack build")
            self._check_ids(k, fmt.folder)
            return
        with self.cache.using(k):
            for _ in range(2):  # a copy that fails is made once more
                problem = self._fill(k) or self._problem(k, self.cache.folder)
                if problem is None:
                    break
                self.cache.remove(k)
            else:
                raise DataError(f"{problem}, twice: the shard is damaged; rebuild it"
                                f"{' (and upload it again)' if self.url else ''}")
            self._check_ids(k, self.cache.folder)

    def _problem(self, k: int, folder: Path) -> str | None:
        """What is wrong with the files shard k's rows are read from, in `folder`, or None.
        A format that stores shards compressed has them checked decompressed."""
        for f in self.format.unpacked(k):
            problem = file_problem(folder / f.basename, f.bytes, f.sha256)
            if problem:
                if self.format.compressed:
                    return f"{self.source(k)}: decompressed, {problem}"
                return f"{self.source(k, f.basename)}: {problem}"
        return None

    def _check_ids(self, k: int, folder: Path) -> None:
        tokens = self._read_rows(k, folder).tokens  # a map of its own: _open is the reader's
        step = max(1, (1 << 20) // max(1, tokens.shape[1] * tokens.dtype.itemsize))
        blocks = ((a, tokens[a:a + step]) for a in range(0, len(tokens), step))
        check_ids(self.source(k), blocks, self.vocab_size)

    # ------------------------------------------------------------------ shards at hand
    def _shard(self, k: int):
        """(tokens, segments, where each row's segments begin, generation) of shard k, mapped."""
        cache, entry = self.cache, self._open.get(k)
        if entry is not None:
            if self.in_place[k] or entry[3] == cache.generation[k]:
                self._open.move_to_end(k)
                return entry
            del self._open[k]  # its files left the cache: the map holds their disk space
        if self.in_place[k]:
            shard, generation = self._read_rows(k, self.format.folder), 0
        else:
            for j in [j for j, e in self._open.items() if e[3] != cache.generation[j]]:
                del self._open[j]
            sizes = [f.bytes for f in self.format.unpacked(k)]
            with cache.using(k):
                for attempt in range(3):
                    problem = self._fill(k)  # unless it is there: it may have left since
                    if problem:
                        raise DataError(f"{problem} (fetched again after it left the cache); "
                                        "rebuild it")
                    generation = int(cache.generation[k])
                    try:
                        shard = self._read_rows(k, cache.folder)
                        break
                    except DataError:  # removed just now by another rank's cache (torchrun)?
                        if attempt == 2 or cache.holds(k, sizes):
                            raise
        # Plain ndarray views of maps: np.memmap's own indexing costs microseconds a row.
        tokens, segments = shard.tokens, np.asarray(shard.segments)
        if isinstance(tokens, np.ndarray):
            tokens = np.asarray(tokens)
        # Segments of row r: rows first[r] .. first[r + 1] of the segments (sorted by row).
        first = np.searchsorted(segments[:, 0], np.arange(len(tokens) + 1))
        self._open[k] = entry = (tokens, segments, first, generation)
        while len(self._open) > self.OPEN_SHARDS:
            self._open.popitem(last=False)
        return entry

    def _read_rows(self, k: int, folder: Path):
        try:
            shard = self.format.read_rows(k, folder)
        except LongpackError as e:  # ShardError, one line naming the file
            raise DataError(str(e)) from None
        if shard.segments is None:
            raise DataError(f"{self.source(k)}: records no document boundaries, which the "
                            "trainer needs; rebuild it with pack build")
        return shard

    # ------------------------------------------------------------------ the cache
    def _fill(self, k: int) -> str | None:
        """Put shard k's files into the cache unless they are there (the caller is using it):
        fetched (a build at a URL), unpacked (a format that stores them compressed). None, or
        what is wrong with what was fetched or unpacked."""
        fmt, cache = self.format, self.cache
        unpacked, stored = fmt.unpacked(k), fmt.stored(k)
        if cache.holds(k, [f.bytes for f in unpacked]):
            return None
        unpack = unpacked != stored  # else fetched as they are (never moved out of a build)
        cache.make_room(k, sum(f.bytes for f in stored) * bool(self.url)
                        + sum(f.bytes for f in unpacked) * unpack)
        cache.folder.mkdir(parents=True, exist_ok=True)
        part = f".{os.getpid()}-{threading.get_ident()}.part"  # whole files only by their names
        made = []
        try:
            sources = [fmt.folder / f.basename for f in stored]
            if self.url:
                sources = []
                for f in stored:
                    made.append(cache.folder / f".{f.basename}{part}")
                    self._download(k, f.basename, made[-1])
                    problem = size_problem(made[-1], f.bytes)
                    if problem:
                        return f"{self.source(k, f.basename)}: fetched, {problem}"
                    sources.append(made[-1])
            outs = sources
            if unpack:
                outs = [cache.folder / f".{f.basename}{part}" for f in unpacked]
                made += outs
                try:
                    fmt.unpack(k, sources, outs)
                except ShardError as e:
                    return f"{self.source(k)}: {e.what}"
            for out, f in zip(outs, unpacked):
                os.replace(out, cache.folder / f.basename)
            return None
        finally:
            for path in made:
                path.unlink(missing_ok=True)

    def _download(self, k: int, name: str, path: Path) -> None:
        if self._store_pid != os.getpid():  # a forked worker makes its own clients
            self._store, self._store_pid = Store(self.url), os.getpid()
        try:
            self._store.get_file(name, path)
        except StorageError:
            if self._store.info(name) is None:
                raise DataError(f"{self.source(k, name)}: missing from the store, though "
                                "index.json lists it; upload the build again, or rebuild "
                                "it") from None
            raise


class Windows:
    """Samples of `seq` tokens cut from rows of `row_seq` (a multiple of seq)."""

    def __init__(self, rows, row_seq: int, seq: int):
        self.rows, self.k, self.seq = rows, row_seq // seq, seq

    def __len__(self) -> int:
        return len(self.rows) * self.k

    def check(self, i: int) -> None:
        self.rows.check(i // self.k)

    def unchecked(self) -> int:
        return self.rows.unchecked()

    def get(self, i: int):
        tokens, starts, hashes = self.rows.get(i // self.k)
        a = (i % self.k) * self.seq
        first = int(np.searchsorted(starts, a, side="right")) - 1  # the segment running into a
        last = int(np.searchsorted(starts, a + self.seq, side="left"))
        return (tokens[a:a + self.seq], np.maximum(starts[first:last] - a, 0),
                hashes[first:last])


@dataclass
class Build:
    manifest: dict
    fingerprint: str
    seq: int
    train: object
    val: object | None  # None when the build made no val rows


def open_build(location: str, cache: Path, cache_limit: str, seq: int | None = None,
               manifest: dict | None = None) -> Build:
    """The build at `location` (its manifest, when the caller has read it already)."""
    manifest = manifest or read_manifest(location)
    fingerprint = dataset_fingerprint(manifest)
    row_seq = manifest["seq"]
    seq = seq or row_seq
    if seq < 2 or row_seq % seq:
        raise DataError(f"--seq {seq}: the build's rows are {row_seq} tokens; use a divisor of "
                        f"it (at least 2), or rebuild with pack build --seq {seq}")
    if not manifest["splits"].get("train", {}).get("rows"):
        raise DataError(f"{location}: the build has no train rows (manifest.json splits: "
                        f"{', '.join(manifest['splits']) or 'none'})")
    vocab_size, limit = manifest["tokenizer"]["vocab_size"], cache_bytes(cache_limit)
    made = _first_missing(Path(cache))  # what to remove if this fails
    try:
        splits = {}
        for split in ("train", "val"):
            if not manifest["splits"].get(split, {}).get("rows"):
                splits[split] = None  # no val split or no val rows: no evaluation
                continue
            path, folder = manifest["splits"][split]["path"], Path(cache) / fingerprint / split
            url = location.rstrip("/") + "/" + path if is_url(location) else None
            try:
                if url:
                    fmt = open_format(folder, fetch(Store(url), "index.json"),
                                      redact(f"{url}/index.json"))
                else:
                    fmt = open_format(Path(location, path).resolve())
            except ShardError as e:
                raise DataError(f"cannot open the {split} split: {e}; {UNFINISHED}") from None
            rows = Rows(fmt, url, folder, limit, vocab_size)
            splits[split] = Windows(rows, row_seq, seq) if seq != row_seq else rows
    except BaseException:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    return Build(manifest, fingerprint, seq, splits["train"], splits["val"])


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (None: it all exists)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            break
        missing = p
    return missing
