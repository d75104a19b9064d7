"""One task of a build split into tasks (`pack build --tasks N --task-index I`): the same
read -> tokenize -> split loop as a single-machine build (build.py), over the task's share of the
inputs only (plan.py), writing its documents to its own work folder (task_stream.py)
instead of cutting rows, which it cannot do before the tasks ahead of it are counted.

    OUT/.longpack-build/task.NNNNN/
      lock              held while the task runs (a second copy of the same task is refused)
      checkpoint.npz    BuildState, as a single-machine build's: resume from here
      train.tokens/.docs, val.tokens/.docs   the documents (task_stream.py)
      skipped.jsonl     the skips of its share, in record order
      done.json         written last: the task's counts, tokenizer and timings, and each of
                        the files above but the checkpoint: its size and block sha256s

Nothing it writes is under OUT/train or OUT/val: only the merge puts a dataset there.

A task is done when its done.json is there, and stays done, but for damage: run again, a
finished task reads back every file it recorded (a hash of its files: about 1.5% of what
tokenizing them cost, docs/SCALE.md) and, if its done.json or any of them is not what it
wrote, runs again from its start (its checkpoint describes the damaged files too), to the
same bytes.
"""

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longpack.core import SettingsError, settings_of, write_json, writing
from longpack.pipeline.build_state import BuildState
from longpack.pipeline.config import SPLITS, WORK_DIR, BuildConfig
from longpack.pipeline.distribute.plan import Share
from longpack.pipeline.distribute.task_stream import TaskFile, TaskStream, file_checksums
from longpack.pipeline.distribute.work_folder import (
    BLOCK_BYTES,
    DONE,
    SKIP_LOG,
    TaskDamaged,
    read_done,
    read_record,
    seal,
    shape_error,
    share_record,
    stream_files,
    task_files,
    task_folder,
)
from longpack.pipeline.store.lock import OutputLock
from longpack.pipeline.store.output_dir import CHECKPOINT, FINGERPRINT, TASKS, prepare_output
from longpack.pipeline.store.remote_build import FRESH, RemoteOut

REPORT_SECONDS = 0.5  # how often a task tells its launcher how far it is


@dataclass
class TaskProgress:
    """What a running task reports (to a launcher's aggregated progress bar)."""

    task: int
    documents: int
    tokens: int
    bytes_done: int  # input bytes of this task's share behind it
    bytes_total: int  # input bytes of this task's share


class TaskReports:
    """Task `index`'s progress, told to its launcher (`report(TaskProgress)`, engine_ray.py's
    aggregated bar) a few times a second: a Build's progress (progress.py)."""

    def __init__(self, index: int, report):
        self.index, self.report = index, report
        self.total, self.last = 0, 0.0

    def begin(self, total_bytes: int, max_tokens: int | None, done: tuple[int, int, int]) -> None:
        self.total = total_bytes

    def update(self, documents: int, tokens: int, bytes_done: int) -> None:
        now = time.monotonic()
        if now - self.last >= REPORT_SECONDS:
            self.last = now
            self.report(TaskProgress(self.index, documents, tokens, bytes_done, self.total))

    def finished(self, documents: int, tokens: int, total_bytes: int) -> None:
        self.report(TaskProgress(self.index, documents, tokens, total_bytes, total_bytes))

    def close(self) -> None:
        pass


class TaskOutput:
    """Where task `index` of a build writes: its folder (above), its documents by split
    (task_stream.py) rather than rows, which it cannot cut before the tasks ahead of it are
    counted; done.json last. An Output of build.py. `url`: the build's --out URL (OUT = cfg.out
    is then its staging folder), or None. `already_complete`, once held: OUT held this very
    build, finished (merged), and the run found its manifest."""

    def __init__(self, cfg: BuildConfig, index: int, url: str | None = None):
        self.cfg, self.index, self.url = cfg, index, url
        self.share: Share | None = None
        self.already_complete = False
        self.streams: dict[str, TaskStream] = {}

    @property
    def folder(self) -> Path:
        return task_folder(Path(self.cfg.out), self.index)

    @property
    def skip_path(self) -> Path:
        return self.folder / SKIP_LOG

    @contextlib.contextmanager
    def held(self, build):
        """The work folder readied for the tasks (prepare_work), then this task's own lock for
        the run; yields done.json once its files are checked, if the task is done, else the
        state to run from: its checkpoint, or the start of its share."""
        self.share = build.share
        finished = prepare_work(self.cfg, build.fingerprint, self.url)
        self.already_complete = finished is not None
        if self.already_complete:
            yield finished
            return
        with OutputLock(self.folder, what=f"task {self.index} of {self.cfg.out}", parents=False):
            done = self._intact_done()
            if done is not None:
                yield done
                return
            ckpt = self.folder / CHECKPOINT
            yield BuildState.read(ckpt) if ckpt.exists() else BuildState(cursor=self.share.start)

    def _intact_done(self) -> dict | None:
        """done.json if the task is done and every file it recorded is as it wrote it; else
        None, a damaged task's checkpoint and done.json removed first (in that order: killed
        in between, it is found damaged again), so that it runs again from its start."""
        try:
            done = read_done(self.folder, self.index, self.cfg.tasks)
            if done is None:
                return None
            if done["share"] != share_record(self.share):
                raise TaskDamaged(self.folder / DONE, self.index, self.cfg.tasks,
                                  "its share is not this task's")
            for name, need in task_files(done).items():
                TaskFile(self.folder, name, done, self.index, self.cfg.tasks, need).check()
            return done
        except TaskDamaged:
            for name in (CHECKPOINT, DONE):
                with writing(self.folder / name):
                    (self.folder / name).unlink(missing_ok=True)
            return None

    def open(self, state: BuildState, dtype: np.dtype) -> None:
        self.streams = {s: TaskStream(self.folder, s, dtype, state.sinks.get(s))
                        for s in SPLITS}

    def emit(self, split, tokens, lengths, hashes) -> None:
        self.streams[split].append(tokens, lengths, hashes)

    def checkpoint(self, state: BuildState) -> None:
        state.sinks = {s: stream.state() for s, stream in self.streams.items()}
        state.carries = {}
        state.save(self.folder / CHECKPOINT)

    def wants_checkpoint(self) -> bool:
        return False

    def finish(self, counts: dict, eos_id: int) -> dict:
        for stream in self.streams.values():
            stream.close()
        return {}

    def stop_writing(self) -> None:
        pass

    def complete(self, build, indexes: dict, timings: dict) -> dict:
        """done.json: what the merge needs of this task, and the checksums of its files (read
        back: their bytes as they are on disk), written last, sealed."""
        names = [*stream_files("train"), *stream_files("val"), SKIP_LOG]
        record = {"task": self.index, "tasks": self.cfg.tasks,
                  "share": share_record(self.share), "block_bytes": BLOCK_BYTES,
                  "files": {name: file_checksums(self.folder / name) for name in names},
                  "counts": build.state.counts, "skip_log_bytes": self.skip_path.stat().st_size,
                  "tokenizer": build.tok.identity(), "engine": build.tok.engine_identity(),
                  "timings": {k: timings[k] for k in ("started", "finished", "seconds",
                                                      "steady_seconds", "tokens_this_run",
                                                      "resumed", "runs")}}
        record = seal(record)
        write_json(self.folder / DONE, record, fsync=True)
        return record

    def abandon(self) -> None:
        for stream in self.streams.values():
            stream.abandon()

    def close(self) -> None:
        pass


