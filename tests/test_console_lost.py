"""Losing the console never stops training: `train ... | head -1` (a closed pipe), a stdout on a
full device and a closed terminal (SIGHUP). Before: exit 1 with no message and no checkpoint, an
OSError traceback, and a run killed by the signal."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import signals_as_from_a_shell
from longpack.training.console import Console

TRAIN = "from longpack.training.cli import train; train()"


def test_a_console_that_fails_drops_its_lines_and_the_run_goes_on(capsys):
    said = []

    def say(line):
        said.append(line)
        if len(said) == 2:
            raise BrokenPipeError(32, "Broken pipe")

    console = Console(say)
    for line in ("one", "two", "three"):
        console(line)  # nothing raised
    assert said == ["one", "two"]
    assert "the console's output failed (Broken pipe): training goes on" in capsys.readouterr().err


def train_args(shards, out, steps):
    return ["--shards", str(shards), "--out", str(out), "--model", "neox-tiny",
            "--batch-size", "2", "--max-steps", str(steps), "--warmup", "0", "--log-every", "1",
            "--save-every", "1000", "--eval-every", "1000", "--workers", "0"]


def complete(run, steps):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(steps))
    assert (run / f"step-{steps:08d}" / "COMPLETE").is_file()


@pytest.fixture
def shards(tmp_path, byte_tokenizer):
    from test_train import padded_build

    return padded_build(tmp_path, byte_tokenizer)


@pytest.mark.slow
def test_a_closed_pipe_and_a_full_device_leave_the_run_to_finish(tmp_path, shards):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    head = subprocess.Popen([sys.executable, "-c", TRAIN, *train_args(shards, tmp_path / "a", 6)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    head.stdout.readline()  # what `| head -1` reads, then it is gone
    head.stdout.close()
    err = head.stderr.read().decode()
    assert head.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert "the console's output failed (Broken pipe)" in err
    complete(tmp_path / "a", 6)

    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-c", TRAIN, *train_args(shards, tmp_path / "b", 3)],
                           stdout=full, stderr=subprocess.PIPE, env=env, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err, err
    assert "the console's output failed (No space left on device)" in err
    complete(tmp_path / "b", 3)


@pytest.mark.slow
def test_a_closed_terminal_stops_the_run_with_a_checkpoint_as_ctrl_c_does(tmp_path, shards):
    """SIGHUP to the whole process group (a terminal's hangup), loader workers included."""
    args = train_args(shards, tmp_path / "r", 100000)
    args[args.index("--workers") + 1] = "1"
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=signals_as_from_a_shell)
    try:
        lines = []
        while not any(re.match(r"step +1 ", line) for line in lines):  # training, workers up
            lines.append(proc.stdout.readline())
            assert lines[-1], "".join(lines)
        os.killpg(proc.pid, signal.SIGHUP)
        out = "".join(lines) + proc.stdout.read()
        assert proc.wait(timeout=300) == 128 + signal.SIGHUP, out  # as killed by it: 129
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert re.search(r"stopping after the step in hand \((about \S+|under a second) more\), "
                     r"with a checkpoint",
                     out), out
    assert out.strip().splitlines()[-1].startswith("stopped at step")
    assert "Traceback" not in out, out
    stopped = int(out.split("stopped at step ")[1].split(":")[0])
    assert 1 < stopped < 100000
    assert (tmp_path / "r" / f"step-{stopped:08d}" / "COMPLETE").is_file()
