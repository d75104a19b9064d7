"""One task of a build split into tasks (`pack build --tasks N --task-index I`): the same
read -> tokenize -> split loop as a single-machine build (build.py), over the task's share of the
inputs only (task_plan.py), writing its documents to its own work folder (task_stream.py)
instead of cutting rows, which it cannot do before the tasks ahead of it are counted.

    OUT/.longpack-build/task.NNNNN/
      lock              held while the task runs (a second copy of the same task is refused)
      checkpoint.npz    BuildState, as a single-machine build's: resume from here
      train.tokens/.docs, val.tokens/.docs   the documents (task_stream.py)
      skipped.jsonl     the skips of its share, in record order
      done.json         written last: the task's counts, tokenizer and timings

Nothing it writes is under OUT/train or OUT/val: only the merge puts a dataset there.
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.atomic import write_json
from pipeline.build import Build
from pipeline.build_state import BuildState
from pipeline.config import SPLITS, WORK_DIR, BuildConfig
from pipeline.inputs import InputFiles
from pipeline.output_dir import CHECKPOINT
from pipeline.output_lock import OutputLock
from pipeline.task_plan import plan_shares
from pipeline.task_stream import TaskStream

DONE = "done.json"
REPORT_SECONDS = 0.5


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


class TaskBuild(Build):
    def __init__(self, cfg: BuildConfig, index: int, hub_client=None,
                 show_progress: bool | None = None, report=None):
        super().__init__(cfg, hub_client, show_progress)
        self.index, self.report, self.last_report = index, report, 0.0
        self.folder = task_folder(self.out, index)
        shares = plan_shares(self.files.files, cfg.tasks, self.field,
                             self.files.paths if isinstance(self.files, InputFiles) else None)
        self.share = shares[index]
        self.stop = self.share.stop

    def run(self) -> dict:
        """Run (or resume) the task; returns its done.json record (at once when it is done)."""
        try:
            with OutputLock(self.folder, what=f"task {self.index} of {self.out}", parents=False):
                done = read_done(self.folder)
                self.already_complete = done is not None
                if done is not None:
                    return done
                self.work = self.folder  # the checkpoint's folder
                ckpt = self.folder / CHECKPOINT
                return self._run(BuildState.read(ckpt) if ckpt.exists()
                                 else BuildState(cursor=self.share.start))
        finally:
            self.files.close()

    # -- Build's steps, for a task -----------------------------------------------------------
    def _open_outputs(self):
        self.packers = {}
        self.streams = {s: TaskStream(self.folder, s, self.tok.dtype, self.state.sinks.get(s))
                        for s in SPLITS}
        self._open_skip_log(self.folder / "skipped.jsonl")

    def _emit(self, split, tokens, lengths, hashes):
        self.streams[split].append(tokens, lengths, hashes)

    def _record_outputs(self):
        self.state.sinks = {s: stream.state() for s, stream in self.streams.items()}
        self.state.carries = {}

    def _finish(self) -> dict:
        for stream in self.streams.values():
            stream.close()
        return {}

    def _abandon(self) -> None:
        super()._abandon()
        for stream in getattr(self, "streams", {}).values():
            stream.abandon()

    def _bytes_before(self, file_index: int) -> int:
        return max(0, super()._bytes_before(file_index) - super()._bytes_before(self.share.start[0]))

    def _bytes_total(self) -> int:
        return self.share.bytes

    def _show_progress(self, documents: int, tokens: int, bytes_done: int):
        super()._show_progress(documents, tokens, bytes_done)
        now = time.monotonic()
        if self.report is not None and now - self.last_report >= REPORT_SECONDS:
            self.last_report = now
            self.report(TaskProgress(self.index, documents, tokens, bytes_done, self.share.bytes))

    def _write_manifest(self, indexes: dict) -> dict:
        """done.json: what the merge needs of this task, written last."""
        c = self.state.counts
        if self.report is not None:
            self.report(TaskProgress(self.index, c["documents"], c["tokens"], self.share.bytes,
                                     self.share.bytes))
        t_end = time.time()
        loop = (self.t_last - self.t_first) if self.t_first and self.t_last else None
        record = {"task": self.index, "tasks": self.cfg.tasks,
                  "share": {"start": list(self.share.start), "stop": list(self.share.stop),
                            "bytes": self.share.bytes},
                  "counts": c, "skip_log_bytes": self.skip_path.stat().st_size,
                  "tokenizer": self.tok.identity(), "engine": self.tok.engine_identity(),
                  "timings": {"started": self.t_start, "finished": t_end,
                              "seconds": t_end - self.t_start, "steady_seconds": loop,
                              "tokens_this_run": c["tokens"] - self.tokens_at_start,
                              "resumed": self.resumed, "runs": self.state.runs}}
        write_json(self.folder / DONE, record, fsync=True)
        return record


_done_records: dict[tuple, dict] = {}


def read_done(folder: Path) -> dict | None:
    """A task's done.json, or None. Read once per process: a task placing its shards needs the
    records of every task before it, and one process running many tasks in turn (`--tasks N`
    without an index) would otherwise read them O(N^2) times. A record never changes once
    written; its size and time tell a replaced build's apart."""
    path = folder / DONE
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    if key not in _done_records:
        _done_records[key] = json.loads(path.read_text(encoding="utf-8"))
    return _done_records[key]
