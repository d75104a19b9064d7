"""`pack build --tasks N`: one build split over N tasks (processes, machines, Ray tasks, Slurm
array elements), whose merged output is byte-identical to the single-machine build.

    prepare_tasks(cfg)        check OUT as a build does, record the tasks (tasks.json)
    run_task(cfg, i)          task i: tokenize its share (task_build.py), place its shards if the
                              tasks before it are done, merge if it is the last one done
    place_task(out, i)        phase 2, parallel over tasks: task i's interior shards
    merge(out)                the rest, and the dataset appears under OUT (merge.py)

docs/SCALE.md explains the design and its costs; docs/FORMAT.md the work folder.
"""

import json
import os
from pathlib import Path

from longpack.atomic import write_json
from longpack.errors import SettingsError
from longpack.settings import settings_of
from pipeline.build import Build
from pipeline.config import WORK_DIR, BuildConfig
from pipeline.distribute import merge as task_merge
from pipeline.distribute.merge import TaskedBuild, TasksUnfinished, place
from pipeline.distribute.task_build import TaskOutput, TaskProgress, TaskReports
from pipeline.distribute.task_stream import TaskDamaged, read_record, seal, shape_error
from pipeline.progress import Progress
from pipeline.store.destination import Destination
from pipeline.store.lock import OutputLock
from pipeline.store.output_dir import CHECKPOINT, FINGERPRINT, TASKS, prepare_output
from pipeline.store.remote_build import FRESH, RemoteOut

__all__ = ["TaskProgress", "TasksUnfinished", "merge", "place_task", "prepare_tasks", "run_task",
           "task_index_from_env", "tasks_from_env", "task_status"]

merge = task_merge.merge


def prepare_tasks(cfg: BuildConfig, hub_client=None, dest: Destination | None = None
                  ) -> dict | None:
    """Check OUT and record the tasks; the finished build's manifest if OUT already holds this
    very build (nothing to do), else None. Idempotent: every task calls it too. An --out URL:
    the tasks run in its staging folder (`dest.local`), which every task must see."""
    dest = dest or Destination.of(cfg)
    cfg, url = dest.local_config(cfg), dest.url
    with Build(cfg, hub_client) as build:
        return _prepare(build, url)


