"""The processes of a `torchrun` launch: rank, world size, device. One process otherwise.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; the process group uses NCCL on GPUs and gloo on
CPU. Only rank 0 logs and writes checkpoints; every rank reads them.
"""

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Processes:
    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched() -> Processes:
    """This process's place in the launch, from torchrun's environment (nothing is started)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    return Processes(rank, world, device)


@contextlib.contextmanager
def processes(group: bool = False):
    """This process's place while the block runs, its process group started under torchrun
    (or, with `group`, a group of this one process: FSDP shards over a process group even when
    it is one) and ended after the block, unless a caller's group was there already."""
    procs = launched()
    world, device = procs.world, procs.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    owns = (world > 1 or group) and not dist.is_initialized()  # else a caller's group is used
    if owns and world > 1:
        dist.init_process_group(backend)
    elif owns:  # no torchrun: no rendezvous to read
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield procs
    finally:
        if owns and dist.is_initialized():
            dist.destroy_process_group()


def total(value: float, procs: Processes) -> float:
    """The sum of a number over all processes."""
    if procs.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=procs.device)
    dist.all_reduce(t)
    return float(t)


def summed(t: torch.Tensor, procs: Processes) -> torch.Tensor:
    """A tensor summed over all processes, left on the device (nothing is read to the host)."""
    if procs.world == 1:
        return t
    t = t.clone()
    dist.all_reduce(t)
    return t


def smallest(value: int, procs: Processes) -> int:
    """The smallest of an integer over all processes."""
    if procs.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=procs.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


def anyone(flag: bool, procs: Processes) -> bool:
    """True on every process if it is true on one (a signal seen by some ranks only)."""
    if procs.world == 1:
        return flag
    t = torch.tensor([int(flag)], device=procs.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t)


@contextlib.contextmanager
def failing_together(procs: Processes):
    """A block that every process enters but only some work in (rank 0's metrics.jsonl and
    uploads): an error there stops every process, each at the block's end, instead of one
    stopping while the others wait for it in the next collective until a timeout. The failed
    process raises its own error; the others a line saying another one failed. One
    all-reduce per block (none for one process)."""
    from longpack.core import TrainingError

    try:
        yield
    except Exception:
        anyone(True, procs)
        raise
    if anyone(False, procs):
        raise TrainingError("another process of this run failed (its error is in that "
                            "process's output), so this one stops too")


def barrier(procs: Processes) -> None:
    if procs.world > 1:
        dist.barrier()


def whole(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a plain tensor as it is): e.g. the global gradient norm of
    FSDP's sharded gradients."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value
