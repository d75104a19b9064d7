"""`pack build`: read -> tokenize -> split -> pack -> write, resumably; a build composed of
parts, as datatrove composes its steps.

    read_batches (read/batches.py)        a reader thread: batches of texts from one file, in
                                          order, over the build's share of the inputs
      -> encode_batch (tokenize/encode.py) worker threads: hash, split, tokens + EOS (--workers)
      -> Output.emit                      main thread: the documents of each split, in order, to
                                          the output the caller passed in:
           ShardOutput (pack/output.py)      rows of exactly --seq tokens (pack/packer.py) and
                                             shards (pack/writers.py: a writer thread) in OUT
           UploadOutput (store/remote_build.py)  a ShardOutput staged for an --out URL, its
                                             files going up as they finish
           TaskOutput (distribute/task_build.py)  one task's documents, for the merge
      -> checkpoint                       every CHECKPOINT_SECONDS and when the output asks: the
                                          BuildState (build_state.py), which the output saves
                                          atomically with where it stands

    with Build(cfg, progress=Progress()) as build:   # inputs, tokenizer, fingerprint, share
        manifest = build.run(ShardOutput(cfg))       # or UploadOutput(...), TaskOutput(...)

Batches are submitted in order and consumed in order, at most 2 x workers ahead, so memory is
bounded and the output is the same for any worker count. Re-running the same command resumes
from the last checkpoint and produces the same bytes as an uninterrupted build. No part
subclasses another or is changed from outside: what differs between a build, a task and an
upload is the Output passed in (and a task's share of the inputs).
"""

import contextlib
import json
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

from longpack.core import InputError, LongpackError, TokenizerError, writing
from longpack.pipeline import manifest as manifest_mod
from longpack.pipeline.build_state import BuildState
from longpack.pipeline.config import SPLITS, BuildConfig
from longpack.pipeline.distribute.plan import share_of
from longpack.pipeline.progress import Progress
from longpack.pipeline.read.batches import read_ahead, read_batches
from longpack.pipeline.read.catalog import file_format, get_dataset
from longpack.pipeline.read.inputs import open_inputs
from longpack.pipeline.read.records import BLANK_LINE, Skip
from longpack.pipeline.tokenize.encode import EngineMismatch, encode_batch
from longpack.pipeline.tokenize.split import Splitter
from longpack.pipeline.tokenize.tokenizer import load_tokenizer

CHECKPOINT_SECONDS = 10.0


def build(cfg: BuildConfig, hub_client=None, show_progress: bool | None = None) -> dict:
    """A single-machine build of OUT (a local folder); its manifest."""
    from longpack.pipeline.pack.output import ShardOutput

    with Build(cfg, hub_client, Progress(enabled=show_progress)) as b:
        return b.run(ShardOutput(cfg))


class Output(Protocol):
    """Where a build's documents go: OUT's shards (pack/output.py: ShardOutput), their staged
    copy going up to an --out URL (store/remote_build.py: UploadOutput) or one task's
    documents (distribute/task_build.py: TaskOutput). Build calls, in order: `held(build)` (the
    output held for the whole run, its lock; it yields the record of an output finished
    already, or the BuildState to start or resume from; it reads the build's fingerprint and
    share), `open`, then `emit` per split and batch, `checkpoint` every CHECKPOINT_SECONDS
    and when it `wants_checkpoint`, `finish` (the last rows; each split's index),
    `stop_writing`, `complete` (the record written last: manifest.json or done.json);
    `abandon` after a failure, `close` at the end."""

    skip_path: Path  # skipped.jsonl
    already_complete: bool  # once held: it held this very build, finished; nothing is written

    def held(self, build: "Build") -> contextlib.AbstractContextManager[dict | BuildState]: ...
    def open(self, state: BuildState, dtype: np.dtype) -> None: ...
    def emit(self, split: str, tokens: np.ndarray, lengths: np.ndarray,
             hashes: np.ndarray) -> None: ...
    def checkpoint(self, state: BuildState) -> None: ...
    def wants_checkpoint(self) -> bool: ...
    def finish(self, counts: dict, eos_id: int) -> dict: ...
    def stop_writing(self) -> None: ...
    def complete(self, build: "Build", indexes: dict, timings: dict) -> dict: ...
    def abandon(self) -> None: ...
    def close(self) -> None: ...


