"""Evaluation on several processes runs the same number of forwards on each (a sharded
model's forward is a collective: one process short of a batch left the others waiting forever,
issue 52), and its loss is one process's."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from longpack import archs
from longpack.pipeline import PAD_HASH
from longpack.training.evaluate import split_loss


class Rows:
    """n val rows of 9 tokens; those in `padded` hold one document of 3 tokens, then padding."""

    def __init__(self, n: int, padded=()):
        self.rows = [((np.arange(9) * (r + 3)) % 250, np.array([0, 3]),
                      np.array([1, PAD_HASH], dtype=np.uint64)) if r in padded else
                     ((np.arange(9) * (r + 3)) % 250, np.array([0]), None) for r in range(n)]

    def get(self, i):
        return self.rows[i]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return archs.build("neox-tiny", vocab_size=257)


def by_rank(model, rows, n, batch_size, world):
    """[(loss_sum, targets, forwards)] of each rank."""
    out, loss = [], type(model).loss
    for rank in range(world):
        calls = []

        def counted(*args, calls=calls):
            calls.append(args)
            return loss(model, *args)

        model.loss = counted
        try:
            out.append((*split_loss(model, rows, n, batch_size, rank=rank, world=world),
                        len(calls)))
        finally:
            del model.loss
    return out


@pytest.mark.parametrize("n, batch_size, world", [
    (1, 1, 2),  # one row, two processes: the second has no batch of its own
    (5, 2, 2),  # 3 batches on 2 processes
    (7, 1, 3), (2, 4, 3), (0, 2, 2)])
def test_every_rank_runs_as_many_forwards_and_the_sums_are_one_process(model, n, batch_size,
                                                                        world):
    rows = Rows(max(n, 1), padded={1})
    single_sum, single_targets = split_loss(model, rows, n, batch_size)
    assert single_targets == 8 * n - 6 * (n > 1)  # row 1's 2 real targets of 8
    ranks = by_rank(model, rows, n, batch_size, world)
    assert {f for _, _, f in ranks} == {-(-len(range(0, n, batch_size)) // world)}
    assert sum(t for _, t, _ in ranks) == single_targets
    assert sum(s for s, _, _ in ranks) == pytest.approx(single_sum, rel=1e-12)
    assert model.training  # as the module's fixture left it


# -- 2 processes under --fsdp: one launch of tests/train_jobs.py for every case -------------------

LAUNCH_TIMEOUT = 240  # far past a launch's time: a hang is a failure, not a stuck CI job
COMMON = dict(model="neox-tiny", max_steps=2, warmup=1, lr=3e-3, log_every=1, workers=0)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, shards_once):
    """case -> (its build, the rows an evaluation takes, the 2-process --fsdp run's folder, the
    1-process run's records of the same global batch): one val row on 2 processes of batch 1;
    3 val batches (--eval-batches 3) on 2 processes of batch 2; no val rows."""
    from test_train import padded_build

    from conftest import (
        one_thread_as_under_torchrun,
        run_train_jobs,
        small_build,
        write_byte_tokenizer_json,
    )
    from longpack.training.config import TrainConfig
    from longpack.training.loop import train

    tmp = tmp_path_factory.mktemp("eval-ranks")
    out = {}
    tokenizer = str(write_byte_tokenizer_json(tmp / "bytes-tokenizer.json"))
    # name: (build, batch size on each of 2 processes, eval batches)
    cases = {"one-row": (padded_build(tmp, tokenizer), 1, 4),
             "three": (shards_once, 2, 3),
             "empty": (small_build(tmp, tokenizer, "noval", 30, seed=3, val_fraction=0), 2, 4)}
    # rows 8-15 of a val split damaged past its size (shard 1: 8 rows a shard): with batch 8 and
    # 2 eval batches, the second process's rows alone
    damaged = small_build(tmp, tokenizer, "damaged", 120, seed=5, val_fraction=0.5)
    shard = damaged / "val" / "shard.00001.mds.zstd"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:len(data) // 2 + 16] = bytes(16)
    shard.write_bytes(bytes(data))
    damaged_argv = ["--shards", str(damaged), "--out", str(tmp / "damaged-run"), "--fsdp",
                    "--batch-size", "8", "--eval-batches", "2", "--max-steps", "2", "--warmup",
                    "1", "--workers", "0", "--model", "neox-tiny"]
    run_train_jobs(tmp, [{"config": {"shards": [str(shards)], "out": str(tmp / name),
                                     "fsdp": True, "batch_size": batch, "eval_batches": evals,
                                     **COMMON}}
                         for name, (shards, batch, evals) in cases.items()]
                   + [{"argv": damaged_argv, "stdout": str(tmp / "damaged.out")}],
                   timeout=LAUNCH_TIMEOUT)
    out["damaged"] = [(tmp / f"damaged.out.rank{rank}").read_text() for rank in (0, 1)]
    with one_thread_as_under_torchrun():
        for name, (shards, batch, evals) in cases.items():
            # batch 2, accumulating the 2 processes' micro-batches: the same rows each step
            single = train(TrainConfig(shards=str(shards), out=str(tmp / f"one-{name}"),
                                       batch_size=2, grad_accum=batch, eval_batches=evals,
                                       **COMMON), log=lambda m: None)
            out[name] = (shards, evals * batch, tmp / name, single)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", ["one-row", "three"])
def test_fsdp_evaluation_finishes_with_one_process_loss(evaluated, case):
    shards, n, run, single = evaluated[case]
    sharded = records(run)
    assert [r["batch"] for r in sharded] == [r["batch"] for r in single]
    # every real target counted once: none lost to a short process, none added by padding
    assert sharded[-1]["val_targets"] == single[-1]["val_targets"] > 0
    # the same weights give the same loss as one process, whatever the schedule
    assert sharded[-1]["val_loss"] == pytest.approx(one_process_val_loss(run, shards, n),
                                                    rel=1e-6)
    # and the run is one process's (2 steps: rounding, as test_train_fsdp bounds it)
    assert sharded[-1]["val_loss"] == pytest.approx(single[-1]["val_loss"], rel=1e-6)


@pytest.mark.slow
def test_fsdp_evaluation_of_a_build_without_val_rows_finishes(evaluated):
    _, _, run, single = evaluated["empty"]
    sharded = records(run)
    assert len(sharded) == len(single) == COMMON["max_steps"]
    assert not any("val_loss" in r for r in sharded + single)
    assert "no val rows" in (run / "console.txt").read_text()


def one_process_val_loss(run: Path, shards, n: int) -> float:
    """The 2-process run's final weights on the first n val rows (its evaluation's), in this
    process."""
    import tempfile

    from longpack.pipeline.builds.reader import open_build
    from longpack.zoo.runs import load_run

    model = load_run(run).model
    with tempfile.TemporaryDirectory() as cache:
        val = open_build(str(shards), Path(cache), "1gb").val
        loss_sum, targets = split_loss(model, val, min(n, len(val)), 2)
    return loss_sum / targets


@pytest.mark.slow
def test_a_val_row_one_process_cannot_read_stops_every_process(evaluated):
    """Before: the process whose val shard was damaged stopped while the other went on into the
    evaluation's sharded forward, waiting for it forever. Now each reads its rows before any
    forward, and both stop there, each with one line."""
    first, second = (text.strip().splitlines()[-1] for text in evaluated["damaged"])
    assert second.startswith("Error: ") and "shard.00001" in second, second
    assert first.startswith("Error: ") and "another process of this run failed" in first, first
