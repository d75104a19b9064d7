"""The stream of document batches read from the build's input files (inputs.py).

A batch holds up to BATCH_CHARS characters of text from one file, in record order. It is the
unit of tokenization (one worker thread each) and of resumption: after a batch the cursor is
(file index, records read in that file), and a resumed build starts reading right there.
`read_ahead` reads in a thread of its own, so that decoding parquet and parsing JSON overlap
the main thread's packing.
"""

import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from longpack.pipeline.read.catalog import file_format
from longpack.pipeline.read.jsonl import read_jsonl
from longpack.pipeline.read.parquet import read_parquet
from longpack.pipeline.read.records import BROKEN_LINK, ReadPosition, Skip, is_broken_link

BATCH_CHARS = 1 << 20  # ~250k tokens: ~0.1 s of one tokenizer thread
BATCH_DOCS = 4096


@dataclass
class Batch:
    file_index: int
    records: list[tuple[int, object]] = field(default_factory=list)  # (record number, text|Skip)
    chars: int = 0
    end: int = 0  # records of this file read once this batch is done
    file_done: bool = False
    bytes_read: int = 0  # bytes of this file read once this batch is done (for progress)


def read_batches(files, text_field: str, cursor: tuple[int, int],
                 prefetch_next=lambda i: True, before_file=lambda i: None,
                 stop: tuple[int, int] | None = None) -> Iterator[Batch]:
    """Records from `cursor` up to `stop` (a cursor too: (file index, records of that file);
    None: to the end). `before_file(i)` runs before file i (after the first) is opened: the
    build uses it to settle --max-tokens before a hub file is downloaded."""
    first_file, first_record = cursor
    last_file, last_record = stop or (len(files.files), 0)
    for fi in range(first_file, min(last_file + (last_record > 0), len(files.files))):
        if fi != first_file:
            before_file(fi)
        start = first_record if fi == first_file else 0
        limit = last_record if fi == last_file else None  # a task's share ends inside this file
        if limit is not None and start >= limit:
            return
        path = files.path(fi, prefetch_next=prefetch_next(fi))
        batch = Batch(fi, end=start)
        position = ReadPosition()
        for n, value in _records(path, text_field, start, position):
            batch.records.append((n, value))
            batch.end = n
            if isinstance(value, str):
                batch.chars += len(value)
            if limit is not None and n >= limit:
                break
            if batch.chars >= BATCH_CHARS or len(batch.records) >= BATCH_DOCS:
                batch.bytes_read = position.bytes
                yield batch
                batch = Batch(fi, end=n)
        batch.file_done = limit is None
        batch.bytes_read = files.files[fi][1] if limit is None else position.bytes
        yield batch


def _records(path: Path, text_field: str, start: int, position: ReadPosition
             ) -> Iterator[tuple[int, object]]:
    if is_broken_link(path):
        if start == 0:
            yield 1, Skip(BROKEN_LINK, f"a symlink to {os.readlink(path)}, which does not exist")
        return
    reader = read_parquet if file_format(str(path)) == "parquet" else read_jsonl
    yield from reader(path, text_field, start, position)


_END = object()


def read_ahead(batches: Iterator[Batch], depth: int) -> Iterator[Batch]:
    """The same batches, read by a thread up to `depth` batches ahead. An error while reading
    is raised here, at the batch it stopped; closing this generator stops the thread."""
    ready: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def read():
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(_END)
        except BaseException as e:  # handed to the consumer, which raises it
            put(e)
        finally:
            batches.close()

    thread = threading.Thread(target=read, name="read", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
