"""The trainer never trains on damaged shards, says which one in one line, and reads remote builds
(issue 12): pipeline/builds/verify.py, pipeline/builds/reader.py, training/data/loader.py."""

import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard
from click.testing import CliRunner

from conftest import make_texts, write_byte_tokenizer_json, write_jsonl
from longpack.core.atomic import sha256_file
from longpack.core.errors import DataError
from longpack.pipeline.build import build
from longpack.pipeline.builds.reader import open_build
from longpack.pipeline.builds.verify import ShardChecks
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.formats.mds import MdsColumns
from longpack.training.cli import train as train_cli
from longpack.training.data.loader import StepBatches, batches
from longpack.training.data.mixture import GlobalOrder

REPO = Path(__file__).resolve().parents[1]


def make_build(tmp_path, tokenizer, fmt="mds", compression="zstd", docs=30, rows_per_shard=4,
               name=None) -> Path:
    """A small build whose train split has several shards of `rows_per_shard` 65-token rows."""
    corpus = tmp_path / "d.jsonl"
    if not corpus.exists():
        write_jsonl(corpus, [{"text": t} for t in make_texts(docs)])
    out = tmp_path / (name or f"{fmt}-{compression}")
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(corpus),), tokenizer=tokenizer,
                      seq=65, val_fraction=0.05, format=fmt,
                      compression=None if fmt == "memmap" else compression,
                      shard_bytes=65 * 2 * rows_per_shard), show_progress=False)
    return out


def train_args(shards, out, steps: int, *extra) -> list[str]:
    return ["--shards", str(shards), "--out", str(out), "--model", "neox-tiny",
            "--batch-size", "4", "--max-steps", str(steps), "--warmup", "1", "--lr", "3e-3",
            "--save-every", "1000", "--eval-every", "1000", "--report-to", "jsonl", "--workers", "2",
            *extra]


def epoch_steps(out: Path) -> int:
    """Steps of 4 rows that read every train row at least once."""
    return math.ceil(json.loads((out / "manifest.json").read_text())["splits"]["train"]["rows"]
                     / 4)


