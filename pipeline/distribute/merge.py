"""The two steps after a build's tasks have tokenized their shares (task_build.py):

  place(out, i)   the full shards ending in task i's tokens (layout.py), encoded into its
                  work folder (task.NNNNN/<split>/, recorded in placed.json). Needs tasks 0..i
                  done, not the later ones; tasks place in parallel, each about its own share.
  merge(out)      places what no one has placed, cuts each split's last (partial) shard, moves
                  every shard into OUT/<split>/, writes index.json, skipped.jsonl (the tasks'
                  logs, in task order) and manifest.json, and removes the work folder: the same
                  files as a single-machine build, byte for byte (manifest.json but its timings).

The merge reads O(tasks) records, writes one shard per split and renames the placed ones (one
metadata operation per shard, no byte copied). Killed at any point it is simply run again:
shards already moved are found in place, the rest is redone.

Check before use: every record it reads (tasks.json, fingerprint.json, done.json, placed.json)
must be a sealed JSON object of the expected shape, every byte of a task's files it reads must
match the checksums the task recorded (task_stream.TaskFile), and every placed shard must be
there with the bytes placed.json records (a stat: its sha256 is in the index, which `pack
stats --verify` checks) before any is moved. Anything else is refused in one line naming the
file and the task whose re-run writes it again (TaskDamaged): a finished task run again checks
its files and its placement and redoes what is damaged (task_build.py, place(check=...)).
"""

import contextlib
import os
from pathlib import Path

import numpy as np

from longpack.atomic import sha256_file, temp_name, write_bytes, write_json, writing
from longpack.errors import LongpackError, SettingsError
from pipeline import manifest as manifest_mod
from pipeline.config import SPLITS, WORK_DIR, BuildConfig
from pipeline.distribute.layout import SplitLayout, SplitStreams, cut_shard
from pipeline.distribute.task_build import (
    DONE,
    SKIP_LOG,
    read_done,
    sum_counts,
    task_folder,
    tasks_engine,
    tasks_timings,
)
from pipeline.distribute.task_stream import (
    BLOCK_BYTES,
    TaskDamaged,
    TaskFile,
    read_record,
    seal,
    shape_error,
)
from pipeline.formats import get_format
from pipeline.store.lock import FolderGone, OutputLock
from pipeline.store.output_dir import (
    FINGERPRINT,
    TASKS,
    Journal,
    remove_stale_temps,
    remove_work_files,
)
from pipeline.store.remote_build import RemoteOut

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
        path = self.work / TASKS
        record, wrong = read_record(path)
        if record is None and wrong is None:
            raise SettingsError(f"{self.out} holds no build split into tasks (no "
                                f"{WORK_DIR}/{TASKS}); `pack merge` finishes a build that "
                                "`pack build --tasks N` started")
        wrong = wrong or shape_error(record, {"tasks": int, "config": {"inputs": list},
                                             "fingerprint": dict})
        if not wrong:
            try:
                self.cfg = BuildConfig(**{**record["config"], "out": str(self.out),
                                          "inputs": tuple(record["config"]["inputs"])})
            except (TypeError, ValueError, LongpackError) as e:
                wrong = f"its settings are not a build's ({e})"
        if wrong or record["tasks"] < 1:
            raise SettingsError(f"{path}: {wrong or 'no tasks'}; re-run one of the build's "
                                "tasks to write it again (the build's command with --task-index"
                                " I), then `pack merge`")
        self.tasks = record["tasks"]
        self.upload_to = record.get("upload_to")  # an --out URL: OUT is its staging folder
        self.fingerprint = record["fingerprint"]  # the same as fingerprint.json's
        fingerprint, wrong = read_record(self.work / FINGERPRINT)
        if wrong or (fingerprint is not None and fingerprint != self.fingerprint):
            raise SettingsError(f"{self.work / FINGERPRINT}: {wrong or 'not the fingerprint'} "
                                f"{TASKS} records; re-run one of the build's tasks to write it "
                                f"again (the build's command with --tasks {self.tasks} "
                                "--task-index I), then `pack merge`")
        self.entry_keys = get_format(self.cfg.format).entry_keys
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
            self._done[i] = read_done(task_folder(self.out, i), i, self.tasks)
        return self._done[i]

    def dones(self, upto: int | None = None) -> list[dict]:
        return [self.done(i) for i in range(self.tasks if upto is None else upto)]

    def missing(self, upto: int | None = None) -> list[int]:
        """The tasks (up to `upto`) not done: a look at each folder, no file read."""
        return [i for i in range(self.tasks if upto is None else upto) if not self.is_done(i)]

    def placed(self, i: int) -> dict | None:
        """Task i's placed.json, None if it has none; TaskDamaged if it is not one."""
        path = task_folder(self.out, i) / PLACED
        record, wrong = read_record(path)
        if record is not None:  # split -> {shard number: index entry}, "uploaded"
            entry = dict.fromkeys(self.entry_keys, object)
            wrong = shape_error(record, dict.fromkeys(SPLITS, dict)) or next(
                (f"{s}.{k}: {w}" for s in SPLITS for k, e in record[s].items()
                 if (w := "not a shard number" if not k.isdigit() else shape_error(e, entry))),
                None) or shape_error(record.get("uploaded", False), bool, "uploaded")
        if wrong:
            raise TaskDamaged(path, i, self.tasks, wrong)
        return record

    def owned(self, i: int, split: str) -> range:
        """The full shards of `split` task i places (its done.json and those before it)."""
        tokens = [d["counts"]["splits"][split]["tokens"] for d in self.dones(i + 1)]
        return SplitLayout.owned_shards(sum(tokens[:i]), tokens[i], self.cfg.seq,
                                        self.rows_per_shard())

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
        return SplitStreams([task_folder(self.out, i) for i in range(upto)], split, self.dtype,
                            self.dones(upto), self.tasks)

    def format(self, split: str):
        cfg = self.cfg
        return get_format(cfg.format).for_writing(self.out / split, cfg.seq, self.dtype,
                                                  cfg.shard_compression(), cfg.shard_bytes)

    def rows_per_shard(self) -> int:
        return self.cfg.shard_rows(self.dtype.itemsize)


