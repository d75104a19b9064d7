"""--engine local (the default): the build in this process; with --tasks N, the task of
--task-index, or every task in turn (launch.py registers it)."""

from longpack.pipeline.config import BuildConfig
from longpack.pipeline.distribute.launch import LaunchConfig, Outcome
from longpack.pipeline.store.destination import Destination


def run(cfg: BuildConfig, how: LaunchConfig, dest: Destination,
        show_progress: bool | None) -> Outcome:
    """The build in this process, or its task --task-index, or every task in turn."""
    from longpack.pipeline.distribute import tasks

    index = cfg.task_index
    if cfg.tasks == 1 and index in (None, 0) and not _is_tasked(cfg, dest):
        from longpack.pipeline.build import Build
        from longpack.pipeline.progress import Progress

        local = dest.local_config(cfg)
        output = dest.output(local)
        with Build(local, progress=Progress(enabled=show_progress)) as build:
            manifest = build.run(output)
        return Outcome(manifest, already_complete=output.already_complete)
    manifest = None
    for i in range(cfg.tasks) if index is None else (index,):  # every task in turn, or one
        manifest = tasks.run_task(cfg, i, merge=how.merge, show_progress=show_progress,
                                  dest=dest)
    if manifest is not None:
        return Outcome(manifest)
    if index is None:
        return Outcome(message=f"pack build: all {cfg.tasks} tasks done; `pack merge "
                               f"{dest.local}` merges them")
    work = dest.local
    left = tasks.task_status(work)["missing"]
    return Outcome(message=f"pack build: task {index} of {cfg.tasks} done; " + (
        f"{len(left)} still to run ({', '.join(map(str, left[:20]))}{', ...' if len(left) > 20 else ''})"
        if left else f"all done: `pack merge {work}` merges them"))


def _is_tasked(cfg: BuildConfig, dest: Destination) -> bool:
    """A build started as tasks goes on as tasks, even with --tasks 1."""

    from longpack.pipeline.config import WORK_DIR
    from longpack.pipeline.store.output_dir import TASKS

    return (dest.local / WORK_DIR / TASKS).is_file() and not cfg.overwrite
