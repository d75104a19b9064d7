"""DDP under torchrun on 2 CPU processes (gloo): same global batch, same run; elastic resume.

The `train` runs on 2 processes share one torchrun launch (tests/train_jobs.py), made once per
module; the documented torchrun line and the dry run have their own. Slow, all of them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_train import padded_build

from conftest import one_thread_as_under_torchrun, run_train_jobs
from longpack.training.checkpoints import checkpoint
from longpack.training.config import TrainConfig
from longpack.training.loop import train

pytestmark = pytest.mark.slow

STEPS = 6
COMMON = dict(model="neox-tiny", max_steps=STEPS, warmup=2, lr=3e-3, save_every=3, log_every=1,
              eval_every=3, workers=0)


def torchrun_args(shards, out, *extra, batch=2) -> list[str]:
    """`train`'s arguments for 2 processes, batch 2 each: the global batch of 1 process x
    batch 2 x accum 2."""
    return ["--shards", str(shards), "--out", str(out), "--batch-size", str(batch),
            "--max-steps", str(STEPS), "--warmup", "2", "--lr", "3e-3", "--save-every", "3",
            "--eval-every", "3", "--workers", "1", "--log-every", "1", *extra]


def torchrun(shards, out, *extra, batch=2) -> str:
    """`train` in 2 processes, a launch of its own (other modules' 2-process runs): stdout."""
    train_exe = str(Path(sys.executable).parent / "train")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           train_exe, *torchrun_args(shards, out, *extra, batch=batch)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def launched(tmp_path_factory, shards_once):
    """The 2-process `train` runs of this module's tests, in one torchrun launch
    (tests/train_jobs.py: a launch costs ~9 s, mostly start-up), after the single-process runs
    they resume: name -> (its --out, the stdout of both processes)."""
    from conftest import small_build, write_byte_tokenizer_json

    tmp = tmp_path_factory.mktemp("ddp")
    tokenizer = str(write_byte_tokenizer_json(tmp / "bytes-tokenizer.json"))  # shards_once's
    code = small_build(tmp, tokenizer, "code", 30, seed=2)
    mix = dict(shards=(f"web={shards_once}", f"code={code}"), mix="web=0.5,code=0.5",
               mix_stages=("4:code=1",))
    padded = padded_build(tmp, tokenizer)
    # the single-process runs stopped at step 3 that the 2-process runs resume
    train(TrainConfig(shards=str(shards_once), out=str(tmp / "elastic"), batch_size=2,
                      grad_accum=2, **COMMON), log=lambda m: None, stop_at=3)
    train(TrainConfig(out=str(tmp / "elastic-mix"), batch_size=2, grad_accum=2, **mix, **COMMON),
          log=lambda m: None, stop_at=3)
    runs = {"two": torchrun_args(shards_once, tmp / "two"),
            "elastic": torchrun_args(shards_once, tmp / "elastic"),
            "ranks": torchrun_args(padded, tmp / "ranks", batch=1),
            "elastic-mix": torchrun_args(mix["shards"][0], tmp / "elastic-mix", "--shards",
                                         mix["shards"][1], "--mix", mix["mix"], "--mix-stage",
                                         mix["mix_stages"][0])}
    jobs = [{"argv": argv, "stdout": str(tmp / f"{name}.stdout")} for name, argv in runs.items()]
    run_train_jobs(tmp, jobs)
    out = {name: "".join((tmp / f"{name}.stdout.rank{rank}").read_text() for rank in (0, 1))
           for name in runs}
    return {name: (tmp / name, out[name]) for name in runs} | {"padded_build": padded,
                                                              "mix": mix}


def records(run):
    """The run's metrics history, as metrics.jsonl has it (the checkpoint does not)."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_processes_match_one_with_the_same_global_batch(tmp_path, shards_once, launched):
    with one_thread_as_under_torchrun():
        one = train(TrainConfig(shards=str(shards_once), out=str(tmp_path / "one"), batch_size=2,
                                grad_accum=2, **COMMON), log=lambda m: None)
    run, out = launched["two"]
    assert out.count("step 0 (1/6, ") == 1 and out.count("done: step 6") == 1  # rank 0 only
    two = records(run)
    assert [h["batch"] for h in two] == [h["batch"] for h in one]  # the same rows each step
    assert [h["loss"] for h in two] == pytest.approx([h["loss"] for h in one], rel=1e-5)
    assert two[-1]["val_loss"] == pytest.approx(one[-1]["val_loss"], rel=1e-5)
    a, b = (checkpoint.model_state(checkpoint.load_latest(r)) for r in (tmp_path / "one", run))
    # bitwise: the same thread count, and a sum of two gradients has one order
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_on_two_processes_continues_the_one_process_order(tmp_path, shards_once,
                                                                launched):
    straight = train(TrainConfig(shards=str(shards_once), out=str(tmp_path / "a"), batch_size=2,
                                 grad_accum=2, **COMMON), log=lambda m: None)
    # launched: 1 process stopped at step 3, then per-device batch 2, accumulation 1, 2 processes
    run, out = launched["elastic"]
    assert "resumed from" in out and "at step 3" in out
    elastic = records(run)
    assert [h["batch"] for h in elastic] == [h["batch"] for h in straight]
    assert [h["loss"] for h in elastic] == pytest.approx([h["loss"] for h in straight], rel=1e-5)


def test_ranks_weigh_by_their_real_targets(tmp_path, launched):
    # Each step is the build's two train rows, 64 real targets and 4: on 2 processes of one row
    # each, the loss and gradient must still be the mean over the 68, as on 1 process.
    shards = launched["padded_build"]
    with one_thread_as_under_torchrun():
        one = train(TrainConfig(shards=str(shards), out=str(tmp_path / "one"), batch_size=2,
                                **COMMON), log=lambda m: None)
    run, _ = launched["ranks"]  # batch 1 on each of 2 processes
    two = records(run)
    assert [h["targets"] for h in two] == [68] * STEPS
    assert [h["loss"] for h in two] == pytest.approx([h["loss"] for h in one], rel=1e-5)
    assert two[-1]["val_loss"] == pytest.approx(one[-1]["val_loss"], rel=1e-5)
    a, b = (checkpoint.model_state(checkpoint.load_latest(r)) for r in (tmp_path / "one", run))
    # not bitwise: the processes' losses are weighed by 64 and 4 targets of 68
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)


def test_the_documented_torchrun_line_runs(tmp_path, shards):
    # docs/TRAIN.md: torchrun --standalone --nproc-per-node N $(which train) ... --report-to ...
    bin_dir = Path(sys.executable).parent
    r = subprocess.run([str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node", "1",
                        str(bin_dir / "train"), "--shards", str(shards), "--model", "neox-tiny",
                        "--out", str(tmp_path / "r"), "--report-to", "jsonl", "--batch-size",
                        "2", "--max-steps", "2", "--warmup", "1", "--workers", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "done: step 2" in r.stdout and " lr " not in r.stdout  # jsonl only: no step lines
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1]


def test_a_dry_run_under_torchrun_probes_the_ddp_step_together(tmp_path, shards):
    # The probe is the training step: under torchrun it runs DDP over both processes (each
    # process alone would wait forever in the other's all-reduce); the first one speaks.
    train_exe = str(Path(sys.executable).parent / "train")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", train_exe, "--shards", str(shards), "--out",
                        str(tmp_path / "r"), "--batch-size", "2", "--max-steps", "10",
                        "--dry-run"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("nothing is trained") == 1
    assert "256 tokens/step" in r.stdout  # 2 processes x batch 2 x 64 predictions
    assert r.stdout.count("probe       step 3/3: ") == 1 and "ETA" in r.stdout
    assert not (tmp_path / "r").exists()



def test_a_mixture_resumed_on_two_processes_continues_the_one_process_order(tmp_path, launched):
    mix = launched["mix"]
    straight = train(TrainConfig(out=str(tmp_path / "a"), batch_size=2, grad_accum=2, **mix,
                                 **COMMON), log=lambda m: None)
    run, out = launched["elastic-mix"]  # stopped at step 3 by 1 process, resumed by 2
    assert "at step 3" in out
    elastic = records(run)
    assert [h["batch"] for h in elastic] == [h["batch"] for h in straight]
    assert [h["rows/code"] for h in elastic] == [2, 4, 6, 8, 12, 16]
    assert [h["loss"] for h in elastic] == pytest.approx([h["loss"] for h in straight], rel=1e-5)