# -- the work folder, readied for the tasks ----------------------------------------------

def prepare_work(cfg: BuildConfig, fingerprint: dict, url: str | None) -> dict | None:
    """The work folder readied for the build's tasks (tasks.json), as every task and the
    launchers do first (idempotent); the finished build's manifest if OUT already holds this
    very build (nothing to do), else None. Under the output's lock, held only for this: a build
    split into tasks has many writers, each task holding its own folder's lock while it runs.
    `url`: where the build goes (OUT is then its staging folder): checked, and recorded for
    the steps that upload."""
    out = Path(cfg.out)
    work = out / WORK_DIR
    with OutputLock(work, wait=True):
        recorded = _read_record(work)  # present only while a build split into tasks is unfinished
        overwrite = cfg.overwrite
        if recorded is not None and recorded["fingerprint"] == fingerprint:
            if recorded["tasks"] == cfg.tasks:
                # A task of the build under way joins it, --overwrite or not: the first task to
                # arrive replaced what was there, the others must not replace its work again.
                # (No survey of OUT: with 1,000 tasks that would cost every task O(tasks).)
                _repair_fingerprint(work, fingerprint)
                return None
            if not overwrite:
                raise SettingsError(f"{out} is being built in {recorded['tasks']} tasks; run its "
                                    f"tasks with --tasks {recorded['tasks']} (--overwrite "
                                    f"starts it again in {cfg.tasks})")
        if url is not None:
            remote = RemoteOut(url, out)
            found = remote.prepare(fingerprint, overwrite)
            if isinstance(found, dict):  # complete: what the merge left staged is of no use
                remote.remove_staging()
                return found
            overwrite = overwrite or found == FRESH  # nothing staged counts
        if (work / CHECKPOINT).is_file() and not overwrite:
            raise SettingsError(f"{out} holds an unfinished single-machine build: re-run it "
                                "without --tasks to resume it, or pass --overwrite to replace it")
        if recorded is None and (work / TASKS).is_file() and read_record(work / FINGERPRINT)[1]:
            raise SettingsError(f"{work / TASKS} and {work / FINGERPRINT} are both damaged: "
                                f"nothing says which build {out} holds; remove {work} and "
                                "run every task again")
        found = prepare_output(out, fingerprint, overwrite)
        if found == "complete":
            return json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        if _read_record(work) is None:  # none, or a damaged one (the survey found this build)
            write_json(work / TASKS, seal({"tasks": cfg.tasks, "config": config_record(cfg),
                                           "fingerprint": fingerprint, "upload_to": url}),
                       fsync=True)
    return None


def _read_record(work: Path) -> dict | None:
    """tasks.json, or None: there is none, or it is damaged (not a sealed record of its
    shape), and the caller goes on as if there were none: the survey of OUT then decides
    by fingerprint.json whether this is the build there, and the record is written again."""
    record, wrong = read_record(work / TASKS)
    if wrong or record is None or shape_error(record, {"tasks": int, "fingerprint": dict}):
        return None
    return record


def _repair_fingerprint(work: Path, fingerprint: dict) -> None:
    """fingerprint.json damaged while tasks.json (sealed) records this very fingerprint: it is
    written again (the merge refuses a damaged one, naming a task to re-run)."""
    found, wrong = read_record(work / FINGERPRINT)
    if wrong or found != fingerprint:
        write_json(work / FINGERPRINT, fingerprint)


def config_record(cfg: BuildConfig) -> dict:
    """tasks.json's copy of the settings: the merge (which may run elsewhere) rebuilds the
    BuildConfig from it."""
    return settings_of(cfg, "output", "recorded", "run")
