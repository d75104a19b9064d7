"""The trainer's data side so far: the global row order and batches built from real shards."""

import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_texts, write_jsonl
from longpack import archs
from longpack.core.errors import DataError, LoaderError
from longpack.pipeline.build import build
from longpack.pipeline.builds.reader import Rows, open_build
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.formats.shards import open_split
from longpack.pipeline.formats.streaming_compat import clear_stale_locks, import_streaming
from longpack.training.data.loader import StepBatches, batches, make_batch
from longpack.training.data.mixture import GlobalOrder, batch_hash


def test_every_row_once_per_epoch_and_epochs_reshuffle():
    order = GlobalOrder(num_rows=10, global_batch=4, seed=1, fingerprint="fp")
    seen = order.rows(0, 30)
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert list(seen[:10]) != list(seen[10:20])
    assert np.array_equal(order.step_rows(2), seen[8:12])  # a step may straddle epochs


def test_the_order_is_a_pure_function_of_seed_and_fingerprint():
    a = GlobalOrder(1000, 8, seed=3, fingerprint="x").rows(0, 100)
    assert np.array_equal(a, GlobalOrder(1000, 8, seed=3, fingerprint="x").rows(0, 100))
    assert not np.array_equal(a, GlobalOrder(1000, 8, seed=4, fingerprint="x").rows(0, 100))
    assert not np.array_equal(a, GlobalOrder(1000, 8, seed=3, fingerprint="y").rows(0, 100))


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_ranks_split_the_same_global_step_whatever_the_world_size(world):
    order = GlobalOrder(1000, 8, seed=0, fingerprint="f")
    for step in (0, 7, 125, 999):
        parts = [order.rank_rows(step, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate(parts), order.step_rows(step))


def test_positioning_far_ahead_reads_nothing():
    order = GlobalOrder(num_rows=50_000, global_batch=64, seed=0, fingerprint="f")
    rows = order.step_rows(1_000_000)  # epoch 1280: one permutation, no skipping
    assert len(rows) == 64 and len(set(rows.tolist())) == 64
    assert batch_hash(rows) == batch_hash(order.step_rows(1_000_000)) != batch_hash(
        order.step_rows(999_999))


def test_batches_from_a_real_build_feed_a_model(tmp_path, byte_tokenizer):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(60)])
    out = tmp_path / "out"
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=byte_tokenizer, seq=128, val_fraction=0.0),
          show_progress=False)
    rows = list(open_split(out / "train").rows())
    batch = make_batch(rows[-3:])  # the last row carries the padding
    x, y, starts = batch["input_ids"], batch["targets"], batch["doc_starts"]
    assert x.shape == y.shape == (3, 127)
    known = y[:, :-1] != -100
    assert torch.equal(x[:, 1:][known], y[:, :-1][known])  # targets are the next input tokens
    assert torch.equal(x[0], torch.as_tensor(rows[-3][0][:-1], dtype=torch.long))
    tokens, seg_starts, hashes = rows[-1]
    pad_from = int(seg_starts[-1])
    assert hashes[-1] == 0
    assert (y[2, pad_from - 1:] == -100).all() and (y[2, : pad_from - 1] >= 0).all()
    assert (starts[:, 0] == 0).all() and (starts < 127).all()
    model = archs.build("neox-tiny", vocab_size=50257)
    loss = model.loss(x, y, starts)["loss"]
    assert torch.isfinite(loss)


def _build(tmp_path, tokenizer, fmt, seq=64, val=0.1):
    if not (tmp_path / "d.jsonl").exists():
        write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(120)])
    out = tmp_path / fmt
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=tokenizer, seq=seq, val_fraction=val, format=fmt,
                      shard_bytes=seq * 2 * 8), show_progress=False)
    return out


def _same_rows(a, b):
    assert len(a) == len(b) > 0
    for i in range(len(a)):
        for x, y in zip(a.get(i), b.get(i)):
            assert np.array_equal(np.asarray(x), np.asarray(y)), i


@pytest.mark.slow
def test_mds_and_memmap_give_the_rows_the_build_wrote_through_one_reader(
        tmp_path, byte_tokenizer, no_streaming_shared_memory_left):
    mds, memmap = (_build(tmp_path, byte_tokenizer, f) for f in ("mds", "memmap"))
    a = open_build(str(mds), tmp_path / "cache", "1gb")
    b = open_build(str(memmap), tmp_path / "unused", "1gb")
    assert type(a.train) is type(b.train) is Rows  # one reader, whatever the format
    _same_rows(a.train, b.train)
    _same_rows(a.val, b.val)
    written = list(open_split(mds / "train").rows())  # pipeline's own reader
    assert all(np.array_equal(written[i][0], a.train.get(i)[0]) for i in range(len(written)))
    assert not list(mds.rglob("*.mds"))  # the build dir is not written to: only .mds.zstd
    assert not (tmp_path / "unused").exists()  # memmap is read in place
    # and mosaicml-streaming itself reads the same rows from the build (a format to be
    # compatible with, not the trainer's I/O layer)
    plain = import_streaming().StreamingDataset(local=str(mds / "train"), shuffle=False,
                                                batch_size=1)
    assert len(plain) == len(a.train)
    for i in range(len(plain)):
        sample = plain[i]
        tokens, starts, hashes = a.train.get(i)
        assert np.array_equal(sample["tokens"], tokens)
        assert np.array_equal(sample["doc_starts"], starts)
        assert np.array_equal(sample["doc_hashes"], hashes)


