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

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longpack.atomic import write_json, writing
from pipeline.build_state import BuildState
from pipeline.config import SPLITS, WORK_DIR, BuildConfig
from pipeline.distribute.plan import Share
from pipeline.distribute.task_stream import (
    BLOCK_BYTES,
    DOC_BYTES,
    SEAL,
    TaskDamaged,
    TaskFile,
    TaskStream,
    file_checksums,
    read_record,
    seal,
    shape_error,
    stream_files,
)
from pipeline.store.lock import OutputLock
from pipeline.store.output_dir import CHECKPOINT

DONE = "done.json"
REPORT_SECONDS = 0.5  # how often a task tells its launcher how far it is
SKIP_LOG = "skipped.jsonl"
_NUMBER = (int, float)
DONE_SHAPE = {  # what the merge reads of a done.json, and its types
    "task": int, "tasks": int, "skip_log_bytes": int,
    "share": {"start": [int], "stop": [int], "bytes": int},
    "counts": {"documents": int, "tokens": int,
               "splits": {s: {"documents": int, "tokens": int} for s in SPLITS}},
    "tokenizer": {"dtype": str, "eos_id": int}, "engine": dict,
    "timings": {"started": _NUMBER, "seconds": _NUMBER, "tokens_this_run": int,
                "resumed": bool, "runs": int}}


def task_folder(out: Path, index: int) -> Path:
    return Path(out) / WORK_DIR / f"task.{index:05d}"


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

    def finished(self, documents: int, tokens: int) -> None:
        self.report(TaskProgress(self.index, documents, tokens, self.total, self.total))

    def close(self) -> None:
        pass


class TaskOutput:
    """Where task `index` of a build writes: its folder (above), its documents by split
    (task_stream.py) rather than rows, which it cannot cut before the tasks ahead of it are
    counted; done.json last. An Output of build.py."""

    def __init__(self, cfg: BuildConfig, index: int, share: Share):
        self.cfg, self.index, self.share = cfg, index, share
        self.folder = task_folder(Path(cfg.out), index)
        self.skip_path = self.folder / SKIP_LOG
        self.streams: dict[str, TaskStream] = {}

    def held(self) -> OutputLock:
        return OutputLock(self.folder, what=f"task {self.index} of {self.cfg.out}",
                          parents=False)

    def begin(self, fingerprint: dict) -> dict | BuildState:
        """done.json once its files are checked, if the task is done; else the state to run
        from: its checkpoint, or the start of its share."""
        done = self._intact_done()
        if done is not None:
            return done
        ckpt = self.folder / CHECKPOINT
        return BuildState.read(ckpt) if ckpt.exists() else BuildState(cursor=self.share.start)

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


def share_record(share: Share) -> dict:
    return {"start": list(share.start), "stop": list(share.stop), "bytes": share.bytes}


def task_files(done: dict) -> dict[str, int]:
    """{name: the bytes its counts say it holds} of each file a finished task recorded."""
    itemsize = np.dtype(done["tokenizer"]["dtype"]).itemsize
    files = {}
    for split in SPLITS:
        tokens, docs = stream_files(split)
        counts = done["counts"]["splits"][split]
        files[tokens], files[docs] = counts["tokens"] * itemsize, counts["documents"] * DOC_BYTES
    files[SKIP_LOG] = done["skip_log_bytes"]
    return files


_done_records: dict[tuple, dict] = {}


def read_done(folder: Path, index: int, tasks: int) -> dict | None:
    """Task `index`'s done.json, or None if it has none; TaskDamaged (one line naming it and
    the task to re-run) if it is not a sealed record of that task of `tasks` in the expected
    shape. Read once per process: a task placing its shards needs the records of every task
    before it, and one process running many tasks in turn (`--tasks N` without an index)
    would otherwise read them O(N^2) times. A record never changes once written; its size and
    time tell a replaced one apart."""
    path = folder / DONE
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    if key not in _done_records:
        record, wrong = read_record(path)
        wrong = wrong or (None if record is None else _done_error(record))
        if record is None and wrong is None:
            return None  # removed meanwhile
        if wrong:
            raise TaskDamaged(path, index, tasks, wrong)
        _done_records[key] = record
    record = _done_records[key]
    if (record["task"], record["tasks"]) != (index, tasks):
        raise TaskDamaged(path, index, tasks, f"the record of task {record['task']} of "
                          f"{record['tasks']}, not of task {index} of {tasks}")
    return record