def shard_of_step_0(out: Path) -> int:
    """A shard, not the first (the trainer itself reads a row of that one to size the loader's
    slots), that train_args' first step reads: the order is a pure function of the build."""
    b = open_build(str(out), out.parent / "probe-cache", "1gb")
    order = GlobalOrder(len(b.train), global_batch=4, seed=0, fingerprint=b.fingerprint)
    entries = index_entries(out / "train")
    bounds = np.cumsum([e.get("samples", e.get("rows")) for e in entries])
    shards = [int(np.searchsorted(bounds, r, side="right")) for r in order.step_rows(0)]
    return next(k for k in shards if k != 0)


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def one_line_error(result) -> str:
    """The CLI's error, checked to be one `Error:` line, the last, and no traceback (before it:
    what the run said as it started, e.g. its `training ...` line)."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("Error: "), result.output
    assert not any(line.startswith("Error") for line in lines[:-1]), result.output
    return lines[-1]


def index_entries(split: Path) -> list[dict]:
    return json.loads((split / "index.json").read_text())["shards"]


# -- 1. a remote build through a real S3-compatible server -------------------------------------

@pytest.mark.slow
def test_a_build_on_s3_gives_the_rows_of_the_local_folder(tmp_path, byte_tokenizer, s3):
    out = make_build(tmp_path, byte_tokenizer)
    url = s3.upload_tree(out, "prefix")
    remote, local = (open_build(where, tmp_path / f"cache-{i}", "1gb")
                     for i, where in enumerate((url, str(out))))
    assert len(remote.train) == len(local.train) > 0 and remote.fingerprint == local.fingerprint
    for i in range(len(local.train)):
        assert all(np.array_equal(a, b) for a, b in zip(remote.train.get(i), local.train.get(i)))
    with pytest.raises(DataError, match=f"cannot fetch {s3.url()}/nowhere/manifest.json"):
        open_build(s3.url("nowhere"), tmp_path / "cache-x", "1gb")
    assert not (tmp_path / "cache-x").exists()


@pytest.mark.slow
def test_train_from_s3_in_a_fresh_process_matches_the_local_folder(tmp_path, s3):
    """`train` as the README runs it: a new interpreter, where torchvision cannot load next to
    a CPU torch (streaming must be imported through pipeline/formats/streaming_compat.py)."""
    out = make_build(tmp_path, str(write_byte_tokenizer_json(tmp_path / "bytes-tokenizer.json")))
    url = s3.upload_tree(out, "prefix")
    runs = {}
    for name, shards in (("s3", url), ("local", str(out))):
        run = tmp_path / f"run-{name}"
        proc = subprocess.run([sys.executable, "-c", "from longpack.training.cli import train; train()",
                               *train_args(shards, run, 5)], cwd=REPO, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = losses(run)
    assert len(runs["s3"]) == 5 and runs["s3"] == runs["local"]
    cached = list((tmp_path / "run-s3" / "shard-cache").rglob("shard.*.mds"))
    assert cached  # the shards came through the cache


# -- 2. one-line errors naming the shard -------------------------------------------------------

def test_ids_beyond_the_vocabulary_are_named_not_an_index_error(tmp_path, byte_tokenizer):
    out = make_build(tmp_path, byte_tokenizer)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["vocab_size"] = 256  # the model gets 256 ids; EOS is 50256
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(train_cli, train_args(out, tmp_path / "run", 2))
    line = one_line_error(result)
    assert "shard." in line and "holds token id 50,256, beyond the vocabulary (256 ids" in line


def _rewrite_memmap_token(out: Path, shard: int, row: int, value: int) -> Path:
    """Set one token of a memmap shard, and record the new file's sha256 and size in index.json
    (as a tool that rewrites shards would): only the id check can catch it."""
    split = out / "train"
    index = json.loads((split / "index.json").read_text())
    entry = index["shards"][shard]["tokens"]
    path = split / entry["basename"]
    tokens = np.load(path, mmap_mode="r+")
    tokens[row, 7] = value
    tokens.flush()
    del tokens
    entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    (split / "index.json").write_text(json.dumps(index))
    return path


def test_a_worker_s_data_error_reaches_the_trainer_as_the_same_one_line(tmp_path,
                                                                        byte_tokenizer):
    out = make_build(tmp_path, byte_tokenizer, fmt="memmap")
    shard = shard_of_step_0(out)  # the last shard of a split may hold a single row: its last
    row = index_entries(out / "train")[shard]["rows"] - 1
    path = _rewrite_memmap_token(out, shard=shard, row=row, value=60000)
    b = open_build(str(out), tmp_path / "cache", "1gb")
    order = GlobalOrder(len(b.train), global_batch=4, seed=0, fingerprint=b.fingerprint)
    data = StepBatches(order, b.train, rank=0, world=1, batch_size=4, grad_accum=1)
    with pytest.raises(DataError) as caught:  # the worker's own error, not a LoaderError
        for _ in batches(data, 0, 2, workers=2):
            pass
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: row {row} holds token id 60,000, beyond the vocabulary")
    result = CliRunner().invoke(train_cli, train_args(out, tmp_path / "run", 2))
    assert one_line_error(result) == f"Error: {message}"


def test_a_truncated_mds_shard_is_named(tmp_path, byte_tokenizer):
    out = make_build(tmp_path, byte_tokenizer)
    entry = index_entries(out / "train")[shard_of_step_0(out)]
    path = out / "train" / entry["zip_data"]["basename"]
    path.write_bytes(path.read_bytes()[:entry["zip_data"]["bytes"] // 2])
    result = CliRunner().invoke(train_cli, train_args(out, tmp_path / "run", 2))
    line = one_line_error(result)
    assert line == (f"Error: {path.resolve()}: {entry['zip_data']['bytes'] // 2:,} bytes, "
                    f"index.json says {entry['zip_data']['bytes']:,} (truncated or replaced); "
                    "rebuild it with pack build")


# -- 3. damaged bytes with in-vocabulary ids: caught by the sha256 -----------------------------

def _flip_a_byte_that_still_decodes(path: Path, entry: dict) -> None:
    """Flip one bit of a .zstd shard where the frame still decodes (zstd keeps no checksum) to a
    shard of the same layout whose ids all stay in the vocabulary: only the hash can tell."""
    data = path.read_bytes()
    raw = zstandard.ZstdDecompressor().decompress(data)
    for at in range(len(data) - 1, 0, -1):
        damaged = bytearray(data)
        damaged[at] ^= 1
        try:
            got = zstandard.ZstdDecompressor().decompress(bytes(damaged))
            columns = MdsColumns(got, entry)
            starts, seq, dtype = columns.row_starts("tokens")
        except Exception:  # noqa: BLE001 -- undecodable: try the next byte
            continue
        rows = np.empty((len(starts), seq), dtype)
        columns.copy_rows(starts, rows)
        if got != raw and len(got) == len(raw) and rows.max() < 50257:
            path.write_bytes(bytes(damaged))
            return
    raise AssertionError("no byte of the shard decodes when flipped")


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_a_flipped_byte_in_an_mds_shard_stops_training(tmp_path, byte_tokenizer, compression):
    out = make_build(tmp_path, byte_tokenizer, compression=compression)
    entry = index_entries(out / "train")[shard_of_step_0(out)]
    path = out / "train" / (entry["zip_data"] or entry["raw_data"])["basename"]
    if compression == "zstd":
        _flip_a_byte_that_still_decodes(path, entry)
    else:  # a token's low byte, somewhere in the last sample
        data = bytearray(path.read_bytes())
        data[-20] ^= 1
        path.write_bytes(bytes(data))
    result = CliRunner().invoke(train_cli, train_args(out, tmp_path / "run", 2))
    assert one_line_error(result).startswith(
        f"Error: {path.resolve()}: decompressed, its bytes differ from the sha256 in index.json")


def test_a_flipped_byte_in_a_memmap_shard_stops_training(tmp_path, byte_tokenizer):
    out = make_build(tmp_path, byte_tokenizer, fmt="memmap")
    entry = index_entries(out / "train")[shard_of_step_0(out)]["tokens"]
    path = out / "train" / entry["basename"]
    data = bytearray(path.read_bytes())
    data[-20] ^= 1  # a byte token's low byte: still an id below 256
    path.write_bytes(bytes(data))
    result = CliRunner().invoke(train_cli, train_args(out, tmp_path / "run", 2))
    assert one_line_error(result) == (
        f"Error: {path}: its bytes differ from the sha256 in index.json (damaged: flipped bits, "
        "or rewritten by another tool); rebuild it with pack build")


@pytest.mark.slow
def test_a_damaged_shard_on_s3_is_named_by_its_url(tmp_path, byte_tokenizer, s3):
    out = make_build(tmp_path, byte_tokenizer)
    entry = index_entries(out / "train")[2]
    _flip_a_byte_that_still_decodes(out / "train" / entry["zip_data"]["basename"], entry)
    rows = open_build(s3.upload_tree(out, "bad"), tmp_path / "cache", "1gb").train
    with pytest.raises(DataError) as caught:
        for i in range(len(rows)):
            rows.get(i)
    assert str(caught.value).startswith(
        f"{s3.url()}/bad/train/{entry['zip_data']['basename']}: decompressed, its bytes differ "
        "from the sha256 in index.json")
    assert str(caught.value).endswith("rebuild it (and upload it again)")


@pytest.mark.slow
def test_a_damaged_copy_in_the_cache_is_fetched_again(tmp_path, byte_tokenizer):
    """A copy an earlier run left in the cache is checked too; only the copy is damaged, so it
    is fetched again and the run trains on the build's own bytes."""
    out = make_build(tmp_path, byte_tokenizer)
    entry, cache = index_entries(out / "train")[shard_of_step_0(out)], tmp_path / "cache"
    clean = CliRunner().invoke(train_cli, train_args(out, tmp_path / "a", 2, "--cache",
                                                     str(cache)))
    assert clean.exit_code == 0, clean.output
    [copy] = cache.rglob(f"train/{entry['raw_data']['basename']}")
    data = bytearray(copy.read_bytes())
    data[-20] ^= 1  # a token of its last row
    copy.write_bytes(bytes(data))
    again = CliRunner().invoke(train_cli, train_args(out, tmp_path / "b", 2, "--cache",
                                                     str(cache)))
    assert again.exit_code == 0, again.output
    assert losses(tmp_path / "b") == losses(tmp_path / "a")
    assert sha256_file(copy) == entry["raw_data"]["hashes"]["sha256"]


