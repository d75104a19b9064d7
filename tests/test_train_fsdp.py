"""train --fsdp on 2 CPU processes (gloo): every family trains as one process does; sharded
checkpoints resume bitwise at the same count and continue the same rows under another count,
with or without --fsdp; accumulation, clipping and hybrid sharding; zoo reads them.

All the 2-process runs share one torchrun launch (tests/train_jobs.py), made once per module."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_checkpoint_safety import plant_bytes_items

from conftest import one_thread_as_under_torchrun, run_train_jobs
from longpack.training.checkpoints import checkpoint
from longpack.training.config import TrainConfig
from longpack.training.loop import train
from longpack.zoo.runs import load_run

pytestmark = pytest.mark.slow

FAMILIES = ["neox-tiny", "moe-tiny", "hybrid-tiny", "mamba-tiny", "resonance-tiny"]
# MoE with multi-token prediction and Mixture-of-Depths (depth-routed blocks are FSDP units too)
MTP_MOD = ("n_pred_tokens=2", "mod_capacity=0.5", "n_layers=4")
STEPS = 6
# 1 process x batch 2 x accumulation 2 = 2 processes x batch 2: the same global batch, and
# each process's micro-batch is one of the single process's (MoE's balance terms see the same
# rows)
COMMON = dict(max_steps=STEPS, warmup=2, lr=3e-3, save_every=3, log_every=1, eval_every=3,
              workers=0)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def one(shards, out, **kw) -> TrainConfig:
    return TrainConfig(**{"shards": str(shards), "out": str(out), "batch_size": 2,
                          "grad_accum": 2, **COMMON, **kw})


def two(shards, out, **kw) -> dict:
    """A 2-process job's config (train_jobs.py): batch 2 each."""
    return {"shards": [str(shards)], "out": str(out), "batch_size": 2, **COMMON, **kw}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shards_once):
    """The 2-process runs, in one launch; the single-process runs they are compared with."""
    tmp = tmp_path_factory.mktemp("fsdp")
    shards = shards_once
    quiet = {"log": lambda m: None}
    # a single-process run stopped at step 3 (a whole checkpoint) for the 2-process --fsdp run
    # to resume
    train(one(shards, tmp / "1to2", model="neox-tiny"), stop_at=3, **quiet)
    # a sharded checkpoint with a planted bytes item, for 2 processes to resume (issue 41)
    train(one(shards, tmp / "planted", model="neox-tiny", fsdp=True), stop_at=3, **quiet)
    plant_bytes_items(tmp / "planted" / "step-00000003", tmp / "planted-marker")
    planted = ["--shards", str(shards), "--out", str(tmp / "planted"), "--fsdp", "--batch-size",
               "2", "--max-steps", str(STEPS), "--warmup", "2", "--workers", "0"]
    jobs = [{"config": two(shards, tmp / f"fsdp-{m}", model=m, fsdp=True)} for m in FAMILIES]
    jobs += [
        {"argv": planted, "stdout": str(tmp / "planted.out")},
        {"config": two(shards, tmp / "fsdp-mtp-mod", model="moe-tiny", model_args=MTP_MOD,
                       fsdp=True)},
        {"config": two(shards, tmp / "stopped", model="neox-tiny", fsdp=True), "stop_at": 3},
        {"config": two(shards, tmp / "stopped", model="neox-tiny", fsdp=True)},
        {"config": two(shards, tmp / "2to1", model="neox-tiny", fsdp=True), "stop_at": 3},
        {"config": two(shards, tmp / "1to2", model="neox-tiny", fsdp=True)},
        {"config": two(shards, tmp / "accum", model="neox-tiny", fsdp=True, batch_size=1,
                       grad_accum=2, clip=0.05)},
        {"config": two(shards, tmp / "hybrid", model="neox-tiny", fsdp=True,
                       fsdp_replicas=2)},
        {"config": two(shards, tmp / "bf16", model="moe-tiny", fsdp=True, precision="bf16",
                       activation_checkpointing=True, optimizer="muon")},
    ]
    run_train_jobs(tmp, jobs)
    with one_thread_as_under_torchrun():
        singles = {m: train(one(shards, tmp / f"one-{m}", model=m), **quiet) for m in FAMILIES}
        singles["mtp-mod"] = train(one(shards, tmp / "one-mtp-mod", model="moe-tiny",
                                       model_args=MTP_MOD), **quiet)
    return tmp, shards, singles


