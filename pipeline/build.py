"""`pack build`: read -> tokenize -> split -> pack -> write shards, resumably.

    read_batches (read/inputs.py)      a reader thread: batches of texts from one file, in order
      -> encode_batch (tokenize/encode.py) worker threads: hash, split, tokens + EOS    (--workers)
      -> RowPacker (pack/packer.py)      main thread, one per split: rows of exactly --seq tokens
      -> ShardSink (pack/writers.py)   main thread, one per split: write-ahead rows; a writer thread
                                  turns them into finished shards in the background
      -> checkpoint               every CHECKPOINT_SECONDS and after each finished shard:
                                  the BuildState (build_state.py), written atomically

Batches are submitted in order and consumed in order, at most 2 x workers ahead, so memory is
bounded and the output is the same for any worker count. Re-running the same command resumes
from the last checkpoint and produces the same bytes as an uninterrupted build.
"""

import contextlib
import json
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from longpack.atomic import write_bytes, write_json, writing
from longpack.errors import InputError, TokenizerError
from pipeline import manifest as manifest_mod
from pipeline.build_state import BuildState
from pipeline.config import SPLITS, WORK_DIR, BuildConfig
from pipeline.pack.packer import RowPacker
from pipeline.pack.writers import ShardSink, shard_writer
from pipeline.progress import Progress
from pipeline.read.catalog import file_format, get_dataset
from pipeline.read.inputs import open_inputs, read_ahead, read_batches
from pipeline.read.records import BLANK_LINE, Skip
from pipeline.store.lock import OutputLock
from pipeline.store.output_dir import (
    CHECKPOINT,
    Journal,
    prepare_output,
    refuse_tasked_build,
    remove_work_files,
)
from pipeline.tokenize.encode import EngineMismatch, encode_batch
from pipeline.tokenize.split import Splitter
from pipeline.tokenize.tokenizer import load_tokenizer

CHECKPOINT_SECONDS = 10.0


def build(cfg: BuildConfig, hub_client=None, show_progress: bool | None = None) -> dict:
    return Build(cfg, hub_client, show_progress).run()


