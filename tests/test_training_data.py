"""The trainer's data side so far: the global row order and batches built from real shards."""

import numpy as np
import pytest
import torch

import archs
from conftest import make_texts, write_jsonl
from pipeline.build import build
from pipeline.config import BuildConfig
from pipeline.shards import open_split
from training.batch import make_batch
from training.sampler import GlobalOrder, batch_hash


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
