"""The two steps after a build's tasks have tokenized their shares (task_build.py):

  place(out, i)   the full shards ending in task i's tokens (task_layout.py), encoded into its
                  work folder (task.NNNNN/<split>/, recorded in placed.json). Needs tasks 0..i
                  done, not the later ones; tasks place in parallel, each about its own share.
  merge(out)      places what no one has placed, cuts each split's last (partial) shard, moves
                  every shard into OUT/<split>/, writes index.json, skipped.jsonl (the tasks'
                  logs, in task order) and manifest.json, and removes the work folder: the same
                  files as a single-machine build, byte for byte (manifest.json but its timings).

The merge reads O(tasks) records, writes one shard per split and renames the placed ones (one
metadata operation per shard, no byte copied). Killed at any point it is simply run again:
shards already moved are found in place, the rest is redone.
"""

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from pipeline import manifest as manifest_mod
from pipeline.atomic import temp_name, write_bytes, write_json, writing
from pipeline.config import SPLITS, WORK_DIR, BuildConfig
from pipeline.errors import SettingsError
from pipeline.formats import get_format
from pipeline.output_dir import (
    FINGERPRINT,
    TASKS,
    Journal,
    remove_stale_temps,
    remove_work_files,
)
from pipeline.output_lock import FolderGone, OutputLock
from pipeline.remote_build import RemoteOut
from pipeline.task_build import DONE, read_done, task_folder
from pipeline.task_layout import SplitLayout, SplitStreams, cut_shard

PLACED = "placed.json"


class TasksUnfinished(SettingsError):
    def __init__(self, out: Path, tasks: int, missing: list[int]):
        shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        super().__init__(f"{out}: {len(missing)} of its {tasks} tasks are not done (task "
                         f"{shown}); run each (the build's command with --tasks {tasks} "
                         "--task-index I), then `pack merge` (the last task merges by itself)")
        self.missing = missing


class TaskedBuild:
    """A build split into tasks, as its work folder records it: tasks.json and each task's
    done.json, read when first needed."""

    def __init__(self, out: Path):
        self.out, self.work = Path(out), Path(out) / WORK_DIR
        try:
            record = json.loads((self.work / TASKS).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(f"{self.out} holds no build split into tasks (no "
                                f"{WORK_DIR}/{TASKS}); `pack merge` finishes a build that "
                                "`pack build --tasks N` started") from None
        self.tasks = record["tasks"]
        self.upload_to = record.get("upload_to")  # an --out URL: OUT is its staging folder
        config = {**record["config"], "out": str(self.out), "inputs": tuple(record["config"]["inputs"])}
        self.cfg = BuildConfig(**config)
        self.fingerprint = json.loads((self.work / FINGERPRINT).read_text(encoding="utf-8"))
        self._done: dict[int, dict] = {}
        self._seen_done: set[int] = set()

    def is_done(self, i: int) -> bool:
        """Once done, a task stays done: only a task not seen done is looked at again."""
        if i not in self._seen_done and (task_folder(self.out, i) / DONE).is_file():
            self._seen_done.add(i)
        return i in self._seen_done

    def done(self, i: int) -> dict:
        """Task i's done.json (read once)."""
        if i not in self._done:
            self._done[i] = read_done(task_folder(self.out, i))
        return self._done[i]

    def dones(self, upto: int | None = None) -> list[dict]:
        return [self.done(i) for i in range(self.tasks if upto is None else upto)]

    def missing(self, upto: int | None = None) -> list[int]:
        """The tasks (up to `upto`) not done: a look at each folder, no file read."""
        return [i for i in range(self.tasks if upto is None else upto) if not self.is_done(i)]

    def placed(self, i: int) -> dict | None:
        path = task_folder(self.out, i) / PLACED
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    # -- the pieces a shard is cut from ------------------------------------------------------
    def _any_done(self) -> dict:
        return self.done(next(i for i in range(self.tasks) if self.is_done(i)))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._any_done()["tokenizer"]["dtype"])

    @property
    def eos_id(self) -> int:
        return self._any_done()["tokenizer"]["eos_id"]

    def streams(self, split: str, upto: int) -> SplitStreams:
        """The documents of tasks 0..upto-1 in `split`."""
        counts = [d["counts"]["splits"][split] for d in self.dones(upto)]
        return SplitStreams([task_folder(self.out, i) for i in range(upto)], split, self.dtype,
                            [c["tokens"] for c in counts], [c["documents"] for c in counts])

    def format(self, split: str):
        cfg = self.cfg
        return get_format(cfg.format).for_writing(self.out / split, cfg.seq, self.dtype,
                                                  cfg.shard_compression(), cfg.shard_bytes)

    def rows_per_shard(self) -> int:
        return self.cfg.shard_rows(self.dtype.itemsize)


