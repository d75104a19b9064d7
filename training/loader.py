"""Batches built in background worker processes, in the global order, from any step on.

Item k of StepBatches is micro-batch k % grad_accum of step k // grad_accum for this rank. Its
rows come from the global order (sampler.py), so a DataLoader over items [start, end) begins at
any step without reading or skipping what came before: resume is O(1). `workers` processes read
and assemble batches ahead of the model (prefetch_factor each); on a GPU the batches come in
pinned memory so the host-to-device copy does not block.
"""

import signal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from training.batch import make_batch
from training.sampler import GlobalOrder

PREFETCH = 4  # batches each worker keeps ready


class StepBatches(Dataset):
    def __init__(self, order: GlobalOrder, rows, rank: int, world: int, batch_size: int,
                 grad_accum: int):
        self.order, self.rows = order, rows
        self.rank, self.world = rank, world
        self.batch_size, self.grad_accum = batch_size, grad_accum

    def rows_of(self, k: int) -> np.ndarray:
        step, micro = divmod(k, self.grad_accum)
        mine = self.order.rank_rows(step, self.rank, self.world)
        return mine[micro * self.batch_size:(micro + 1) * self.batch_size]

    def __getitem__(self, k: int) -> dict:
        return make_batch([self.rows.get(int(r)) for r in self.rows_of(k)])


def batches(dataset: StepBatches, start_step: int, end_step: int, workers: int,
            pin: bool) -> DataLoader:
    """The micro-batches of steps [start_step, end_step), in order."""
    items = range(start_step * dataset.grad_accum, end_step * dataset.grad_accum)
    return DataLoader(dataset, batch_size=None, sampler=items, num_workers=workers,
                      pin_memory=pin, prefetch_factor=PREFETCH if workers else None,
                      worker_init_fn=_leave_signals_to_the_trainer)


def _leave_signals_to_the_trainer(_worker_id: int) -> None:
    # Ctrl+C (and a scheduler's SIGTERM) reach the whole process group. The trainer finishes its
    # step and saves, which needs the workers alive; they exit when the trainer does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