def test_verdicts_are_shared_by_the_workers_and_the_trainer(tmp_path, byte_tokenizer):
    """Once per run, not once per process: after the workers read an epoch, the trainer finds
    every shard checked."""
    out = make_build(tmp_path, byte_tokenizer, fmt="memmap")
    b = open_build(str(out), tmp_path / "cache", "1gb")
    shards = len(index_entries(out / "train"))
    assert b.train.unchecked() == shards
    order = GlobalOrder(len(b.train), global_batch=4, seed=0, fingerprint=b.fingerprint)
    data = StepBatches(order, b.train, rank=0, world=1, batch_size=4, grad_accum=1)
    assert sum(len(x["tokens"]) for x in batches(data, 0, epoch_steps(out), 2)) >= len(b.train)
    assert b.train.unchecked() == 0


@pytest.mark.slow
def test_workers_check_the_shards_of_their_next_items_ahead(tmp_path, byte_tokenizer):
    """While the trainer holds a batch, the workers (blocked on full slots) check ahead: more
    shards are checked than the rows they could have read."""
    import time

    from longpack.training.data.loader import CHECK_AHEAD, PREFETCH

    out = make_build(tmp_path, byte_tokenizer, fmt="memmap", docs=60, rows_per_shard=1)
    b = open_build(str(out), tmp_path / "cache", "1gb")
    workers, batch = 2, 2
    assert b.train.checks.count > workers * (PREFETCH + 1 + CHECK_AHEAD) * batch
    order = GlobalOrder(len(b.train), batch, seed=0, fingerprint=b.fingerprint)
    stream = batches(StepBatches(order, b.train, 0, 1, batch, 1), 0, 10**6, workers)
    next(stream)
    read_at_most = 1 + workers * (PREFETCH + 1) * batch  # row 0 (trainer), filled slots, in hand
    deadline = time.time() + 30
    while b.train.checks.count - b.train.unchecked() <= read_at_most and time.time() < deadline:
        time.sleep(0.05)
    checked = b.train.checks.count - b.train.unchecked()
    stream.close()
    assert checked > read_at_most