def test_two_processes_never_run_a_planted_checkpoint_item(runs):
    tmp, _, _ = runs
    assert not (tmp / "planted-marker").exists()
    for rank in (0, 1):
        line = (tmp / f"planted.out.rank{rank}").read_text().strip().splitlines()[-1]
        assert line.startswith("Error: ") and "holds more than data" in line, line
        assert "nothing in it was run" in line


@pytest.mark.parametrize("model", FAMILIES)
def test_every_family_under_fsdp_trains_as_one_process(runs, model):
    tmp, _, singles = runs
    sharded, single = records(tmp / f"fsdp-{model}"), singles[model]
    assert [r["batch"] for r in sharded] == [r["batch"] for r in single]
    assert [r["loss"] for r in sharded] == pytest.approx([r["loss"] for r in single], rel=1e-5)
    assert sharded[-1]["val_loss"] == pytest.approx(single[-1]["val_loss"], rel=1e-5)
    # a sharded checkpoint: each process's part, COMPLETE listing every file
    step = tmp / f"fsdp-{model}" / "step-00000006"
    assert sorted(p.name for p in step.iterdir()) == [
        ".metadata", "COMPLETE", "__0_0.distcp", "__1_0.distcp", "state.pt"]
    assert "model" not in torch.load(step / "state.pt", weights_only=False)
    # zoo reads it: the weights equal the single process's up to the order of FSDP's sums
    # (6 AdamW steps at lr 3e-3, one thread in each process: 2e-6 at most, gpt-neox's qkv bias)
    ours, theirs = load_run(tmp / f"fsdp-{model}").model, load_run(tmp / f"one-{model}").model
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=2e-5) for k in a)


def test_moe_with_mtp_and_mod_under_fsdp_trains_as_one_process(runs):
    tmp, _, singles = runs
    sharded, single = records(tmp / "fsdp-mtp-mod"), singles["mtp-mod"]
    assert [r["loss"] for r in sharded] == pytest.approx([r["loss"] for r in single], rel=1e-5)


def test_a_sharded_checkpoint_resumes_bitwise_on_the_same_processes(runs):
    tmp, _, _ = runs
    straight, resumed = records(tmp / "fsdp-neox-tiny"), records(tmp / "stopped")
    assert "resumed from" in (tmp / "stopped" / "console.txt").read_text()
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]
    assert [r["batch"] for r in resumed] == [r["batch"] for r in straight]
    a = load_run(tmp / "fsdp-neox-tiny").model.state_dict()
    b = load_run(tmp / "stopped").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_two_processes_to_one_and_one_to_two_continue_the_same_rows(runs):
    tmp, shards, singles = runs
    straight = singles["neox-tiny"]
    # 2 -> 1: a sharded checkpoint of --fsdp resumed by one process without --fsdp
    lines = []
    train(one(shards, tmp / "2to1", model="neox-tiny"), log=lines.append)
    assert f"resumed from {tmp / '2to1' / 'step-00000003'} at step 3" in lines
    for run in ("2to1", "1to2"):  # 1 -> 2: a whole checkpoint resumed by 2 --fsdp processes
        got = records(tmp / run)
        assert [r["batch"] for r in got] == [r["batch"] for r in straight]
        assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in straight],
                                                         rel=1e-4)
    assert "resumed from" in (tmp / "1to2" / "console.txt").read_text()


