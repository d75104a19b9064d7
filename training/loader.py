"""Batches built ahead by worker processes, in the global order, from any step on.

Item k of StepBatches is micro-batch k % grad_accum of step k // grad_accum for this rank. Its
rows come from the global order (sampler.py), so the loader begins at any step without reading
or skipping what came before: resume is O(1).

With `workers` > 0, worker w builds items w, w + W, w + 2W, ... (W = workers) into its own
PREFETCH slots of shared memory, made once; the trainer takes them in turn, so the order is
kept without sorting. Only a slot number and the small arrays (padding, document starts) go
through a pipe: the tokens are written once, by the worker, and read in place. A slot is handed
back when the trainer asks for the next batch, so a batch must be used (moved to the device or
copied) before then. On the same shards torch's DataLoader, which makes a new shared-memory
segment per tensor, delivered 4-33x slower, and a thread pool, whose threads share one
interpreter lock, 1.7x slower (tools/bench_loader.py, docs/BENCHMARKS.md).
"""

import multiprocessing
import os
import signal
import traceback
from multiprocessing import shared_memory

import numpy as np

from pipeline.errors import LongpackError
from training.batch import collate
from training.sampler import GlobalOrder

PREFETCH = 4  # slots (batches in flight) per worker


class LoaderError(LongpackError):
    pass


class StepBatches:
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
        return self.build(k)

    def build(self, k: int, out: np.ndarray | None = None) -> dict:
        """Micro-batch k; its tokens written into `out` when given ([batch, seq] of the dtype)."""
        return collate([self.rows.get(int(r)) for r in self.rows_of(k)], out)


def batches(dataset: StepBatches, start_step: int, end_step: int, workers: int):
    """The micro-batches of steps [start_step, end_step), in order (batch.collate's arrays)."""
    items = range(start_step * dataset.grad_accum, end_step * dataset.grad_accum)
    if workers == 0 or len(items) == 0:
        yield from map(dataset.__getitem__, items)
        return
    row, _, _ = dataset.rows.get(0)
    shape, dtype = (dataset.batch_size, len(row)), row.dtype  # every batch's tokens
    slot_bytes = dataset.batch_size * row.nbytes
    context = multiprocessing.get_context("fork")  # the workers inherit the open shards
    memory, pipes, procs = [], [], []
    try:
        for w in range(workers):
            shm = shared_memory.SharedMemory(create=True, size=slot_bytes * PREFETCH)
            memory.append(shm)
            ours, theirs = context.Pipe()
            proc = context.Process(target=_work, daemon=True, name=f"longpack-loader-{w}",
                                   args=(dataset, items[w::workers], shm, shape, dtype,
                                         slot_bytes, theirs, [*pipes, ours]))
            proc.start()
            theirs.close()
            pipes.append(ours)
            procs.append(proc)
        previous = None
        for i in range(len(items)):
            w = i % workers
            if previous is not None:
                try:  # the trainer is done with the last batch: its slot goes back first
                    pipes[previous[0]].send_bytes(previous[1].to_bytes(8, "little"))
                except OSError:
                    pass  # that worker has built all its batches and left
            try:
                message = pipes[w].recv_bytes()
            except (EOFError, OSError):  # OSError: killed with slot numbers still unread
                raise LoaderError(f"loader worker {w} died (exit code {procs[w].exitcode}) "
                                  "building a batch; see its output above") from None
            slot, width = np.frombuffer(message, np.int64, 2)
            if slot < 0:
                raise LoaderError(f"loader worker {w} failed on micro-batch {items[i]}:\n"
                                  f"{message[16:].decode()}")
            small = np.frombuffer(message, np.int64, offset=16).copy()  # writable, as torch wants
            view = np.ndarray(shape, dtype, buffer=memory[w].buf, offset=int(slot) * slot_bytes)
            previous = (w, int(slot))
            yield {"tokens": view, "pad_from": small[:shape[0]],
                   "doc_starts": small[shape[0]:].reshape(shape[0], width)}
            del view
    finally:  # also when the trainer stops early
        for pipe in pipes:
            pipe.close()  # a worker waiting on its pipe sees EOF and exits
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        for shm in memory:
            shm.unlink()
            try:
                shm.close()
            except BufferError:  # the caller still holds the last batch: unmapped when freed
                pass


def _work(dataset: StepBatches, items: range, shm, shape, dtype, slot_bytes: int, pipe,
          others: list) -> None:
    for other in others:  # the trainer's pipe ends, copied by fork: one left open here would
        other.close()     # keep a worker from seeing EOF when the trainer closes its end
    # Ctrl+C and a scheduler's SIGTERM reach the whole process group: the trainer finishes its
    # step and saves, which needs the workers alive; they exit when the trainer closes the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    slots = [np.ndarray(shape, dtype, buffer=shm.buf, offset=i * slot_bytes)
             for i in range(PREFETCH)]
    free = list(range(PREFETCH))
    try:
        for k in items:
            if not free:  # wait until the trainer hands a slot back
                free.append(int.from_bytes(pipe.recv_bytes(), "little"))
            slot = free.pop()
            batch = dataset.build(k, out=slots[slot])  # the tokens go straight into the slot
            # The rest as raw int64 bytes (pickling costs more than building small arrays):
            # slot, doc_starts width, pad_from [batch], doc_starts [batch, width].
            header = np.array([slot, batch["doc_starts"].shape[1]], np.int64)
            pipe.send_bytes(b"".join(a.astype(np.int64, copy=False).tobytes() for a in (
                header, batch["pad_from"], batch["doc_starts"])))
    except (EOFError, BrokenPipeError, OSError):
        pass  # the trainer has stopped
    except Exception:
        try:
            pipe.send_bytes(np.array([-1, 0], np.int64).tobytes()
                            + traceback.format_exc().encode())
        except (BrokenPipeError, OSError):
            pass
    finally:
        os._exit(0)  # skip the atexit hooks inherited from the trainer
