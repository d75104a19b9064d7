"""The two steps after a build's tasks have tokenized their shares (task_build.py), and what a
task does once it is done (`after_task`: it places its shards, and those of the later done tasks
that waited for it, once the tasks before it are done; it merges if every task is done):

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

Check before use: every record it reads is checked as work_folder.py says, every byte of a
task's files it reads must match the checksums the task recorded (task_stream.TaskFile), and
every placed shard must be there with the bytes placed.json records (a stat: its sha256 is in
the index, which `pack stats --verify` checks) before any is moved. Anything else is refused
in one line naming the file and the task whose re-run writes it again (TaskDamaged): a
finished task run again checks its files and its placement and redoes what is damaged
(task_build.py, place(check=...)).
"""

import contextlib
import json
import os
import time
from pathlib import Path

from longpack.core import SettingsError, temp_name, write_bytes, write_json, writing
from longpack.pipeline import manifest as manifest_mod
from longpack.pipeline.config import SPLITS, WORK_DIR
from longpack.pipeline.distribute.task_stream import SplitStreams, TaskFile
from longpack.pipeline.distribute.work_folder import (
    BLOCK_BYTES,
    PLACED,
    SKIP_LOG,
    TaskedBuild,
    TasksUnfinished,
    read_record,
    seal,
    stored_files,
    task_folder,
)
from longpack.pipeline.store.lock import FolderGone, OutputLock
from longpack.pipeline.store.output_dir import TASKS, Journal, remove_stale_temps, remove_work_files
from longpack.pipeline.store.remote_build import RemoteOut


def after_task(out: Path, index: int, place_ready: bool = True, merge_done: bool = True
               ) -> dict | None:
    """Task `index` is done: with `place_ready`, it places its shards, and those of later done
    tasks that waited for it, if the tasks before it are done (its own placement is checked,
    and placed again if damaged; a task another process is placing right now is skipped: it is
    being done); with `merge_done`, it merges if every task is done. The manifest if OUT is
    finished, else None."""
    out = Path(out)
    build = TaskedBuild(out)
    try:
        for i in range(index, build.tasks if place_ready else index):
            place(out, i, wait=False, build=build, check="sha256" if i == index else None)
    except TasksUnfinished:
        pass  # a task up to i is not done: the task finishing it places the rest
    if merge_done:
        with contextlib.suppress(TasksUnfinished):  # the task finishing the last one merges
            return merge(out)
    return None


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
    try:  # under the lock: a merge that finished meanwhile was FolderGone above
        owned = {split: build.owned(index, split) for split in SPLITS}
        placed = (build.intact_placement(index, check == "sha256") if check
                  else build.placed(index))
        if placed is None:
            _place(build, index, folder, owned)
    finally:
        lock.__exit__(None, None, None)
    return True


def _merged(out: Path) -> bool:
    return (out / "manifest.json").is_file() and not (out / WORK_DIR / TASKS).is_file()


def _streams(build: TaskedBuild, split: str, upto: int) -> SplitStreams:
    """The documents of tasks 0..upto-1 in `split`."""
    return SplitStreams([task_folder(build.out, i) for i in range(upto)], split, build.dtype,
                        build.dones(upto), build.tasks)


def _place(build: TaskedBuild, index: int, folder: Path, owned: dict[str, range]) -> None:
    """The shards task `index` owns (`owned`: of each split), cut and written into its folder,
    then placed.json. With an --out URL each shard goes up as it is written, and leaves the
    staging disk."""
    placed = {}
    uploader = RemoteOut(build.upload_to, build.out).uploader() if build.upload_to else None
    try:
        for split in SPLITS:
            streams = _streams(build, split, index + 1)
            layout = build.layout(split, index + 1)
            fmt, entries = build.format(split), {}
            for k in owned[split]:
                files, entry = fmt.encode_shard(k, *layout.cut(streams, k, build.eos_id))
                with writing(folder / split):
                    (folder / split).mkdir(exist_ok=True)
                for name, data in files.items():
                    write_bytes(folder / split / name, data, fsync=True)
                    if uploader is not None:
                        uploader.put(folder / split / name, f"{split}/{name}")
                entries[str(k)] = entry
            placed[split] = entries
    finally:
        if uploader is not None:
            uploader.close()
    placed["uploaded"] = uploader is not None
    write_json(folder / PLACED, seal(placed), fsync=True)


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
            build.check_placed(i, build.placed(i))
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
        streams = _streams(build, split, build.tasks)
        layout = build.layout(split, build.tasks, final=True)
        fmt, entries = build.format(split), {}
        with writing(out / split):
            (out / split).mkdir(exist_ok=True)
        for i in range(build.tasks):
            placed = build.placed(i)
            for k, entry in placed[split].items():
                if not placed.get("uploaded"):  # else in the store already (OUT stages a URL)
                    for stored in stored_files(fmt, entry):
                        _move(task_folder(out, i) / split / stored.basename,
                              out / split / stored.basename, journal)
                entries[int(k)] = entry
        for k in range(layout.shards):
            if k in entries:
                continue
            files, entries[k] = fmt.encode_shard(k, *layout.cut(streams, k, build.eos_id))
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
                                   tasks_timings(dones), journal.claim)
    journal.claim(out / "manifest.json")
    write_json(out / "manifest.json", m, fsync=True)
    if build.upload_to:  # before the work folder goes: until then a re-run merges again
        RemoteOut(build.upload_to, out).finish(m)
    remove_work_files(out)
    return m


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