def test_a_claim_left_by_a_killed_process_is_taken_over():
    context = multiprocessing.get_context("fork")
    checks, claimed = ShardChecks(2), context.Event()

    def hang(k):  # the child has claimed shard 0 and is checking it
        claimed.set()
        signal.pause()

    child = context.Process(target=checks.ensure, args=(0, hang))
    child.start()
    assert claimed.wait(30)
    os.kill(child.pid, signal.SIGKILL)
    checked = []
    checks.ensure(0, checked.append)  # would wait forever on the dead claim
    child.join()
    assert checked == [0] and checks.unchecked() == 1
    with pytest.raises(DataError, match="^shard 1 is bad$"):
        checks.ensure(1, lambda k: (_ for _ in ()).throw(DataError(f"shard {k} is bad")))
    with pytest.raises(DataError, match="^shard 1 is bad$"):  # the verdict stays, unchecked
        checks.ensure(1, checked.append)
    assert checked == [0]


# -- 4. the cache folder is made when first written to -----------------------------------------

def test_open_build_makes_no_cache_folder_it_does_not_write_to(tmp_path, byte_tokenizer):
    memmap = make_build(tmp_path, byte_tokenizer, fmt="memmap")
    b = open_build(str(memmap), tmp_path / "run" / "shard-cache", "1gb")
    b.train.get(0)
    assert not (tmp_path / "run").exists()  # a memmap build never writes a cache
    mds = make_build(tmp_path, byte_tokenizer)
    with pytest.raises(DataError, match="--seq 24"):
        open_build(str(mds), tmp_path / "run" / "shard-cache", "1gb", seq=24)
    assert not (tmp_path / "run").exists()
    (mds / "val" / "index.json").unlink()  # train opens (and writes its index), then val fails
    with pytest.raises(DataError, match="cannot open"):
        open_build(str(mds), tmp_path / "run" / "shard-cache", "1gb")
    assert not (tmp_path / "run").exists()  # what it made is gone
    (tmp_path / "run").mkdir()
    with pytest.raises(DataError, match="cannot open"):
        open_build(str(mds), tmp_path / "run" / "shard-cache", "1gb")
    assert list((tmp_path / "run").iterdir()) == []  # a folder that was there stays
