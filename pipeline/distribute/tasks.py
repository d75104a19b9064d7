"""`pack build --tasks N`: one build split over N tasks (processes, machines, Ray tasks, Slurm
array elements), whose merged output is byte-identical to the single-machine build.

    prepare_tasks(cfg)        check OUT as a build does, record the tasks (tasks.json)
    run_task(cfg, i)          task i: tokenize its share (task_build.py), place its shards if the
                              tasks before it are done, merge if it is the last one done
    place_task(out, i)        phase 2, parallel over tasks: task i's interior shards
    merge(out)                the rest, and the dataset appears under OUT (merge.py)

docs/SCALE.md explains the design and its costs; docs/FORMAT.md the work folder.
"""

import os
from pathlib import Path

from longpack.core import SettingsError
from longpack.pipeline.build import Build
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.distribute import merge as task_merge
from longpack.pipeline.distribute.task_build import TaskOutput, TaskProgress, TaskReports, prepare_work
from longpack.pipeline.distribute.work_folder import TaskDamaged, TaskedBuild, TasksUnfinished
from longpack.pipeline.progress import Progress
from longpack.pipeline.store.destination import Destination

__all__ = ["TaskProgress", "TasksUnfinished", "merge", "place_task",
           "prepare_tasks", "run_task", "task_index_from_env", "tasks_from_env", "task_status"]

merge = task_merge.merge


def prepare_tasks(cfg: BuildConfig, hub_client=None, dest: Destination | None = None
                  ) -> dict | None:
    """Check OUT and record the tasks; the finished build's manifest if OUT already holds this
    very build (nothing to do), else None. Idempotent: every task does it too. An --out URL:
    the tasks run in its staging folder (`dest.local`), which every task must see."""
    dest = dest or Destination.of(cfg)
    cfg = dest.local_config(cfg)
    with Build(cfg, hub_client) as build:
        return prepare_work(cfg, build.fingerprint, dest.url)


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
    cfg = dest.local_config(cfg)
    progress = Progress(enabled=show_progress) if report is None else TaskReports(index, report)
    output = TaskOutput(cfg, index, dest.url)
    with Build(cfg, hub_client, progress, task=index) as build:
        record = build.run(output)
    if output.already_complete:  # OUT holds this very build, finished: its manifest
        return record
    out = Path(cfg.out)
    return task_merge.after_task(out, index, place_ready=place, merge_done=merge)


def place_task(out: Path, index: int) -> None:
    """Phase 2 for task `index`: its interior shards (parallel over tasks, idempotent; a
    placement already there is checked by its files' sizes, a stat each, and placed again if
    damaged: its task, run again, checks their sha256 too)."""
    task_merge.place(Path(out), index, wait=True, check="size")


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
