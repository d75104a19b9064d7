"""Several `train` runs in one torchrun launch (a launch costs ~9 s here, mostly start-up):

    torchrun --standalone --nproc-per-node 2 tests/train_jobs.py JOBS.json

JOBS.json is a list of {"config": TrainConfig's fields, "stop_at": step or null}, or of
{"argv": the `train` command's arguments, "stdout": PATH}; they run in order in the same
processes, over one process group made here (train() uses a group it finds and leaves it). Each
config run's console lines go to OUT/console.txt (rank 0); each command's stdout to
PATH.rank0, PATH.rank1, ... (what each process of `torchrun ... train ARGV` would print, a
refusal's "Error: " line included)."""

import contextlib
import json
import sys
from pathlib import Path

import click
import torch.distributed as dist

from longpack.training.config import TrainConfig
from longpack.training.loop import train
from longpack.training.parallel.distributed import launched


def main(path: str) -> None:
    procs = launched()
    dist.init_process_group("gloo")
    try:
        for job in json.loads(Path(path).read_text()):
            if "argv" in job:
                from longpack.training.cli import train as train_cli

                with open(f"{job['stdout']}.rank{procs.rank}", "w") as out, \
                        contextlib.redirect_stdout(out):
                    try:
                        train_cli.main(args=job["argv"], prog_name="train", standalone_mode=False)
                    except click.ClickException as e:  # what `train` prints before exit 1
                        print(f"Error: {e.format_message()}")
                dist.barrier()
                continue
            cfg = TrainConfig(**job["config"])
            lines = []
            train(cfg, log=lines.append, stop_at=job.get("stop_at"))
            if procs.main:
                (Path(cfg.out) / "console.txt").write_text("\n".join(lines) + "\n")
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