def _prepare(task: Build, url: str | None) -> dict | None:
    """Under the output's lock, held only for this: a build split into tasks has many writers,
    each task holding its own folder's lock while it runs. `url`: where the build goes (OUT is
    then its staging folder): checked, and recorded for the steps that upload."""
    cfg, out = task.cfg, Path(task.cfg.out)
    work = out / WORK_DIR
    with OutputLock(work, wait=True):
        recorded = _read_record(work)  # present only while a build split into tasks is unfinished
        overwrite = cfg.overwrite
        if recorded is not None and recorded["fingerprint"] == task.fingerprint:
            if recorded["tasks"] == cfg.tasks:
                # A task of the build under way joins it, --overwrite or not: the first task to
                # arrive replaced what was there, the others must not replace its work again.
                # (No survey of OUT: with 1,000 tasks that would cost every task O(tasks).)
                _repair_fingerprint(work, task.fingerprint)
                return None
            if not overwrite:
                raise SettingsError(f"{out} is being built in {recorded['tasks']} tasks; run its "
                                    f"tasks with --tasks {recorded['tasks']} (--overwrite "
                                    f"starts it again in {cfg.tasks})")
        if url is not None:
            remote = RemoteOut(url, out)
            found = remote.prepare(task.fingerprint, overwrite)
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
        found = prepare_output(out, task.fingerprint, overwrite)
        if found == "complete":
            return json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        if _read_record(work) is None:  # none, or a damaged one (the survey found this build)
            write_json(work / TASKS, seal({"tasks": cfg.tasks, "config": config_record(cfg),
                                           "fingerprint": task.fingerprint, "upload_to": url}),
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


def run_task(cfg: BuildConfig, index: int, *, report=None, place: bool = True,
             merge: bool = True, show_progress: bool | None = None,
             hub_client=None, dest: Destination | None = None) -> dict | None:
    """Task `index` of cfg.tasks (resumes from its checkpoint; when done, returns once it has
    checked its files and placement, redoing what is damaged).
    `report(TaskProgress)` is called as it goes. Then, with `place`, it places its shards (and
    those of later tasks that waited for it) if the tasks before it are done; with `merge`, it
    merges if every task is done. Returns the manifest if OUT is finished, else None."""
    if not 0 <= index < cfg.tasks:
        raise SettingsError(f"--task-index {index} is not a task of --tasks {cfg.tasks} "
                            f"(0 to {cfg.tasks - 1})")
    dest = dest or Destination.of(cfg)
    cfg, url = dest.local_config(cfg), dest.url
    progress = Progress(enabled=show_progress) if report is None else TaskReports(index, report)
    with Build(cfg, hub_client, progress, task=index) as build:
        finished = _prepare(build, url)
        if finished is not None:
            return finished
        build.run(TaskOutput(cfg, index, build.share))
    out = Path(cfg.out)
    if place:
        _place_ready(out, index)
    if merge and not TaskedBuild(out).missing():
        return task_merge.merge(out)
    return None


def _place_ready(out: Path, index: int) -> None:
    """Place task `index` and each later done task that was waiting for it, unless another
    process is placing one right now (that one is skipped: it is being done)."""
    build = TaskedBuild(out)
    if build.missing(index):
        return  # an earlier task is unfinished: the task finishing it will place this one
    for i in range(index, build.tasks):
        if not build.is_done(i):
            break
        if i == index:  # its own placement is checked, and placed again if damaged
            place(out, i, wait=False, build=build, check="sha256")
        elif build.placed(i) is None:
            place(out, i, wait=False, build=build)


def place_task(out: Path, index: int) -> None:
    """Phase 2 for task `index`: its interior shards (parallel over tasks, idempotent; a
    placement already there is checked by its files' sizes, a stat each, and placed again if
    damaged: its task, run again, checks their sha256 too)."""
    place(Path(out), index, wait=True, check="size")


def task_status(out: Path) -> dict:
    """{"tasks": N, "done": [...], "placed": [...], "missing": [...]} of a build split into
    tasks (SettingsError if OUT holds none). A damaged placed.json counts as not placed (the
    placement or the merge names it)."""
    build = TaskedBuild(Path(out))
    return {"tasks": build.tasks,
            "done": [i for i in range(build.tasks) if build.is_done(i)],
            "placed": [i for i in range(build.tasks) if _is_placed(build, i)],
            "missing": build.missing()}


def _is_placed(build: TaskedBuild, i: int) -> bool:
    try:
        return build.placed(i) is not None
    except TaskDamaged:
        return False


def tasks_from_env() -> int | None:
    """--tasks when not given: LONGPACK_TASK_COUNT, else a Slurm array's size, else None (1).
    Read by the command line only (cli.py): settings never read the environment."""
    for name in ("LONGPACK_TASK_COUNT", "SLURM_ARRAY_TASK_COUNT"):
        if name in os.environ:
            return _env_int(name)
    return None


def task_index_from_env() -> int | None:
    """--task-index when not given: LONGPACK_TASK_INDEX, else a Slurm array element's index
    (counted from the array's first index), else None (every task in turn)."""
    if "LONGPACK_TASK_INDEX" in os.environ:
        return _env_int("LONGPACK_TASK_INDEX")
    if "SLURM_ARRAY_TASK_ID" in os.environ:
        return _env_int("SLURM_ARRAY_TASK_ID") - _env_int("SLURM_ARRAY_TASK_MIN", 0)
    return None


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{name}={value!r} in the environment is not a task number") from None


def config_record(cfg: BuildConfig) -> dict:
    """tasks.json's copy of the settings: the merge (which may run elsewhere) rebuilds the
    BuildConfig from it."""
    return settings_of(cfg, "output", "recorded", "run")