class Build:
    """One run of `pack build` over the inputs (or one task's share of them: `task`): the
    reader, the tokenizer and the split in __init__, then `run(output)`. Close it (a context
    manager) to close the input files. `progress` is told how far it is (progress.py: a line
    on a terminal, the default, or a task's reports to its launcher)."""

    def __init__(self, cfg: BuildConfig, hub_client=None, progress: Progress | None = None,
                 task: int | None = None):
        self.t_start, self.t0 = time.time(), time.monotonic()
        self.cfg, self.progress = cfg, progress or Progress()
        self.dataset = get_dataset(cfg.dataset)
        self.field = cfg.text_field or self.dataset.text_field
        # The tokenizer and the inputs are each tried, whatever became of the other: offline,
        # both may fail, and the user hears of both at once rather than one run at a time.
        try:
            self.tok, tok_error = load_tokenizer(cfg.tokenizer, bos=cfg.bos,
                                                 engine=cfg.tokenizer_engine), None
        except LongpackError as e:
            tok_error = e
        try:
            self.files, self.inputs = open_inputs(cfg, self.dataset, hub_client)
        except LongpackError as e:
            if tok_error is None:
                raise
            raise type(tok_error)(f"{tok_error}; and {e}") from None
        if tok_error is not None:
            self.files.close()
            raise tok_error
        if self.tok.kind == "huggingface":
            # tokenizers parallelises each batch on rayon's global pool, sized from this variable
            # when first used; without it the pool takes every core whatever --workers says.
            os.environ.setdefault("RAYON_NUM_THREADS", str(cfg.workers))
        try:
            self.share = share_of(self.files, cfg.tasks, self.field, task)
        except BaseException:
            self.files.close()
            raise
        tokenizer_id = {k: v for k, v in self.tok.identity().items() if k != "source"}
        self.fingerprint = {"settings": cfg.output_settings(), "tokenizer": tokenizer_id,
                            "inputs": self.inputs, "format_version": manifest_mod.FORMAT_VERSION}
        if cfg.packing == "best-fit":  # its window and rule: another longpack's are another build
            from longpack.pipeline.pack.best_fit import describe

            self.fingerprint["packing"] = describe(cfg.seq)
        self.splitter = Splitter(cfg.val_fraction, cfg.seed)
        # set by run: the output, its state, this run's clock and counters
        self.output: Output | None = None
        self.state: BuildState | None = None
        self.resumed = False
        self.tokens_at_start, self.bytes_done = 0, 0
        self.t_first = self.t_last = None
        self.last_checkpoint = 0.0
        self.skip_path, self.skip_log = None, None
        self.inflight = deque()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.files.close()

    def run(self, output: Output) -> dict:
        """Build (or resume, or find complete) the output; returns its record (manifest)."""
        self.output = output
        with output.held(self) as found:
            if isinstance(found, dict):  # nothing to do: the finished output's record
                return found
            try:
                return self._run(found)
            finally:
                output.close()

    def _run(self, state: BuildState) -> dict:
        self.state, self.resumed = state, state.runs > 0
        state.runs += 1
        self.tokens_at_start = state.counts["tokens"]
        try:
            self.output.open(state, self.tok.dtype)
            self._open_skip_log(self.output.skip_path)
            if not state.input_done:
                self._read_all()
            indexes = self._finish()
            with writing(self.skip_path):
                self.skip_log.close()
        except BaseException:
            self._abandon()
            raise
        finally:
            self.output.stop_writing()
        return self._write_manifest(indexes)

    # -- the skip log and checkpoints --------------------------------------------------------
    def _open_skip_log(self, path: Path):
        self.skip_path = path
        with writing(path):
            self.skip_log = open(path, "ab")
            self.skip_log.truncate(self.state.skip_log_bytes)
        self.last_checkpoint = time.monotonic()

    def _checkpoint(self):
        state = self.state
        with writing(self.skip_path):
            self.skip_log.flush()
        state.skip_log_bytes = self.skip_log.tell()
        self.output.checkpoint(state)  # waits for shards in flight
        self.last_checkpoint = time.monotonic()

    def _abandon(self) -> None:
        """After a failure, close every output file quietly: a full disk would refuse their
        last buffers again, and a resume cuts each file back to the checkpoint anyway."""
        if self.skip_log is not None:
            with contextlib.suppress(OSError):
                self.skip_log.close()
        self.output.abandon()

    # -- the loop ----------------------------------------------------------------------------
    def _read_all(self):
        cfg, c = self.cfg, self.state.counts
        self.bytes_done = self._bytes_before(self.state.cursor[0])
        self.progress.begin(self.share.bytes, cfg.max_tokens,
                            (c["documents"], c["tokens"], self.bytes_done))
        pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="tokenize")
        if cfg.max_tokens and not cfg.inputs:  # settling packs on this thread between files
            batches = read_batches(self.files, self.field, self.state.cursor,
                                   self._prefetch_next, self._settle_before_download)
        else:
            batches = read_ahead(read_batches(self.files, self.field, self.state.cursor,
                                              self._prefetch_next, stop=self.share.stop),
                                 2 * cfg.workers)
        try:
            exhausted = False
            while True:
                while not exhausted and len(self.inflight) < 2 * cfg.workers:
                    batch = next(batches, None)
                    if batch is None:
                        exhausted = True
                        break
                    self.inflight.append((batch, pool.submit(
                        encode_batch, batch.records, self.tok, self.splitter, self.tok.bos_id)))
                if not self.inflight or self._consume_next():
                    break
        except _Stop:
            pass
        finally:
            batches.close()
            for _, future in self.inflight:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            self.progress.close()
        self.t_last = time.monotonic()
        self.state.input_done = True
        self._checkpoint()

    def _consume_next(self) -> bool:
        batch, future = self.inflight.popleft()
        if self.t_first is None:
            self.t_first = time.monotonic()
        try:
            encoded = future.result()
        except EngineMismatch as e:
            raise TokenizerError(f"{self.files.uri(batch.file_index)}, {e}") from None
        stop = self._consume(batch, encoded)
        # Progress moves within a file too (one big file would otherwise show none until its end).
        in_file = 0 if batch.file_done else batch.bytes_read
        c = self.state.counts
        self.progress.update(c["documents"], c["tokens"], self.bytes_done + in_file)
        if not stop and (time.monotonic() - self.last_checkpoint > CHECKPOINT_SECONDS
                         or self.output.wants_checkpoint()):
            self._checkpoint()
        return stop

    def _consume(self, batch, encoded) -> bool:
        """Pack one encoded batch; True once --max-tokens / --limit-docs is reached."""
        cfg, c = self.cfg, self.state.counts
        taken = [0, 0]  # documents of each split taken from this batch
        stop = False
        for (n, _), doc in zip(batch.records, encoded.docs):
            if isinstance(doc, Skip):
                c["records_read"] += doc.records
                self._skip(batch.file_index, n, doc)
                continue
            c["records_read"] += 1
            split, length = doc
            taken[split] += 1
            c["documents"] += 1
            c["tokens"] += length
            if (cfg.max_tokens and c["tokens"] >= cfg.max_tokens
                    or cfg.limit_docs and c["documents"] >= cfg.limit_docs):
                stop = True
                break
        for i, s in enumerate(SPLITS):
            if not taken[i]:
                continue
            hashes, text_bytes = encoded.hashes[i][: taken[i]], encoded.text_bytes[i][: taken[i]]
            lengths = np.diff(encoded.bounds[i][: taken[i] + 1])
            tokens = encoded.tokens[i][: int(encoded.bounds[i][taken[i]])]
            cs = c["splits"][s]
            cs["documents"] += taken[i]
            cs["tokens"] += len(tokens)
            cs["text_bytes"] += int(text_bytes.sum())
            self._emit(s, tokens, lengths, hashes)
        if batch.file_done:
            self.bytes_done += self.files.files[batch.file_index][1]
            self.state.cursor = (batch.file_index + 1, 0)
        else:
            self.state.cursor = (batch.file_index, batch.end)
        return stop

    def _emit(self, split: str, tokens: np.ndarray, lengths: np.ndarray, hashes: np.ndarray):
        """Documents of one split, whole and in order, to their output."""
        self.output.emit(split, tokens, lengths, hashes)

    def _bytes_before(self, file_index: int) -> int:
        """Input bytes of the share's files before `file_index` (progress)."""
        files = self.files.files
        return max(0, sum(s for _, s in files[:file_index])
                   - sum(s for _, s in files[:self.share.start[0]]))

    def _skip(self, batch_file: int, n: int, skip: Skip):
        self.state.counts["skipped"][skip.reason] += skip.records
        parquet = file_format(self.files.uri(batch_file)) == "parquet"
        where = {"row": n - 1} if parquet else {"line": n}
        record = {"file": self.files.uri(batch_file), **where, "reason": skip.reason,
                  "detail": skip.detail, "records": skip.records}
        with writing(self.skip_path):
            self.skip_log.write((json.dumps(record) + "\n").encode())
        if self.cfg.on_error == "fail" and skip.reason != BLANK_LINE:
            place = ", ".join(f"{k} {v}" for k, v in where.items())
            raise InputError(f"{record['file']}, {place}: {skip.reason}: {skip.detail} "
                             "(--on-error skip counts and logs such records instead)")

    def _prefetch_next(self, file_index: int) -> bool:
        """Fetch the next hub file in the background unless the build may stop in this one
        (before the first file is done there is no tokens-per-byte estimate: no prefetch), nor
        past the end of a task's share."""
        stop = self.share.stop
        if stop and file_index + 1 >= stop[0] + (stop[1] > 0):
            return False
        if not self.cfg.max_tokens:
            return True
        if not self.bytes_done:
            return False
        tokens = self.state.counts["tokens"]
        expected = tokens + tokens / self.bytes_done * self.files.files[file_index][1]
        return expected < self.cfg.max_tokens

    def _settle_before_download(self, file_index: int):
        """A hub build with --max-tokens packs what is in flight before fetching another file,
        so it never downloads a file it will not read."""
        while self.inflight:
            if self._consume_next():
                raise _Stop

    # -- the end -----------------------------------------------------------------------------
    def _finish(self) -> dict:
        """The last rows of each split; each split's index."""
        return self.output.finish(self.state.counts, self.tok.eos_id)

    def _write_manifest(self, indexes: dict) -> dict:
        """The output's record, written last (manifest.json, or a task's done.json)."""
        t_end = time.time()
        loop = (self.t_last - self.t_first) if self.t_first and self.t_last else None
        new_tokens = self.state.counts["tokens"] - self.tokens_at_start
        timings = {"started": self.t_start, "finished": t_end, "seconds": t_end - self.t_start,
                   "startup_seconds": self.t_first - self.t0 if self.t_first else None,
                   "steady_seconds": loop, "tokens_this_run": new_tokens,
                   "steady_tokens_per_second": new_tokens / loop if loop else None,
                   "resumed": self.resumed, "runs": self.state.runs}
        c = self.state.counts  # the whole share is behind it (a resumed run may have read none)
        self.progress.finished(c["documents"], c["tokens"], self.share.bytes)
        return self.output.complete(self, indexes, timings)


class _Stop(Exception):
    """--max-tokens or --limit-docs was reached while settling before a download."""