def place(out: Path, index: int, wait: bool = True, build: TaskedBuild | None = None,
          check: str | None = None) -> bool:
    """The shards task `index` owns, into its work folder; False if another process is
    placing it right now and `wait` is False. Raises TasksUnfinished if a task up to it is not
    done. `build`: the TaskedBuild already read, if any. `check` ("size" or "sha256"): a
    placement already there is checked (placed.json, and each shard's size, or its sha256
    too) and placed again if damaged; without, a damaged placed.json is TaskDamaged."""
    if _merged(Path(out)):
        return True
    build = build or TaskedBuild(out)
    if not 0 <= index < build.tasks:
        raise SettingsError(f"--task-index {index} is not a task of {build.out}'s {build.tasks} "
                            f"(0 to {build.tasks - 1})")
    missing = build.missing(index + 1)
    if missing:
        raise TasksUnfinished(build.out, build.tasks, missing)
    folder = task_folder(out, index)
    if not check and build.placed(index) is not None:
        return True
    try:
        lock = OutputLock(folder, wait=wait, what=f"task {index} of {out}",
                          parents=False).__enter__()
    except FolderGone:  # merged meanwhile
        return True
    except SettingsError:  # another process is placing it
        return False
    try:
        if not (_placement_intact(build, index, check == "sha256") if check
                else build.placed(index) is not None):
            _place(build, index, folder)
    finally:
        lock.__exit__(None, None, None)
    return True


def _placement_intact(build: TaskedBuild, index: int, hashes: bool) -> bool:
    try:
        placed = build.placed(index)
        if placed is not None:
            check_placed(build, index, placed, hashes)
        return placed is not None
    except TaskDamaged:
        return False