def _done_error(done: dict) -> str | None:
    """What is wrong with a done.json's shape, or None. One written before checksums were
    recorded (no "files", no seal) is taken with its sizes alone."""
    wrong = shape_error(done, DONE_SHAPE) or _not_counts(done["counts"], "counts")
    if wrong:
        return wrong
    if done["tokenizer"]["dtype"] not in ("uint16", "uint32"):
        return f"tokenizer.dtype is {done['tokenizer']['dtype']!r}, not uint16 or uint32"
    if "files" not in done:
        return None
    if SEAL not in done:
        return f"it records its files but has no {SEAL}"
    block, files, want = done.get("block_bytes"), done["files"], task_files(done)
    if shape_error(block, int) or block <= 0:
        return f"block_bytes is {block!r}, not a positive integer"
    if not isinstance(files, dict) or sorted(files) != sorted(want):
        return f"files does not list {', '.join(sorted(want))}"
    for name, need in want.items():
        rec = files[name]
        wrong = shape_error(rec, {"bytes": int, "blocks": [str]}, f"files.{name}")
        if wrong or rec["bytes"] != need:
            return wrong or f"files.{name} records {rec['bytes']} bytes, its counts {need}"
        if len(rec["blocks"]) != -(-need // block):
            return f"files.{name} has {len(rec['blocks'])} block sums for {need} bytes"
    return None


def _not_counts(counts: dict, where: str) -> str | None:
    """The merge sums every number under counts: each must be an integer."""
    for k, v in counts.items():
        wrong = (_not_counts(v, f"{where}.{k}") if isinstance(v, dict)
                 else shape_error(v, int, f"{where}.{k}"))
        if wrong:
            return wrong
    return None


# -- what the merged manifest takes from the tasks' records -------------------------------

def sum_counts(dones: list[dict]) -> dict:
    """The tasks' counts, summed (the merged manifest's)."""
    def add(total, part):
        for k, v in part.items():
            if isinstance(v, dict):
                add(total.setdefault(k, {}), v)
            else:
                total[k] = total.get(k, 0) + v
        return total

    counts: dict = {}
    for d in dones:
        add(counts, d["counts"])
    return counts


def tasks_engine(dones: list[dict]) -> dict:
    """The tokenizer engine, as the manifest records it: the tasks' (a note when they differ:
    the ids are the same under each)."""
    engines = {json.dumps(d["engine"], sort_keys=True) for d in dones}
    engine = dict(dones[0]["engine"])
    others = sorted(engines - {json.dumps(engine, sort_keys=True)})
    if others:
        engine["note"] = (engine.get("note", "") + " tasks ran other engines too: "
                          + "; ".join(others)).strip()
    return engine


def tasks_timings(dones: list[dict]) -> dict:
    """The merged manifest's timings, from the tasks' (and now: the merge ends the build)."""
    started = min(d["timings"]["started"] for d in dones)
    finished = time.time()
    tokens = sum(d["timings"]["tokens_this_run"] for d in dones)
    seconds = finished - started
    return {"started": started, "finished": finished, "seconds": seconds,
            "startup_seconds": None, "steady_seconds": None, "tokens_this_run": tokens,
            "steady_tokens_per_second": None,
            "resumed": any(d["timings"]["resumed"] for d in dones),
            "runs": max(d["timings"]["runs"] for d in dones),
            "tasks": len(dones), "task_seconds": [d["timings"]["seconds"] for d in dones],
            "tokens_per_second": tokens / seconds if seconds > 0 else None}