def test_streamings_lock_files_of_gone_datasets_are_cleared(tmp_path):
    temp, shm = tmp_path / "tmp", tmp_path / "shm"
    temp.mkdir(), shm.mkdir()
    names = ["000003_cache_filelock", "000003_barrier_filelock",  # a gone dataset's
             "000004_cache_filelock", "000004_barrier_filelock",  # a live one's (its memory)
             "my_filelock", "000005_cache_filelock.txt"]  # not streaming's
    for name in names:
        (temp / name).touch()
    (shm / "000004_locals").touch()
    assert clear_stale_locks(temp, shm) == 2
    assert sorted(p.name for p in temp.iterdir()) == sorted(names[2:])
    assert clear_stale_locks(temp, tmp_path / "no-shm") == 0  # no /dev/shm: nothing touched


def test_seq_windows_cut_rows_and_keep_document_starts(tmp_path, byte_tokenizer):
    out = _build(tmp_path, byte_tokenizer, "memmap")
    rows = open_build(str(out), tmp_path / "c", "1gb").train
    windows = open_build(str(out), tmp_path / "c", "1gb", seq=16).train
    assert len(windows) == 4 * len(rows)
    for i in range(len(rows)):
        tokens, starts, hashes = rows.get(i)
        cover = np.searchsorted(starts, np.arange(64), side="right") - 1  # segment of each token
        for j in range(4):
            w_tokens, w_starts, w_hashes = windows.get(4 * i + j)
            assert np.array_equal(w_tokens, tokens[16 * j:16 * j + 16])
            w_cover = np.searchsorted(w_starts, np.arange(16), side="right") - 1
            assert w_starts[0] == 0
            assert np.array_equal(w_hashes[w_cover], hashes[cover[16 * j:16 * j + 16]])
    with pytest.raises(DataError, match="--seq 24: .* 64 tokens; use a divisor"):
        open_build(str(out), tmp_path / "c", "1gb", seq=24)


@pytest.fixture
def memory_store():
    """fsspec's in-memory store (what the gs:// tests use), emptied after the test."""
    from longpack.core import Store

    yield "memory://builds"
    store = Store("memory://builds")
    store.remove(list(store.sizes()))


def _upload(local: Path, url: str) -> str:
    from longpack.core import Store

    store = Store(url)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            store.put_file(path, path.relative_to(local).as_posix())
    return url


def test_a_remote_build_streams_into_a_bounded_cache(tmp_path, byte_tokenizer, memory_store):
    mds = _build(tmp_path, byte_tokenizer, "mds", val=0.0)
    url = _upload(mds, f"{memory_store}/mds")
    shards = json.loads((mds / "train/index.json").read_text())["shards"]
    # while a shard is fetched, the cache counts both its forms
    limit = 3 * max(e["raw_data"]["bytes"] + e["zip_data"]["bytes"] for e in shards)
    remote = open_build(url, tmp_path / "cache", str(limit))
    local = open_build(str(mds), tmp_path / "cache2", "1gb")
    assert remote.val is None
    _same_rows(remote.train, local.train)
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in cached) <= limit
    assert 0 < len([p for p in cached if p.name.endswith(".mds")]) < len(shards) / 4  # evicted
    assert not [p for p in cached if not p.name.endswith(".mds")]  # no download, no index left
    with pytest.raises(DataError, match=f"cannot fetch {memory_store}/nowhere/manifest.json: "
                       "not found; --shards must be the --out of a finished pack build"):
        open_build(f"{memory_store}/nowhere", tmp_path / "cache3", "1gb")
    assert not (tmp_path / "cache3").exists()


@pytest.mark.parametrize("fmt", ["memmap", "mds"])
def test_a_shard_missing_from_the_store_is_named_by_its_url(tmp_path, byte_tokenizer,
                                                            memory_store, fmt):
    from longpack.core import Store

    out = _build(tmp_path, byte_tokenizer, fmt, val=0.0)
    url = _upload(out, f"{memory_store}/{fmt}")
    name = json.loads((out / "train/index.json").read_text())["shards"][0]
    name = name["tokens" if fmt == "memmap" else "zip_data"]["basename"]
    Store(url).remove([f"train/{name}"])
    rows = open_build(url, tmp_path / "cache", "1gb").train
    with pytest.raises(DataError, match=f"^{url}/train/{name}: missing from the store, though "
                       "index.json lists it; upload the build again, or rebuild it$"):
        rows.get(0)