def place(out: Path, index: int, wait: bool = True, build: TaskedBuild | None = None) -> bool:
    """The shards task `index` owns, into its work folder; False if another process is
    placing it right now and `wait` is False. Raises TasksUnfinished if a task up to it is not
    done. `build`: the TaskedBuild already read, if any."""
    if _merged(Path(out)):
        return True
    build = build or TaskedBuild(out)
    missing = build.missing(index + 1)
    if missing:
        raise TasksUnfinished(build.out, build.tasks, missing)
    folder = task_folder(out, index)
    if build.placed(index) is not None:
        return True
    try:
        lock = OutputLock(folder, wait=wait, what=f"task {index} of {out}",
                          parents=False).__enter__()
    except FolderGone:  # merged meanwhile
        return True
    except SettingsError:  # another process is placing it
        return False
    try:
        if build.placed(index) is None:
            _place(build, index, folder)
    finally:
        lock.__exit__(None, None, None)
    return True


def _merged(out: Path) -> bool:
    return (out / "manifest.json").is_file() and not (out / WORK_DIR / TASKS).is_file()


def _place(build: TaskedBuild, index: int, folder: Path) -> None:
    """With an --out URL each shard goes up as it is written, and leaves the staging disk."""
    placed = {}
    uploader = RemoteOut(build.upload_to, build.out).uploader() if build.upload_to else None
    try:
        _place_splits(build, index, folder, placed, uploader)
    finally:
        if uploader is not None:
            uploader.close()
    placed["uploaded"] = uploader is not None
    write_json(folder / PLACED, placed, fsync=True)


def _place_splits(build: TaskedBuild, index: int, folder: Path, placed: dict, uploader) -> None:
    for split in SPLITS:
        streams = build.streams(split, index + 1)
        offset, tokens = streams.offsets[index], streams.counts[index]
        layout = SplitLayout(streams.counts, build.cfg.seq, build.rows_per_shard(),
                             build.cfg.last_row)
        fmt, entries = build.format(split), {}
        for k in SplitLayout.owned_shards(offset, tokens, build.cfg.seq, build.rows_per_shard()):
            files, entry = fmt.encode_shard(k, *cut_shard(layout, streams, k, build.eos_id))
            with writing(folder / split):
                (folder / split).mkdir(exist_ok=True)
            for name, data in files.items():
                write_bytes(folder / split / name, data, fsync=True)
                if uploader is not None:
                    uploader.put(folder / split / name, f"{split}/{name}")
            entries[str(k)] = entry
        placed[split] = entries


def merge(out: Path) -> dict:
    """Finish the build in OUT; returns its manifest (at once if it is finished)."""
    out = Path(out)
    if _merged(out):
        return json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    with OutputLock(out / WORK_DIR, wait=True):
        if _merged(out):
            return json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        build = TaskedBuild(out)
        missing = build.missing()
        if missing:
            raise TasksUnfinished(out, build.tasks, missing)
        remove_stale_temps(out)  # a merge killed mid-write left them
        for i in range(build.tasks):
            place(out, i, build=build)
        journal = Journal(out)
        try:
            return _merge(build, journal)
        finally:
            journal.close()


