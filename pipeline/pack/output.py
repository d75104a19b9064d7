"""A build's output at OUT: each split's documents packed into rows (packer.py; best_fit.py
under --packing best-fit) and written as shards (writers.py), OUT/skipped.jsonl, and
OUT/manifest.json last. One of the Outputs a Build runs into (build.py; a task's is
distribute/task_build.py's TaskOutput).

    OUT/.longpack-build/   lock, fingerprint.json, checkpoint.npz, partial shards
    OUT/train/, OUT/val/   shards + index.json, written by the format's class
    OUT/skipped.jsonl      the records skipped, one line each
    OUT/manifest.json      written last: its presence means the build is complete

The output holds OUT's lock while it runs and touches only files it can prove it wrote
(store/output_dir.py: the fingerprint says which build OUT holds, the journal what it wrote).
"""

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from longpack.core import write_json
from longpack.pipeline import manifest as manifest_mod
from longpack.pipeline.build_state import BuildState
from longpack.pipeline.config import SPLITS, WORK_DIR, BuildConfig
from longpack.pipeline.pack.best_fit import BestFitPacker
from longpack.pipeline.pack.packer import RowPacker
from longpack.pipeline.pack.writers import ShardSink, shard_writer
from longpack.pipeline.store.lock import OutputLock
from longpack.pipeline.store.output_dir import (
    CHECKPOINT,
    Journal,
    prepare_output,
    refuse_tasked_build,
    remove_work_files,
)


class ShardOutput:
    """OUT = cfg.out (a local folder). `publish` is called with each finished shard file
    (store/remote_build.py's UploadOutput uploads it)."""

    def __init__(self, cfg: BuildConfig, publish: Callable[[Path], None] | None = None):
        self.cfg, self.publish = cfg, publish
        self.out = Path(cfg.out)
        self.work = self.out / WORK_DIR
        self.skip_path = self.out / "skipped.jsonl"
        self.journal: Journal | None = None
        self.already_complete = False
        self.writer = None  # the shard writer thread, while open
        self.packers: dict[str, RowPacker | BestFitPacker] = {}
        self.pad_id: int | None = None  # the tokenizer's EOS: best-fit pads every row with it
        self.sinks: dict[str, ShardSink] = {}

    @contextlib.contextmanager
    def held(self, build, fresh: bool = False):
        """OUT's lock for the run; yields OUT's manifest if it holds this very build, else the
        state to start or resume from. `fresh`: whatever OUT holds is of no use (an upload's
        store copy was replaced), as with --overwrite."""
        overwrite = self.cfg.overwrite or fresh
        with OutputLock(self.work):
            refuse_tasked_build(self.out, overwrite)
            found = prepare_output(self.out, build.fingerprint, overwrite)
            self.already_complete = found == "complete"
            if self.already_complete:
                yield json.loads((self.out / "manifest.json").read_text())
                return
            self.journal = Journal(self.out)
            self.pad_id = build.tok.eos_id
            yield found or BuildState()

    def open(self, state: BuildState, dtype: np.dtype) -> None:
        """Packers and shard sinks, each where the checkpoint left it."""
        cfg = self.cfg
        self.writer = shard_writer()
        self.packers = {s: make_packer(cfg, dtype, self.pad_id, state.carries.get(s))
                        for s in SPLITS}
        self.sinks = {s: ShardSink(cfg.format, self.out / s, self.work, s, cfg.seq, dtype,
                                   cfg.shard_rows(dtype.itemsize), cfg.shard_compression(),
                                   cfg.shard_bytes, self.journal.claim, self.writer,
                                   state.sinks.get(s), self.publish)
                      for s in SPLITS}
        self.journal.claim(self.skip_path)

    def emit(self, split: str, tokens: np.ndarray, lengths: np.ndarray,
             hashes: np.ndarray) -> None:
        rows, segments = self.packers[split].add(tokens, lengths, hashes)
        self.sinks[split].append(rows, segments)

    def checkpoint(self, state: BuildState) -> None:
        """The state, with where each split's output stands (once the shards in flight are
        written), saved; then the partial files it made obsolete go."""
        state.sinks = {s: self.sinks[s].state() for s in SPLITS}
        state.carries = {s: p.state() for s, p in self.packers.items()}
        state.save(self.work / CHECKPOINT)
        for sink in self.sinks.values():
            sink.delete_obsolete()

    def wants_checkpoint(self) -> bool:
        """A finished shard made partial files obsolete: a checkpoint lets them go."""
        return any(s.obsolete for s in self.sinks.values())

    def finish(self, counts: dict, eos_id: int) -> dict:
        """Each split's last rows (--last-row), counted; each split's index."""
        indexes = {}
        for s in SPLITS:
            rows, segments, padding, dropped = self.packers[s].finish(self.cfg.last_row, eos_id)
            self.sinks[s].append(rows, segments)
            cs = counts["splits"][s]
            cs["padding_tokens"], cs["dropped_tokens"] = padding, dropped
            indexes[s] = self.sinks[s].close()
        return indexes

    def stop_writing(self) -> None:
        if self.writer is not None:
            self.writer.shutdown()

    def complete(self, build, indexes: dict, timings: dict) -> dict:
        """OUT/manifest.json (docs/FORMAT.md), written last; the work folder goes (the lock
        last, when the run lets it go)."""
        manifest_mod.refuse_nothing_packed(build.state.counts, self.skip_path)
        tok = build.tok
        m = manifest_mod.make_manifest(self.cfg, build.fingerprint, tok.identity(),
                                       tok.engine_identity(), build.inputs,
                                       build.state.counts, indexes, self.out, timings,
                                       self.journal.claim)
        self.journal.claim(self.out / "manifest.json")
        write_json(self.out / "manifest.json", m, fsync=True)
        remove_work_files(self.out)
        return m

    def abandon(self) -> None:
        for sink in self.sinks.values():
            sink.abandon()

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()


def make_packer(cfg: BuildConfig, dtype: np.dtype, pad_id: int,
                state: dict | None = None) -> RowPacker | BestFitPacker:
    """The packer --packing names, where a checkpoint's `state` (its state()) left it."""
    if cfg.packing == "best-fit":
        return BestFitPacker(cfg.seq, dtype, pad_id, **(state or {}))
    return RowPacker(cfg.seq, dtype, **(state or {}))
