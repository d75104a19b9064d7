"""Where the trainer's rows come from: a build of `pack build` (OUT), local or remote.

    build = open_build("OUT" or "s3://bucket/OUT", cache=Path("run/shard-cache"), ...)
    tokens, starts, hashes = build.train.get(i)    # global row i

- memmap shards (local): memory-mapped `.npy` files; a row is a slice (pipeline/formats/shards.py).
- MDS shards, local or at a URL mosaicml-streaming can read (s3://, gs://, ...; for an
  S3-compatible store, S3_ENDPOINT_URL names it): a `streaming.StreamingDataset` in
  random-access mode. A shard is fetched (a local build is copied) and decompressed into the
  cache when one of its rows is first asked for, and the coldest shards are evicted beyond
  `cache_limit`. The build directory is never written to. The cache lives under the build's
  fingerprint, so a cache left by other shards is never read. The cache directory is made when
  the first file is written into it (a memmap build never writes one), and when open_build
  fails it removes what it made, so a failed run leaves nothing behind.
- `seq` shorter than the build's rows: each row is cut into row_seq / seq windows; sample
  i is window i % k of row i // k. A document running into a window starts it (offset 0).

Every shard is checked (its sha256 against index.json, its ids against the vocabulary) once per
run, before any of its rows is returned: training/verify.py. A shard that fails, cannot be
read, fetched or decompressed raises DataError naming it (and the row where known).

Rows come as (tokens [seq], starts, hashes): segment starts (first 0) and document hashes
(0 = padding), what training/batch.py turns into a model's batch. `check(i)` checks the shard
of row i without reading the row (the loader checks ahead with it); `unchecked()` says how many
shards are left to check.
"""

import bisect
import hashlib
import itertools
import json
import random
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longpack import DataError, LongpackError
from pipeline import MdsFormat, SplitReader, clear_stale_locks, get_format, import_streaming
from training.verify import GOOD, ShardChecks, check_ids, file_problem

__all__ = ["Build", "MemmapRows", "StreamingRows", "Windows", "open_build"]


def is_remote(location: str) -> bool:
    return "://" in location