def _merge(build: TaskedBuild, journal: Journal) -> dict:
    out, cfg, dones = build.out, build.cfg, build.dones()
    first = dones[0]
    counts = _sum_counts(dones)
    indexes = {}
    for split in SPLITS:
        streams = build.streams(split, build.tasks)
        layout = SplitLayout(streams.counts, cfg.seq, build.rows_per_shard(), cfg.last_row)
        fmt, entries = build.format(split), {}
        with writing(out / split):
            (out / split).mkdir(exist_ok=True)
        for i in range(build.tasks):
            placed = build.placed(i)
            for k, entry in placed[split].items():
                if not placed.get("uploaded"):  # else in the store already (OUT stages a URL)
                    for stored in _stored_names(fmt, entry):
                        _move(task_folder(out, i) / split / stored, out / split / stored,
                              journal)
                entries[int(k)] = entry
        for k in range(layout.shards):
            if k in entries:
                continue
            files, entries[k] = fmt.encode_shard(k, *cut_shard(layout, streams, k, build.eos_id))
            for name, data in files.items():
                journal.claim(out / split / name)
                write_bytes(out / split / name, data, fsync=True)
        index = fmt.index_json([entries[k] for k in range(layout.shards)])
        journal.claim(out / split / "index.json")
        write_json(out / split / "index.json", index, fsync=True)
        indexes[split] = index
        counts["splits"][split]["padding_tokens"] = layout.padding
        counts["splits"][split]["dropped_tokens"] = layout.dropped
    _concatenate_skip_logs(build, journal)
    m = manifest_mod.make_manifest(cfg, build.fingerprint, first["tokenizer"], _engine(dones),
                                   build.fingerprint["inputs"], counts, indexes, out,
                                   _timings(dones))
    journal.claim(out / "manifest.json")
    write_json(out / "manifest.json", m, fsync=True)
    if build.upload_to:  # before the work folder goes: until then a re-run merges again
        RemoteOut(build.upload_to, out).finish(m)
    remove_work_files(out)
    return m


def _stored_names(fmt, entry: dict) -> list[str]:
    """The files of one index entry (the format reads its own entry schema)."""
    one = type(fmt)(fmt.folder, fmt.index_json([entry]))
    return [f.basename for f in one.stored(0)]


def _move(source: Path, target: Path, journal: Journal) -> None:
    """A placed shard into OUT/<split>/ (a rename: no byte is copied). Already moved by a merge
    that was cut short: nothing to do."""
    journal.claim(target)
    if source.exists() or not target.exists():
        with writing(target):
            os.replace(source, target)


def _concatenate_skip_logs(build: TaskedBuild, journal: Journal) -> None:
    target = build.out / "skipped.jsonl"
    journal.claim(target)
    tmp = temp_name(target)
    with writing(target):
        with open(tmp, "wb") as f:
            for i, done in enumerate(build.dones()):
                with open(task_folder(build.out, i) / "skipped.jsonl", "rb") as log:
                    _copy_prefix(log, f, done["skip_log_bytes"])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)


def _copy_prefix(source, target, size: int) -> None:
    while size > 0:
        chunk = source.read(min(size, 1 << 22))
        if not chunk:
            raise SettingsError(f"{source.name}: shorter than its task recorded; re-run that task")
        target.write(chunk)
        size -= len(chunk)


def _sum_counts(dones: list[dict]) -> dict:
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


def _engine(dones: list[dict]) -> dict:
    """The tokenizer engine, as the manifest records it: the tasks' (a note when they differ:
    the ids are the same under each)."""
    engines = {json.dumps(d["engine"], sort_keys=True) for d in dones}
    engine = dict(dones[0]["engine"])
    others = sorted(engines - {json.dumps(engine, sort_keys=True)})
    if others:
        engine["note"] = (engine.get("note", "") + " tasks ran other engines too: "
                          + "; ".join(others)).strip()
    return engine


def _timings(dones: list[dict]) -> dict:
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


def config_record(cfg: BuildConfig) -> dict:
    """tasks.json's copy of the settings: the merge (which may run elsewhere) rebuilds the
    BuildConfig from it."""
    record = asdict(cfg)
    for k in ("overwrite", "task_index"):
        record.pop(k, None)
    return record