class Build:
    """One run of `pack build`: the settings and inputs in __init__, then `run`."""

    def __init__(self, cfg: BuildConfig, hub_client=None, show_progress: bool | None = None):
        self.t_start, self.t0 = time.time(), time.monotonic()
        self.cfg, self.show_progress = cfg, show_progress
        self.dataset = get_dataset(cfg.dataset)
        self.field = cfg.text_field or self.dataset.text_field
        self.tok = load_tokenizer(cfg.tokenizer, bos=cfg.bos, engine=cfg.tokenizer_engine)
        if self.tok.kind == "huggingface":
            # tokenizers parallelises each batch on rayon's global pool, sized from this variable
            # when first used; without it the pool takes every core whatever --workers says.
            os.environ.setdefault("RAYON_NUM_THREADS", str(cfg.workers))
        self.files, self.inputs = open_inputs(cfg, self.dataset, hub_client)
        self.out = Path(cfg.out)
        self.work = self.out / WORK_DIR
        tokenizer_id = {k: v for k, v in self.tok.identity().items() if k != "source"}
        self.fingerprint = {"settings": cfg.output_settings(), "tokenizer": tokenizer_id,
                            "inputs": self.inputs, "format_version": manifest_mod.FORMAT_VERSION}
        self.splitter = Splitter(cfg.val_fraction, cfg.seed)
        self.stop = None  # where reading ends (a task's share ends early: distribute/task_build.py)
        self.publish = None  # called with each finished shard file (store/remote_build.py uploads it)

    def run(self) -> dict:
        """Build (or resume, or find complete) OUT; returns its manifest."""
        try:
            with OutputLock(self.work):
                refuse_tasked_build(self.out, self.cfg.overwrite)
                found = prepare_output(self.out, self.fingerprint, self.cfg.overwrite)
                self.already_complete = found == "complete"
                if self.already_complete:  # nothing to do: the finished build's manifest
                    return json.loads((self.out / "manifest.json").read_text())
                self.journal = Journal(self.out)
                try:
                    return self._run(found or BuildState())
                finally:
                    self.journal.close()
        finally:
            self.files.close()

    def _run(self, state: BuildState) -> dict:
        self.state, self.resumed = state, state.runs > 0
        state.runs += 1
        self.tokens_at_start = state.counts["tokens"]
        self.t_first = self.t_last = None
        self.sinks, self.skip_log = {}, None
        self.writer = shard_writer()
        try:
            self._open_outputs()
            if not state.input_done:
                self._read_all()
            indexes = self._finish()
            with writing(self.skip_path):
                self.skip_log.close()
        except BaseException:
            self._abandon()
            raise
        finally:
            self.writer.shutdown()
        return self._write_manifest(indexes)

    # -- outputs and checkpoints -------------------------------------------------------------
    def _open_outputs(self):
        """Packers, shard sinks and skipped.jsonl, each where the checkpoint left it."""
        cfg, state, dtype = self.cfg, self.state, self.tok.dtype
        self.packers = {s: RowPacker(cfg.seq, dtype, *state.carries.get(s, (None, None)))
                        for s in SPLITS}
        self.sinks = {s: ShardSink(cfg.format, self.out / s, self.work, s, cfg.seq, dtype,
                                   cfg.shard_rows(dtype.itemsize), cfg.shard_compression(),
                                   cfg.shard_bytes, self.journal.claim, self.writer,
                                   state.sinks.get(s), self.publish)
                      for s in SPLITS}
        self.journal.claim(self.out / "skipped.jsonl")
        self._open_skip_log(self.out / "skipped.jsonl")

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
        self._record_outputs()
        write_bytes(self.work / CHECKPOINT, state.to_npz())
        for sink in self.sinks.values():
            sink.delete_obsolete()
        self.last_checkpoint = time.monotonic()

    def _record_outputs(self):
        """Into the state: where each split's output stands."""
        self.state.sinks = {s: self.sinks[s].state() for s in SPLITS}  # waits for shards in flight
        self.state.carries = {s: (p.carry, p.carry_segments) for s, p in self.packers.items()}

    def _abandon(self) -> None:
        """After a failure, close every output file quietly: a full disk would refuse their
        last buffers again, and a resume cuts each file back to the checkpoint anyway."""
        if self.skip_log is not None:
            with contextlib.suppress(OSError):
                self.skip_log.close()
        for sink in self.sinks.values():
            sink.abandon()

    # -- the loop ----------------------------------------------------------------------------
    def _read_all(self):
        cfg, c = self.cfg, self.state.counts
        self.bytes_done = self._bytes_before(self.state.cursor[0])
        self.progress = Progress(self._bytes_total(), cfg.max_tokens,
                                 self.show_progress, (c["documents"], c["tokens"], self.bytes_done))
        pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="tokenize")
        self.inflight = deque()
        if cfg.max_tokens and not cfg.inputs:  # settling packs on this thread between files
            batches = read_batches(self.files, self.field, self.state.cursor,
                                   self._prefetch_next, self._settle_before_download)
        else:
            batches = read_ahead(read_batches(self.files, self.field, self.state.cursor,
                                              self._prefetch_next, stop=self.stop),
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
        self._show_progress(c["documents"], c["tokens"], self.bytes_done + in_file)
        if not stop and (time.monotonic() - self.last_checkpoint > CHECKPOINT_SECONDS
                         or any(s.obsolete for s in self.sinks.values())):
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
        rows, segments = self.packers[split].add(tokens, lengths, hashes)
        self.sinks[split].append(rows, segments)

    def _show_progress(self, documents: int, tokens: int, bytes_done: int):
        self.progress.update(documents, tokens, bytes_done)

    def _bytes_before(self, file_index: int) -> int:
        """Input bytes of the files before `file_index` (progress)."""
        return sum(s for _, s in self.files.files[:file_index])

    def _bytes_total(self) -> int:
        return sum(s for _, s in self.files.files)

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
        if self.stop and file_index + 1 >= self.stop[0] + (self.stop[1] > 0):
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
        indexes = {}
        for s in SPLITS:
            rows, segments, padding, dropped = self.packers[s].finish(self.cfg.last_row,
                                                                      self.tok.eos_id)
            self.sinks[s].append(rows, segments)
            cs = self.state.counts["splits"][s]
            cs["padding_tokens"], cs["dropped_tokens"] = padding, dropped
            indexes[s] = self.sinks[s].close()
        return indexes

    def _write_manifest(self, indexes: dict) -> dict:
        t_end = time.time()
        loop = (self.t_last - self.t_first) if self.t_first and self.t_last else None
        new_tokens = self.state.counts["tokens"] - self.tokens_at_start
        timings = {"started": self.t_start, "finished": t_end, "seconds": t_end - self.t_start,
                   "startup_seconds": self.t_first - self.t0 if self.t_first else None,
                   "steady_seconds": loop, "tokens_this_run": new_tokens,
                   "steady_tokens_per_second": new_tokens / loop if loop else None,
                   "resumed": self.resumed, "runs": self.state.runs}
        m = manifest_mod.make_manifest(self.cfg, self.fingerprint, self.tok.identity(),
                                       self.tok.engine_identity(), self.inputs,
                                       self.state.counts, indexes, self.out, timings)
        self.journal.claim(self.out / "manifest.json")
        write_json(self.out / "manifest.json", m, fsync=True)
        remove_work_files(self.out)  # the lock goes last, when run() lets it go
        return m


class _Stop(Exception):
    """--max-tokens or --limit-docs was reached while settling before a download."""