def dataset_fingerprint(manifest: dict) -> str:
    """16 hex digits of the build's manifest fingerprint: what a checkpoint is tied to."""
    text = json.dumps(manifest["fingerprint"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_manifest(location: str) -> dict:
    """OUT/manifest.json; a remote one is fetched into a temporary directory (the cache is not
    made for it: see the module docstring)."""
    if is_remote(location):
        url = location.rstrip("/") + "/manifest.json"
        downloader = import_streaming().base.storage.CloudDownloader
        with tempfile.TemporaryDirectory(prefix="longpack-manifest.") as tmp:
            try:
                downloader.direct_download(url, str(Path(tmp) / "manifest.json"))
                text = (Path(tmp) / "manifest.json").read_text()
            except Exception as e:  # the cloud clients raise many kinds
                raise DataError(f"cannot fetch {url} ({type(e).__name__}: {e}); check the URL "
                                "and credentials, or copy the build locally") from None
    else:
        url = Path(location) / "manifest.json"
        if not url.is_file():
            raise DataError(f"{url} not found: --shards must be the --out of a finished pack "
                            "build")
        text = url.read_text()
    try:
        return json.loads(text)
    except ValueError as e:
        raise DataError(f"{url}: not valid JSON ({e}); is the build complete?") from None


class MemmapRows:
    """Rows of local memmap shards; the OPEN_SHARDS most recently used stay mapped (two file
    descriptors each), so a build of any number of shards stays under the open-file limit."""

    OPEN_SHARDS = 256

    def __init__(self, split_dir: Path, vocab_size: int):
        try:
            self.reader, self.vocab_size = SplitReader(split_dir), vocab_size
        except LongpackError as e:  # ShardError: a missing or unusable index.json
            raise DataError(str(e)) from None
        counts = [self.reader.rows_in_shard(k) for k in range(len(self.reader.shard_files()))]
        self.bounds = [0, *itertools.accumulate(counts)]
        self.checks = ShardChecks(len(counts))
        self._open: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return self.bounds[-1]

    def check(self, i: int) -> None:
        self.checks.ensure(bisect.bisect_right(self.bounds, i) - 1, self._check)

    def unchecked(self) -> int:
        return self.checks.unchecked()

    def _check(self, k: int) -> None:
        for stored in self.reader.format.stored(k):
            path = self.reader.path / stored.basename
            problem = file_problem(path, stored.bytes, stored.sha256)
            if problem:
                raise DataError(f"{path}: {problem}; rebuild it with pack build")
        try:  # a map of its own: _open belongs to the thread that reads rows
            tokens = self.reader.read_shard(k).tokens
        except LongpackError as e:
            raise DataError(str(e)) from None
        check_ids(self.reader.shard_files()[k], [(0, tokens)], self.vocab_size)

    def _shard(self, k: int):
        if k in self._open:
            self._open.move_to_end(k)
            return self._open[k]
        try:
            shard = self.reader.read_shard(k)
        except LongpackError as e:  # ShardError, one line naming the file
            raise DataError(str(e)) from None
        # Plain ndarray views of the maps: np.memmap's own indexing costs microseconds a row.
        tokens, segments = np.asarray(shard.tokens), np.asarray(shard.segments)
        # Segments of row r: rows first[r] .. first[r + 1] of docs.npy (sorted by row).
        first = np.searchsorted(segments[:, 0], np.arange(len(tokens) + 1))
        self._open[k] = (tokens, segments, first)
        while len(self._open) > self.OPEN_SHARDS:
            self._open.popitem(last=False)
        return tokens, segments, first

    def get(self, i: int):
        k = bisect.bisect_right(self.bounds, i) - 1
        if self.checks.state[k] != GOOD:
            self.checks.ensure(k, self._check)
        (tokens, segments, first), r = self._shard(k), i - self.bounds[k]
        seg = segments[first[r]:first[r + 1]]
        return tokens[r], seg[:, 1].astype(np.int64), seg[:, 2]


class StreamingRows:
    """Rows of an MDS split through mosaicml-streaming. The check of a shard (verify.py) is of
    its decompressed copy in the cache: the bytes the rows are read from. A copy that fails is
    fetched once more before the shard is blamed (the cache, or a fetch, may be what broke)."""

    def __init__(self, remote: str, local: Path, cache_limit: str, vocab_size: int):
        self.remote, self.local, self.vocab_size = remote, local, vocab_size
        self.dataset = self._open(cache_limit)
        # streaming has put the split's index.json in the cache (it reads it from there too)
        self.shards = MdsFormat(local, json.loads((local / "index.json").read_text()))
        self.checks = ShardChecks(len(self.shards))

    def _open(self, cache_limit: str):
        """The StreamingDataset. streaming names its shared memory by the first free number,
        looked up and then taken: two processes opening datasets at the same moment may pick
        the same one, and the slower gets FileExistsError; it tries again (one process: under
        torchrun the ranks' barriers inside streaming would no longer pair up)."""
        import torch.distributed as dist

        attempts = 1 if dist.is_available() and dist.is_initialized() else 5
        clear_stale_locks()  # else each open walks every dataset's lock files ever left
        for attempt in range(attempts):
            try:
                return import_streaming().StreamingDataset(
                    remote=self.remote, local=str(self.local), shuffle=False, batch_size=1,
                    cache_limit=cache_limit, keep_zip=False)
            except (ValueError, FileNotFoundError) as e:
                raise DataError(f"mosaicml-streaming cannot open {self.remote} (cache "
                                f"{self.local}): {e}") from None
            except FileExistsError:
                time.sleep(random.Random().uniform(0.05, 0.5) * (attempt + 1))  # own RNG
        raise DataError(f"{self.remote}: mosaicml-streaming's shared memory was taken by "
                        "another process opening a dataset at the same moment; start again")

    def __len__(self) -> int:
        # All rows of the split; len(StreamingDataset) is one rank's share of an epoch.
        return self.dataset.num_samples

    def check(self, i: int) -> None:
        self.checks.ensure(int(self.dataset.spanner[int(i)][0]), self._check)

    def unchecked(self) -> int:
        return self.checks.unchecked()

    def source(self, k: int) -> str:
        """Shard k's file in the build (a path or a URL)."""
        return f"{self.remote}/{self.shards.stored(k)[0].basename}"

    def _check(self, k: int) -> None:
        source, remote = self.source(k), is_remote(self.remote)
        if not remote:  # a local build: a truncated shard is named before streaming copies it
            stored = self.shards.stored(k)[0]
            size = Path(source).stat().st_size if Path(source).is_file() else None
            if size != stored.bytes:
                raise DataError(f"{source}: {'missing' if size is None else f'{size:,} bytes'}, "
                                f"index.json says {stored.bytes:,} (truncated or replaced); "
                                "rebuild it with pack build")
        raw = self.shards.raw(k)
        cached = self.local / raw.basename
        for _ in range(2):  # a copy that fails is fetched once more
            try:
                self.dataset.prepare_shard(k)
            except Exception as e:  # zstd, cloud and file errors
                raise DataError(f"{source}: cannot be {'fetched or ' if remote else ''}"
                                f"decompressed ({type(e).__name__}: {e}); the shard is damaged"
                                f"{' or unreachable' if remote else ''}: rebuild it") from None
            problem = file_problem(cached, raw.bytes, raw.sha256)
            if problem is None:
                break
            cached.unlink(missing_ok=True)  # fetched again by prepare_shard
        else:
            raise DataError(f"{source}: decompressed, {problem}, twice: the shard is damaged; "
                            f"rebuild it{' (and upload it again)' if remote else ''}")
        try:
            blocks = MdsFormat.token_blocks(cached, self.shards.entries[k])
            check_ids(source, blocks, self.vocab_size)
        except (ValueError, LongpackError) as e:
            if isinstance(e, DataError):
                raise
            raise DataError(f"{source}: cannot be decoded ({e})") from None

    def get(self, i: int):
        i = int(i)
        k = int(self.dataset.spanner[i][0])
        self.checks.ensure(k, self._check)
        try:
            sample = self.dataset.get_item(i)
        except Exception as e:  # a shard evicted and fetched again, unreachable now
            raise DataError(f"{self.source(k)}: row {i} cannot be read ({type(e).__name__}: "
                            f"{e})") from None
        return (sample["tokens"], sample["doc_starts"].astype(np.int64),
                sample["doc_hashes"])


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
    shard_format = get_format(manifest["format"])
    if not shard_format.streamed and is_remote(location):
        raise DataError(f"{location}: {shard_format.name} builds are read from local disk; copy "
                        "it locally or build with --format mds to stream it")
    if not manifest["splits"].get("train", {}).get("rows"):
        raise DataError(f"{location}: the build has no train rows (manifest.json splits: "
                        f"{', '.join(manifest['splits']) or 'none'})")
    vocab_size = manifest["tokenizer"]["vocab_size"]
    made = _first_missing(Path(cache))  # what to remove if this fails
    try:
        splits = {}
        for split in ("train", "val"):
            if not manifest["splits"].get(split, {}).get("rows"):
                splits[split] = None  # no val split or no val rows: no evaluation
                continue
            path = manifest["splits"][split]["path"]
            if shard_format.streamed:
                remote = location.rstrip("/") + "/" + path if is_remote(location) \
                    else str(Path(location, path).resolve())
                rows = StreamingRows(remote, Path(cache) / fingerprint / split, cache_limit,
                                     vocab_size)
            else:
                rows = MemmapRows(Path(location) / path, vocab_size)
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