def test_accumulation_clipping_and_hybrid_sharding(runs):
    tmp, shards, singles = runs
    with one_thread_as_under_torchrun():
        clipped = train(one(shards, tmp / "one-clipped", model="neox-tiny", clip=0.05),
                        log=lambda m: None)
    accum = records(tmp / "accum")  # 2 processes x batch 1 x accumulation 2, clipped
    assert [r["loss"] for r in accum] == pytest.approx([r["loss"] for r in clipped], rel=1e-5)
    assert [r["grad_norm"] for r in accum] == pytest.approx([r["grad_norm"] for r in clipped],
                                                            rel=1e-4)
    assert all(r["grad_norm"] > 0.05 for r in clipped)  # the clipping did act
    hybrid = records(tmp / "hybrid")  # a (2 replicas, 1 shard) mesh: DDP's numbers
    assert [r["loss"] for r in hybrid] == pytest.approx(
        [r["loss"] for r in singles["neox-tiny"]], rel=1e-5)
    # bf16 compute, fp32 master weights, checkpointed blocks, Muon on the sharded matrices
    bf16 = records(tmp / "bf16")
    assert len(bf16) == STEPS and bf16[-1]["loss"] < bf16[0]["loss"]
    state = checkpoint.load_latest(tmp / "bf16")[0]
    assert state["model_config"]["checkpointing"] is True


def test_muon_on_sharded_parameters_is_muon_on_whole_ones():
    """Each matrix gathered for its Newton-Schulz update: given the same gradients, the sharded
    parameters after 3 steps equal the whole ones exactly (MoE: its expert stacks too)."""
    script = Path(__file__).with_name("muon_sharded.py")
    presets = ("neox-tiny", "moe-tiny")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(script), *presets], capture_output=True,
                       text=True, timeout=300, cwd=Path(__file__).parents[1])  # one launch
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    for preset in presets:
        assert f"{preset} max diff 0.0" in r.stdout, r.stdout


def test_a_two_process_fsdp_job_on_slurm_trains_and_resumes(slurm, tmp_path, shards_once):
    """docs/TRAIN.md's sbatch script (srun + torchrun), on the real one-node Slurm: a 2-process
    --fsdp run of 4 steps, then the same job with 6 resumes from its sharded checkpoint."""
    import socket

    with socket.socket() as s:  # a free port for torchrun's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    train_exe = Path(sys.executable).parent / "train"
    run = tmp_path / "run"

    def job(steps: int) -> str:
        script = tmp_path / f"train-{steps}.sbatch"
        script.write_text(
            "#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=1\n"
            f"#SBATCH --output={tmp_path}/slurm-{steps}.out\n"
            f"srun {sys.executable} -m torch.distributed.run --nnodes 1 --nproc-per-node 2 "
            f"--rdzv-id $SLURM_JOB_ID --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} "
            f"{train_exe} --shards {shards_once} --out {run} --fsdp --batch-size 2 "
            f"--max-steps {steps} --warmup 1 --save-every 2 --workers 0 --log-every 1\n")
        r = subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True,
                           timeout=300)
        out = (tmp_path / f"slurm-{steps}.out").read_text()
        assert r.returncode == 0, r.stdout + r.stderr + out
        return out

    assert "done: step 4" in job(4)
    assert sorted(p.name for p in (run / "step-00000004").iterdir()) == [
        ".metadata", "COMPLETE", "__0_0.distcp", "__1_0.distcp", "state.pt"]
    out = job(6)
    assert f"resumed from {run / 'step-00000004'} at step 4" in out and "done: step 6" in out
    assert [r["step"] for r in records(run)] == list(range(6))


def test_fsdp_with_compile_trains_as_without(tmp_path, shards_once):
    """--compile over the sharded model (one process: a process group of one)."""
    plain = train(one(shards_once, tmp_path / "plain", model="neox-tiny", max_steps=2,
                      fsdp=True), log=lambda m: None)
    compiled = train(one(shards_once, tmp_path / "compiled", model="neox-tiny", max_steps=2,
                         fsdp=True, compile=True), log=lambda m: None)
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in plain], rel=1e-4)
