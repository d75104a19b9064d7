"""Batches built ahead by worker processes, in the global order, from any step on, and what a
model in archs/ takes of them: input_ids, targets, doc_starts (docs/TRAIN.md, "Rows and
their order").

Item k of StepBatches is micro-batch k % grad_accum of step k // grad_accum for this rank, so
the loader begins at any step without reading what came before. Worker w of W builds items
w, w + W, ... into its own slots of anonymous shared memory, two semaphores counting filled and
free slots: the order is kept without sorting, and a slot goes back when the next batch is
asked for (use a batch before then). torch's DataLoader makes a shared-memory segment per
tensor, which costs more than the whole batch here (tools/bench_loader.py). A worker's typed
error reaches the trainer as the same one line; a dead worker is reported, not waited for.
Each worker checks the shards of its next items in a thread while it waits for a free slot.

A batch: input_ids = row[:-1], targets = row[1:] (-100 in padding), doc_starts the row's
segment starts padded with -1. `collate` (in the worker) keeps the build's dtype in a few numpy
arrays; `model_inputs` (in the trainer) widens them to the model's int64 tensors.
"""

import mmap
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback

import numpy as np
import torch

from longpack.core import LoaderError, LongpackError
from longpack.pipeline import PAD_HASH
from longpack.training.data.mixture import GlobalOrder

PREFETCH = 4  # slots (batches in flight) per worker: --prefetch's default
STOP_BYTES = 8  # each worker's memory starts with an int64: nonzero = stop
CHECK_AHEAD = 2 * PREFETCH  # items of its own a worker's checking thread runs ahead
TYPED, TRACEBACK = b"E", b"T"  # what a slot's error text holds: a pickled error, a traceback


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


