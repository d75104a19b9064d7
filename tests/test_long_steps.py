"""A run of long steps says what they cost before its first (the design card's `train --shards
./mds` on a 32k build on a CPU: an hour a step, and nothing said before it): an estimate from a
small micro-batch timed before step 0, beside the FLOPs floor; a Ctrl+C says how long the step
in hand has left, and a run it stopped exits 130 with "stopped at step N" last."""

import os
import signal
import time

import pytest
import torch

from longpack import archs
from longpack.training.config import TrainConfig
from longpack.training.loop import stop_requested
from longpack.training.step_time import StepTimes, long_steps, step_floor

CPU = torch.device("cpu")


def test_a_32k_step_on_a_cpu_is_said_with_a_smaller_first_try():
    model = archs.build("neox-350m", vocab_size=50257, device="meta")  # sizes, no memory
    cfg = TrainConfig(shards="x", model="neox-350m")  # batch 8, the build's --seq
    floor = step_floor(model, 32768, cfg, CPU)
    assert floor > 60  # trillions of FLOPs a step: minutes on any CPU
    lines = long_steps(floor, None, 100, model, 32768, cfg, CPU)
    assert lines[0].startswith("a step takes at least ") and " here (its FLOPs at this cpu's " \
        "best matmul rate): the 100 steps at least " in lines[0]
    assert lines[1].startswith("for a first try on a CPU, --seq 2048 --batch-size 1 takes at "
                               "least ")
    small = step_floor(model, 2048, TrainConfig(shards="x", model="neox-350m", batch_size=1), CPU)
    assert small < floor / 100
    # with the probe's estimate (5x the floor here): "about", and the first try scaled alike
    lines = long_steps(floor, 5 * floor, 100, model, 32768, cfg, CPU)
    assert lines[0].startswith("a step takes about ") and "(a small micro-batch timed and " \
        "scaled by FLOPs; at least " in lines[0] and "the 100 steps about " in lines[0]
    assert lines[1].startswith("for a first try on a CPU, --seq 2048 --batch-size 1 takes about ")
    assert " 0s " not in lines[1]  # a first try under a second says so, not "0s"


def test_a_short_step_says_nothing_more():
    model = archs.build("neox-tiny", vocab_size=300)
    cfg = TrainConfig(shards="x", batch_size=2)
    assert long_steps(step_floor(model, 65, cfg, CPU), None, 10, model, 65, cfg, CPU) == []


@pytest.mark.parametrize("times, says", [
    (StepTimes(60.0, about=125.0), " (about 2m 05s more)"),  # the probe's estimate
    (StepTimes(125.0), " (at least 2m 05s more)"),  # the floor alone: a bound
    (StepTimes(0.001), "s into it; no step has been timed yet)"),  # past the floor
    (StepTimes(None), "s into it; no step has been timed yet)"),
    (None, "")])  # before any step
def test_ctrl_c_says_how_long_the_step_in_hand_has_left(times, says):
    """Past its floor a step's time said "about 0s more" where nothing was known."""
    if times is not None:
        times.started()
        time.sleep(0.01)
    said = []
    with stop_requested(said.append, times.left if times else lambda: "") as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signal == signal.SIGINT
    assert len(said) == 1 and said[0].startswith("stopping after the step in hand")
    assert said[0].endswith(f"{says}, with a checkpoint (Ctrl+C again to stop at once)"), said
    if times is not None and times.about:
        times.took(30.0)  # a step measured: its time from now on
        assert times.left() == " (about 30s more)"


def test_a_run_of_long_steps_says_its_estimate_before_step_0_and_trains_as_without(
        tmp_path, shards_once, monkeypatch):
    """The design card's run said nothing before a step of an hour. Here the device is made to
    look slow (a matmul rate of 1 MFLOP/s), so the floor passes PROBE_FROM: the run times its
    probe, says the estimate before step 0, and its weights are those of a run without it."""
    from longpack.training.checkpoints import checkpoint
    from longpack.training.loop import train

    def run(out, said):
        cfg = TrainConfig(shards=str(shards_once), model="neox-tiny", out=str(tmp_path / out),
                          batch_size=2, max_steps=2, save_every=2, eval_every=100, workers=0)
        train(cfg, log=said.append)
        return checkpoint.model_state(checkpoint.load_latest(tmp_path / out))

    plain = run("plain", [])
    monkeypatch.setattr("longpack.training.step_time.matmul_rate", lambda device: 1e6)
    said = []
    probed = run("probed", said)
    first = next(i for i, line in enumerate(said) if line.startswith("step 0 "))
    about = [line for line in said[:first] if line.startswith("a step takes about ")]
    assert len(about) == 1 and "(a small micro-batch timed and scaled by FLOPs; at least " \
        in about[0] and "the 2 steps about " in about[0], said
    assert all(torch.equal(plain[k], probed[k]) for k in plain)


@pytest.mark.slow
def test_ctrl_c_stops_a_run_with_130_and_stopped_at_step_last(tmp_path, shards_once):
    import subprocess
    import sys
    from pathlib import Path

    installed = Path(sys.executable).parent / "train"
    run = ([str(installed)] if installed.exists()
           else [sys.executable, "-c", "from longpack.training.cli import train; train()"])
    proc = subprocess.Popen([*run, "--shards", str(shards_once), "--model", "neox-tiny",
                             "--batch-size", "2", "--max-steps", "100000", "--log-every", "1",
                             "--workers", "0", "--out", str(tmp_path / "r")],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    metrics = tmp_path / "r" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl+C: the whole process group
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, out
    assert out.strip().splitlines()[-1].startswith("stopped at step ") and "re-run" in out
