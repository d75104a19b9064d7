"""Where `pack build` runs: this process (one build, one task of a split build, or every task in
turn), a Ray cluster (engine_ray.py) or a Slurm array job (engine_slurm.py). The flags here
choose the machines, never the bytes: BuildConfig holds everything that shapes the output."""

from dataclasses import dataclass

from longpack.errors import SettingsError
from longpack.settings import setting
from pipeline.config import BuildConfig

ENGINES = ("local", "ray", "slurm")


@dataclass(frozen=True)
class LaunchConfig:
    engine: str = setting("local", "Where the tasks run: local (this process: the task of "
                          "--task-index, else every task in turn), ray (a Ray cluster), slurm "
                          "(an sbatch array job and a dependent merge job).", choices=ENGINES)
    ray_address: str | None = setting(None, "--engine ray: the cluster's address (ray.init's) "
                                      "[a local cluster].", metavar="ADDR")
    slurm_option: tuple[str, ...] = setting((), "--engine slurm: an #SBATCH option for its jobs, "
                                            "e.g. --partition=cpu (repeatable).", multiple=True,
                                            metavar="OPT")
    wait: bool = setting(False, "--engine slurm: wait for the merge job; exit with its status.",
                         switch=True, show_default=False)
    dry_run: bool = setting(False, "--engine slurm: print the batch scripts, submit nothing.",
                            switch=True, show_default=False)
    merge: bool = setting(True, "A task that finds every task done merges the build (--no-merge: "
                          "leave that to `pack merge`).")

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise SettingsError(f"--engine must be one of {', '.join(ENGINES)}")
        if self.ray_address and self.engine != "ray":
            raise SettingsError("--ray-address needs --engine ray")
        if (self.slurm_option or self.wait or self.dry_run) and self.engine != "slurm":
            raise SettingsError("--slurm-option, --wait and --dry-run need --engine slurm")


@dataclass
class Outcome:
    manifest: dict | None = None  # OUT is complete: its manifest
    message: str | None = None  # otherwise, what was done
    exit_code: int = 0
    already_complete: bool = False  # OUT was complete before: nothing was written


def launch(cfg: BuildConfig, how: LaunchConfig, show_progress: bool | None) -> Outcome:
    """Run the build where `how` says."""
    if how.engine == "ray":
        from pipeline.distribute.engine_ray import build_with_ray

        return Outcome(build_with_ray(cfg, how.ray_address, show_progress))
    if how.engine == "slurm":
        from pipeline.distribute.engine_slurm import build_with_slurm

        return Outcome(exit_code=build_with_slurm(cfg, how.slurm_option, how.wait, how.dry_run))
    from pipeline.distribute import tasks

    index = cfg.task_index
    if cfg.tasks == 1 and index in (None, 0) and not _is_tasked(cfg):
        from longpack.store import is_url

        if is_url(cfg.out):
            from pipeline.store.remote_build import RemoteBuild as Build
        else:
            from pipeline.build import Build
        build = Build(cfg, show_progress=show_progress)
        manifest = build.run()
        return Outcome(manifest, already_complete=build.already_complete)
    if index is None:  # every task here, one after another
        manifest = None
        for i in range(cfg.tasks):
            manifest = tasks.run_task(cfg, i, merge=how.merge, show_progress=show_progress)
        return Outcome(manifest, None if manifest else
                       f"pack build: all {cfg.tasks} tasks done; `pack merge {_work_out(cfg)}` "
                       "merges them")
    manifest = tasks.run_task(cfg, index, merge=how.merge, show_progress=show_progress)
    if manifest is not None:
        return Outcome(manifest)
    work = _work_out(cfg)
    left = tasks.task_status(work)["missing"]
    return Outcome(message=f"pack build: task {index} of {cfg.tasks} done; " + (
        f"{len(left)} still to run ({', '.join(map(str, left[:20]))}{', ...' if len(left) > 20 else ''})"
        if left else f"all done: `pack merge {work}` merges them"))


def _work_out(cfg: BuildConfig) -> str:
    """Where the build's tasks work: --out, or the staging folder of an --out URL."""
    from pipeline.store.remote_build import staged

    return staged(cfg)[0].out


def _is_tasked(cfg: BuildConfig) -> bool:
    """A build started as tasks goes on as tasks, even with --tasks 1."""
    from pathlib import Path

    from pipeline.config import WORK_DIR
    from pipeline.store.output_dir import TASKS

    return (Path(_work_out(cfg)) / WORK_DIR / TASKS).is_file() and not cfg.overwrite