def batches(dataset: StepBatches, start_step: int, end_step: int, workers: int,
            prefetch: int = PREFETCH):
    """The micro-batches of steps [start_step, end_step), in order (batch.collate's arrays),
    each worker at most `prefetch` batches ahead of the trainer."""
    items = range(start_step * dataset.grad_accum, end_step * dataset.grad_accum)
    if workers == 0 or len(items) == 0:
        yield from map(dataset.__getitem__, items)
        return
    row, _, _ = dataset.rows.get(0)
    layout = SlotLayout(dataset.batch_size, len(row), row.dtype)
    context = multiprocessing.get_context("fork")  # the workers inherit the open shards
    ready, free, procs, slots, stops = [], [], [], [], []
    try:
        for w in range(workers):
            # Anonymous shared memory: a forked worker writes the very pages the trainer reads.
            # No file in /dev/shm (no size limit of a container's /dev/shm, nothing left behind
            # by a killed trainer), and the pages live as long as an array still uses them.
            memory = mmap.mmap(-1, STOP_BYTES + layout.nbytes * prefetch)
            ready.append(context.Semaphore(0))
            free.append(context.Semaphore(prefetch))
            slots.append([layout.views(memory, p) for p in range(prefetch)])
            stops.append(_stop_flag(memory))
            proc = context.Process(target=_work, daemon=True, name=f"longpack-loader-{w}",
                                   args=(dataset, items[w::workers], memory, layout, ready[w],
                                         free[w], os.getpid(), prefetch))
            proc.start()
            procs.append(proc)
        previous = None
        for i in range(len(items)):
            w = i % workers
            if previous is not None:
                free[previous].release()  # the trainer is done with the last batch: slot back
            while not ready[w].acquire(timeout=1.0):
                if not procs[w].is_alive():
                    if ready[w].acquire(block=False):  # it posted its last batch, then left
                        break
                    raise LoaderError(f"loader worker {w} died (exit code {procs[w].exitcode}) "
                                      "building a batch; see its output above")
                killed = [v for v, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if killed:  # w may be waiting for it (a shard it was checking)
                    raise LoaderError(f"loader worker {killed[0]} died (exit code "
                                      f"{procs[killed[0]].exitcode}); see its output above")
            tokens, meta = slots[w][(i // workers) % prefetch]
            width = int(meta[0])
            if width < 0:
                kind, text = layout.error(meta)
                if kind == TYPED:
                    raise pickle.loads(text) from None
                raise LoaderError(f"loader worker {w} failed on micro-batch {items[i]}:\n"
                                  f"{text.decode(errors='replace')}")
            previous = w
            b = layout.batch
            yield {"tokens": tokens, "pad_from": meta[1:1 + b].copy(),  # copies: a few bytes
                   "doc_starts": meta[1 + b:1 + b + b * width].reshape(b, width).copy()}
    finally:  # also when the trainer stops early
        for w in range(len(procs)):
            stops[w][0] = 1
            for _ in range(prefetch):
                free[w].release()  # wakes a worker waiting for a slot; it sees the stop
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


class SlotLayout:
    """One slot of a worker's shared memory: the tokens [batch, seq] in their stored dtype,
    then int64 [1 + batch + batch * (seq - 1)]: doc_starts' width (negative: an error whose
    text follows), pad_from [batch], doc_starts [batch, width]. Room for the widest possible
    doc_starts (every position a start) costs nothing until written: shared memory pages are
    allocated when touched."""

    def __init__(self, batch: int, seq: int, dtype: np.dtype):
        self.batch, self.seq, self.dtype = batch, seq, np.dtype(dtype)
        self.token_bytes = -(-batch * seq * self.dtype.itemsize // 8) * 8  # int64-aligned
        self.meta_len = 1 + batch + batch * (seq - 1)
        self.nbytes = self.token_bytes + 8 * self.meta_len

    def views(self, buf, slot: int) -> tuple[np.ndarray, np.ndarray]:
        at = STOP_BYTES + slot * self.nbytes
        return (np.ndarray((self.batch, self.seq), self.dtype, buffer=buf, offset=at),
                np.ndarray(self.meta_len, np.int64, buffer=buf, offset=at + self.token_bytes))

    def write(self, meta: np.ndarray, batch: dict) -> None:
        starts = batch["doc_starts"]
        meta[0] = starts.shape[1]
        meta[1:1 + self.batch] = batch["pad_from"]
        meta[1 + self.batch:1 + self.batch + starts.size] = starts.ravel()

    def write_error(self, meta: np.ndarray, error: BaseException) -> None:
        """A typed error pickled when it fits and unpickles (the trainer raises it as it is);
        else the traceback, its end when it is long (the end says most)."""
        room = 8 * (self.meta_len - 1) - 1
        data = None
        if isinstance(error, LongpackError):
            try:
                data = pickle.dumps(error)
                pickle.loads(data)  # an error whose __init__ takes other arguments does not
                data = TYPED + data if len(data) <= room else None
            except Exception:
                data = None
        if data is None:
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            data = TRACEBACK + text.encode()[-room:]
        meta[0] = -1 - len(data)
        meta[1:].view(np.uint8)[:len(data)] = np.frombuffer(data, np.uint8)

    def error(self, meta: np.ndarray) -> tuple[bytes, bytes]:
        """(TYPED or TRACEBACK, what follows) of an error slot."""
        data = meta[1:].view(np.uint8)[:-1 - int(meta[0])].tobytes()
        return data[:1], data[1:]


def _stop_flag(memory) -> np.ndarray:
    return np.ndarray(1, np.int64, buffer=memory)


def _work(dataset: StepBatches, items: range, memory, layout: SlotLayout, ready, free,
          trainer: int, prefetch: int = PREFETCH) -> None:
    slots = [layout.views(memory, p) for p in range(prefetch)]
    stop = _stop_flag(memory)
    j = 0
    position = [0]  # the item this worker is at, read by its checking thread
    if hasattr(dataset.rows, "check"):
        threading.Thread(target=_check_ahead, args=(dataset, items, position, 2 * prefetch),
                         daemon=True).start()
    try:
        # Ctrl+C, a scheduler's SIGTERM and a closed terminal's SIGHUP reach the whole process
        # group: the trainer finishes its step and saves, which needs the workers alive; they
        # exit when the trainer says stop, or when it is gone (a worker of a killed trainer is
        # adopted by another process).
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for j, k in enumerate(items):
            while not free.acquire(timeout=1.0):  # a slot the trainer has handed back
                if os.getppid() != trainer:
                    return
            if stop[0]:
                return
            position[0] = j
            tokens, meta = slots[j % prefetch]
            layout.write(meta, dataset.build(k, out=tokens))  # tokens go straight into the slot
            ready.release()
    except Exception as e:  # into the slot the trainer reads next from this worker
        layout.write_error(slots[j % prefetch][1], e)
        ready.release()
    finally:
        os._exit(0)  # skip the atexit hooks inherited from the trainer


def _check_ahead(dataset: StepBatches, items: range, position: list,
                 ahead: int = CHECK_AHEAD) -> None:
    """Check the shards of the worker's items up to `ahead` beyond the one it is at. A shard
    that fails is left for the worker to meet, when its row is read, with the error."""
    rows = dataset.rows
    for j, k in enumerate(items):
        while j > position[0] + ahead:
            time.sleep(0.005)
        if rows.unchecked() == 0:
            return
        try:
            for r in dataset.rows_of(k):
                rows.check(int(r))
        except Exception:
            return


# -- rows -> a model's batch ------------------------------------------------------------------

CPU = torch.device("cpu")


def collate(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]],
            out: np.ndarray | None = None) -> dict:
    """rows: (tokens [seq], starts, hashes or None) as pipeline/builds/reader.py gives them; the tokens
    are stacked into `out` when given (a loader worker's shared-memory slot)."""
    tokens = np.stack([t for t, _, _ in rows], out=out)
    T = tokens.shape[1] - 1
    pad_from = np.full(len(rows), T, dtype=np.int64)  # first target index that is padding
    starts = []
    for b, (_, s, h) in enumerate(rows):
        if h is not None and len(h) and h[-1] == PAD_HASH:
            pad_from[b] = max(int(s[-1]) - 1, 0)  # predicting padding teaches nothing
        starts.append(s[s < T])
    doc_starts = np.full((len(rows), max(len(s) for s in starts)), -1, dtype=np.int64)
    for b, s in enumerate(starts):
        doc_starts[b, :len(s)] = s
    return {"tokens": tokens, "pad_from": pad_from, "doc_starts": doc_starts}


def model_inputs(batch: dict, device: torch.device = CPU, full: bool = False) -> dict:
    """collate's arrays -> int64 tensors on `device`. The tokens travel in their stored width and
    are widened there (on a GPU: a quarter of the bytes over the bus for uint16 tokens).
    `full`: doc_starts at its full width (`full_width`: a compiled run's)."""
    tokens = batch["tokens"]
    if tokens.dtype.kind == "u" and tokens.dtype.itemsize > 1:
        # torch's unsigned 16/32-bit types have few kernels: move the same bytes as signed
        # integers, then undo the sign extension after widening.
        tokens = tokens.view(tokens.dtype.str.replace("u", "i"))
        mask = (1 << 8 * tokens.dtype.itemsize) - 1
    else:
        mask = None
    moved = [_to(torch.from_numpy(a), device)
             for a in (tokens, batch["pad_from"], batch["doc_starts"])]
    tokens, pad_from, doc_starts = moved
    tokens = tokens.long()
    if mask is not None:
        tokens &= mask
    input_ids, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].clone()
    padding = torch.arange(targets.shape[1], device=device) >= pad_from[:, None]
    targets.masked_fill_(padding, -100)
    if full:  # compiled: the tensor alone, one shape for every batch
        doc_starts = full_width(doc_starts, input_ids.shape[1])
        return {"input_ids": input_ids, "targets": targets, "doc_starts": doc_starts}
    return {"input_ids": input_ids, "targets": targets, "doc_starts": doc_starts,
            "documents": told_documents(doc_starts, batch["doc_starts"], input_ids.shape[1])}


def told_documents(doc_starts: torch.Tensor, host: np.ndarray, seq: int):
    """The batch's documents as the model takes them (archs/documents.py), their spans told
    from the starts the host has: no layer then reads the device for them (issue 57)."""
    from longpack.archs import Documents, spans_of  # in the trainer, not the workers

    rows = host.tolist()
    return Documents(doc_starts, seq, spans=lambda: spans_of(rows, seq))


def documents(batch: dict):
    """What the model takes of a model_inputs batch as its documents: the told Documents, or
    a compiled run's doc_starts tensor."""
    return batch.get("documents", batch["doc_starts"])


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)  # pinned: the copy does not block


def make_batch(rows: list, device: torch.device = CPU, full: bool = False) -> dict:
    return model_inputs(collate(rows), device, full)


def full_width(doc_starts: torch.Tensor, seq: int) -> torch.Tensor:
    """doc_starts [B, K] padded with -1 to [B, seq], one column per position of the row (the
    most documents a row can hold): the same shape for every batch. collate makes it as wide as
    the batch's most documents, which changes from batch to batch, and torch.compile would
    compile the model again at each new width (docs/BENCHMARKS.md, the first GPU). The padding
    changes no number: every model reads doc_starts up to its first -1
    (tests/test_train_compile.py counts the graphs)."""
    return torch.nn.functional.pad(doc_starts, (0, seq - doc_starts.shape[1]), value=-1)