def check_placed(build: TaskedBuild, index: int, placed: dict, hashes: bool = False) -> None:
    """TaskDamaged unless placed.json lists the shards task `index` owns and each file is in
    its folder, or already moved into OUT by a merge cut short, with the bytes (`hashes`: and
    the sha256) it records. Uploaded shards (an --out URL) are in the store, not looked at."""
    path = task_folder(build.out, index) / PLACED
    for split in SPLITS:
        owned = build.owned(index, split)
        if sorted(map(int, placed[split])) != list(owned):
            raise TaskDamaged(path, index, build.tasks, f"it lists other {split} shards than "
                              f"the {len(owned)} task {index} owns")
        if placed.get("uploaded"):
            continue
        fmt = build.format(split)
        for k, entry in placed[split].items():
            try:
                files = _stored(fmt, entry)
            except (KeyError, TypeError, ValueError, IndexError):
                raise TaskDamaged(path, index, build.tasks, f"its {split} shard {k} is not an "
                                  "index entry") from None
            for stored in files:
                source = task_folder(build.out, index) / split / stored.basename
                found = next((p for p in (source, build.out / split / stored.basename)
                              if p.is_file()), None)
                if found is None:
                    raise TaskDamaged(source, index, build.tasks,
                                      f"missing (task {index} placed it; {PLACED} lists it)")
                if found.stat().st_size != stored.bytes or (
                        hashes and stored.sha256 and sha256_file(found) != stored.sha256):
                    raise TaskDamaged(found, index, build.tasks, "not the shard task "
                                      f"{index} placed (its {PLACED} records other bytes)")


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
    write_json(folder / PLACED, seal(placed), fsync=True)


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
        return _read_manifest(out)
    if not (out / WORK_DIR / TASKS).is_file():
        TaskedBuild(out)  # says what OUT holds instead, before the lock would make folders
    with OutputLock(out / WORK_DIR, wait=True):
        if _merged(out):
            return _read_manifest(out)
        build = TaskedBuild(out)
        missing = build.missing()
        if missing:
            raise TasksUnfinished(out, build.tasks, missing)
        remove_stale_temps(out)  # a merge killed mid-write left them
        manifest_mod.refuse_nothing_packed(sum_counts(build.dones()), build.work / "task.*"
                                           / SKIP_LOG)
        for i in range(build.tasks):
            place(out, i, build=build)
        for i in range(build.tasks):  # before anything is moved: a refusal changes nothing
            check_placed(build, i, build.placed(i))
        journal = Journal(out)
        try:
            return _merge(build, journal)
        finally:
            journal.close()


def _read_manifest(out: Path) -> dict:
    manifest, wrong = read_record(out / "manifest.json")
    if wrong:  # merged: the tasks' files are gone
        raise SettingsError(f"{out / 'manifest.json'}: {wrong}; build it again (--overwrite)")
    return manifest


def _merge(build: TaskedBuild, journal: Journal) -> dict:
    out, cfg, dones = build.out, build.cfg, build.dones()
    first = dones[0]
    counts = sum_counts(dones)
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
                    for stored in _stored(fmt, entry):
                        _move(task_folder(out, i) / split / stored.basename,
                              out / split / stored.basename, journal)
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
    m = manifest_mod.make_manifest(cfg, build.fingerprint, first["tokenizer"], tasks_engine(dones),
                                   build.fingerprint["inputs"], counts, indexes, out,
                                   tasks_timings(dones))
    journal.claim(out / "manifest.json")
    write_json(out / "manifest.json", m, fsync=True)
    if build.upload_to:  # before the work folder goes: until then a re-run merges again
        RemoteOut(build.upload_to, out).finish(m)
    remove_work_files(out)
    return m


def _stored(fmt, entry: dict) -> list:
    """The files of one index entry, as StoredFile (the format reads its own entry schema)."""
    one = type(fmt)(fmt.folder, fmt.index_json([entry]))
    return one.stored(0)


def _move(source: Path, target: Path, journal: Journal) -> None:
    """A placed shard into OUT/<split>/ (a rename: no byte is copied). Already moved by a merge
    that was cut short: nothing to do."""
    journal.claim(target)
    if source.exists() or not target.exists():
        with writing(target):
            os.replace(source, target)


def _concatenate_skip_logs(build: TaskedBuild, journal: Journal) -> None:
    """The tasks' logs in task order, each block checked before it is written."""
    target = build.out / "skipped.jsonl"
    journal.claim(target)
    tmp = temp_name(target)
    try:
        with writing(target):
            f = open(tmp, "wb")
        with f:
            for i, done in enumerate(build.dones()):
                size = done["skip_log_bytes"]
                log = TaskFile(task_folder(build.out, i), SKIP_LOG, done, i, build.tasks, size)
                for start in range(0, size, BLOCK_BYTES):
                    data = log.read(start, min(size, start + BLOCK_BYTES))
                    with writing(target):
                        f.write(data)
            with writing(target):
                f.flush()
                os.fsync(f.fileno())
        with writing(target):
            os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only disk refuses even this
            tmp.unlink(missing_ok=True)
        raise
