"""A run of long steps says what they cost before its first (the design card's `train --shards
./mds` on a 32k build on a CPU: an hour a step, and nothing said before it), and a Ctrl+C says
how long the step in hand has left."""

import os
import signal

import pytest
import torch

from longpack import archs
from longpack.training.config import TrainConfig
from longpack.training.loop import long_steps, step_floor, stop_requested

CPU = torch.device("cpu")


def test_a_32k_step_on_a_cpu_is_said_with_a_smaller_first_try():
    model = archs.build("neox-350m", vocab_size=50257, device="meta")  # sizes, no memory
    cfg = TrainConfig(shards="x", model="neox-350m")  # batch 8, the build's --seq
    floor = step_floor(model, 32768, cfg, CPU)
    assert floor > 60  # trillions of FLOPs a step: minutes on any CPU
    lines = long_steps(floor, 100, model, 32768, cfg, CPU)
    assert lines[0].startswith("a step takes at least ") and " here (its FLOPs at this cpu's " \
        "best matmul rate): the 100 steps at least " in lines[0]
    assert lines[1].startswith("for a first try on a CPU, --seq 2048 --batch-size 1 takes at "
                               "least ")
    small = step_floor(model, 2048, TrainConfig(shards="x", model="neox-350m", batch_size=1), CPU)
    assert small < floor / 100


def test_a_short_step_says_nothing_more():
    model = archs.build("neox-tiny", vocab_size=300)
    cfg = TrainConfig(shards="x", batch_size=2)
    assert long_steps(step_floor(model, 65, cfg, CPU), 10, model, 65, cfg, CPU) == []


@pytest.mark.parametrize("left, says", [(125.0, " (about 2m 05s more)"), (None, "")])
def test_ctrl_c_says_how_long_the_step_in_hand_has_left(left, says):
    said = []
    with stop_requested(said.append, lambda: left) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signal == signal.SIGINT
    assert said == [f"stopping after the step in hand{says}, with a checkpoint (Ctrl+C again to "
                    "stop at once)"]
