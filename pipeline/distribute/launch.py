"""Where `pack build` runs: this process (one build, one task of a split build, or every task in
turn), a Ray cluster (engine_ray.py) or a Slurm array job (engine_slurm.py). The flags here
choose the machines, never the bytes: BuildConfig holds everything that shapes the output.

An engine is a module with `run(cfg, how, dest, show_progress) -> Outcome`, registered in ENGINES
by name (loaded when chosen): adding one is its file and a line there, plus its options in
LaunchConfig when it has any."""

import importlib
from dataclasses import dataclass

from longpack.core import SettingsError, check, setting
from longpack.pipeline.config import BuildConfig

ENGINES = {  # name -> the module whose run() runs it
    "local": "longpack.pipeline.distribute.engine_local",
    "ray": "longpack.pipeline.distribute.engine_ray",
    "slurm": "longpack.pipeline.distribute.engine_slurm",
}


@dataclass(frozen=True)
class LaunchConfig:
    engine: str = setting("local", "Where the tasks run: local (this process: the task of "
                          "--task-index, else every task in turn), ray (a Ray cluster), slurm "
                          "(an sbatch array job and a dependent merge job).",
                          choices=ENGINES)
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
        check(self)  # each field's type, range and choices, as declared above
        if self.ray_address and self.engine != "ray":
            raise SettingsError("--ray-address needs --engine ray")
        if (self.slurm_option or self.wait or self.dry_run) and self.engine != "slurm":
            raise SettingsError("--slurm-option, --wait and --dry-run need --engine slurm")


@dataclass(frozen=True, kw_only=True)
class MergeConfig:
    """`pack merge OUT`'s settings."""

    out: str = setting(argument=True, path=True)
    task_index: int | None = setting(None, "Only place task I's shards (one such command per "
                                     "task, in parallel); the last one to finish merges.",
                                     metavar="I")

    def __post_init__(self):
        check(self)


@dataclass
class Outcome:
    manifest: dict | None = None  # OUT is complete: its manifest
    message: str | None = None  # otherwise, what was done
    exit_code: int = 0
    already_complete: bool = False  # OUT was complete before: nothing was written


def launch(cfg: BuildConfig, how: LaunchConfig, show_progress: bool | None,
           dest=None) -> Outcome:
    """Run the build where `how` says: its engine's run(), writing to `dest` (a
    store/destination.Destination, resolved by the command line; else from cfg)."""
    from longpack.pipeline.store.destination import Destination

    dest = dest or Destination.of(cfg)
    return importlib.import_module(ENGINES[how.engine]).run(cfg, how, dest, show_progress)