def test_the_cache_never_removes_a_shard_in_use_and_drops_the_least_recent(tmp_path):
    from longpack.pipeline.builds.cache import ShardCache

    folder = tmp_path / "c"
    folder.mkdir()
    cache = ShardCache(folder, [[f"s{k}.a", f"s{k}.b"] for k in range(4)], limit=100)
    for k in range(4):
        with cache.using(k):
            for part in "ab":
                (folder / f"s{k}.{part}").write_bytes(b"x" * 10)
    (folder / "other").write_bytes(b"x" * 10)  # counts, never removed
    assert cache.holds(3, [10, 10]) and not cache.holds(3, [10, 11])
    with cache.using(0):  # the oldest, but in use
        cache.make_room(3, 40)  # 90 + 40: two shards must go
    assert sorted(p.name for p in folder.iterdir()) == ["other", "s0.a", "s0.b", "s3.a", "s3.b"]
    assert list(cache.generation) == [0, 1, 1, 0]
    cache.make_room(3, 1000)  # more than can fit: all but the shard being put in
    assert sorted(p.name for p in folder.iterdir()) == ["other", "s3.a", "s3.b"]


def _gzip_tokens(build: Path) -> None:
    """Turn a memmap build's splits into GzipTokens' (its tokens files gzip-compressed)."""
    import gzip
    import hashlib

    for index_path in build.glob("*/index.json"):
        index = json.loads(index_path.read_text())
        for entry in index["shards"]:
            path = index_path.parent / entry["tokens"]["basename"]
            data = gzip.compress(path.read_bytes())
            (path.parent / f"{path.name}.gz").write_bytes(data)
            path.unlink()
            entry["gz"] = {"basename": f"{path.name}.gz", "bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()}
        index_path.write_text(json.dumps({**index, "format": "gzip-test"}))


def test_a_format_of_one_class_trains_with_no_change_to_the_trainer(
        tmp_path, byte_tokenizer, memory_store, monkeypatch):
    """A format the trainer has never heard of, registered in one line, whose shards are stored
    compressed: read from a folder (unpacked into the cache) and from a URL, the same rows."""
    import gzip
    import shutil

    from longpack.pipeline import formats
    from longpack.pipeline.formats.base import StoredFile
    from longpack.pipeline.formats.memmap import MemmapFormat

    class GzipTokens(MemmapFormat):
        name, compressed = "gzip-test", True

        @classmethod
        def claims(cls, index):
            return index.get("format") == "gzip-test"

        def stored(self, i):
            gz = self.entries[i]["gz"]
            return [StoredFile(gz["basename"], gz["bytes"], gz["sha256"]), self.unpacked(i)[1]]

        def unpacked(self, i):
            return MemmapFormat.stored(self, i)

        def unpack(self, i, stored, out):
            out[0].write_bytes(gzip.decompress(stored[0].read_bytes()))
            if out[1] != stored[1]:
                shutil.copyfile(stored[1], out[1])

        def read_rows(self, i, folder=None):  # the unpacked files are memmap's
            return MemmapFormat(folder or self.folder, self.index).read_shard(i)

    monkeypatch.setitem(formats.FORMATS, "gzip-test", GzipTokens)  # one registry line
    plain = _build(tmp_path, byte_tokenizer, "memmap")
    gz = Path(shutil.copytree(plain, tmp_path / "gz"))
    _gzip_tokens(gz)
    before = {p: p.read_bytes() for p in gz.rglob("*") if p.is_file()}
    want = open_build(str(plain), tmp_path / "c0", "1gb")
    local = open_build(str(gz), tmp_path / "c1", "1gb")
    remote = open_build(_upload(gz, f"{memory_store}/gz"), tmp_path / "c2", "1gb")
    assert type(local.train.format) is GzipTokens
    for b in (local, remote):
        _same_rows(b.train, want.train)
        _same_rows(b.val, want.val)
    assert before == {p: p.read_bytes() for p in gz.rglob("*") if p.is_file()}  # read in place
    assert list((tmp_path / "c1").rglob("shard.*.tokens.npy"))  # unpacked into the cache


def _shared_maps() -> int:
    """This process's shared anonymous mappings (the loader's slots: mmap(-1, ...), which
    /proc/self/maps shows as "/dev/zero (deleted)" with "s" in the permissions)."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sum(1 for line in lines if line.split()[1].endswith("s") and "/dev/zero" in line)


@pytest.mark.parametrize("fmt", ["memmap", "mds"])
@pytest.mark.slow
def test_worker_processes_deliver_what_the_trainer_would_build_in_order(tmp_path, byte_tokenizer,
                                                                        fmt):
    b = open_build(str(_build(tmp_path, byte_tokenizer, fmt)), tmp_path / "cache", "1gb")
    order = GlobalOrder(len(b.train), global_batch=6, seed=0, fingerprint=b.fingerprint)
    data = StepBatches(order, b.train, rank=1, world=2, batch_size=1, grad_accum=3)
    before = _shared_maps()
    expected = [data[k] for k in range(5 * 3, 40 * 3)]  # steps 5..39, in this process
    got = [{k: np.array(v) for k, v in batch.items()} for batch in batches(data, 5, 40, 2)]
    assert len(got) == len(expected)
    for a, e in zip(got, expected):
        assert all(np.array_equal(a[k], e[k]) for k in e)
    stream = batches(data, 0, 40, 3)
    next(stream)
    assert _shared_maps() > before and multiprocessing.active_children()
    stream.close()  # a trainer that stops early: workers and shared memory go away
    assert _shared_maps() == before and not multiprocessing.active_children()


@pytest.mark.slow
def test_a_killed_worker_is_reported_not_waited_for(tmp_path, byte_tokenizer):
    import multiprocessing
    import os
    import signal

    b = open_build(str(_build(tmp_path, byte_tokenizer, "memmap")), tmp_path / "c", "1gb")
    order = GlobalOrder(len(b.train), global_batch=2, seed=0, fingerprint=b.fingerprint)
    data = StepBatches(order, b.train, rank=0, world=1, batch_size=2, grad_accum=1)
    stream = batches(data, 0, 10**6, 2)
    next(stream)
    os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)
    with pytest.raises(LoaderError, match="loader worker . died"):
        for _ in range(100):  # the worker's few prefetched batches, then its death
            next(stream)


def test_a_batch_kept_after_the_stream_ends_stays_readable(tmp_path, byte_tokenizer):
    b = open_build(str(_build(tmp_path, byte_tokenizer, "memmap")), tmp_path / "c", "1gb")
    order = GlobalOrder(len(b.train), global_batch=2, seed=0, fingerprint=b.fingerprint)
    data = StepBatches(order, b.train, rank=0, world=1, batch_size=2, grad_accum=1)
    stream = batches(data, 0, 5, 2)
    kept = [next(stream) for _ in range(3)][-1]
    stream.close()  # workers gone; the memory the kept batch lies in must not be unmapped
    assert np.array_equal(kept["tokens"], data[2]["tokens"])


_TRAINER = """
import sys, time, multiprocessing
from pathlib import Path
from longpack.pipeline.builds.reader import open_build
from longpack.training.data.loader import StepBatches, batches
from longpack.training.data.mixture import GlobalOrder
b = open_build(sys.argv[1], Path(sys.argv[2]), "1gb")
order = GlobalOrder(len(b.train), global_batch=2, seed=0, fingerprint=b.fingerprint)
stream = batches(StepBatches(order, b.train, 0, 1, 2, 1), 0, 10**6, 2)
next(stream)
print(*[p.pid for p in multiprocessing.active_children()], flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:  # field 3 of /proc/PID/stat is the state; Z: exited, waiting to be reaped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
@pytest.mark.slow
def test_workers_exit_when_the_trainer_is_killed(tmp_path, byte_tokenizer):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = _build(tmp_path, byte_tokenizer, "memmap")
    proc = subprocess.Popen([sys.executable, "-c", _TRAINER, str(out), str(tmp_path / "c")],
                            stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    workers = [int(p) for p in proc.stdout.readline().split()]
    assert len(workers) == 2 and all(_running(p) for p in workers)
    os.kill(proc.pid, signal.SIGKILL)  # no finally, no cleanup: an OOM kill, a node failure
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_running(p) for p in workers):
        time.sleep(0.1)
    assert not any(_running(p) for p in workers), "loader workers outlived their trainer"


class _BadRows:
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def get(self, i):
        if i == 7:
            raise ValueError("row 7 is unreadable")
        return self.rows.get(i)


def test_a_failing_worker_names_the_batch_and_the_cause(tmp_path, byte_tokenizer):
    b = open_build(str(_build(tmp_path, byte_tokenizer, "memmap")), tmp_path / "c", "1gb")
    order = GlobalOrder(len(b.train), global_batch=len(b.train), seed=0, fingerprint="f")
    data = StepBatches(order, _BadRows(b.train), rank=0, world=1, batch_size=4,
                       grad_accum=len(b.train) // 4)
    with pytest.raises(LoaderError, match="(?s)failed on micro-batch .*row 7 is unreadable"):
        list(batches(data, 0, 1, 2))
