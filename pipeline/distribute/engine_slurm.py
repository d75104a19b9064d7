"""`pack build --engine slurm --tasks N`: the tasks of a build (tasks.py) as two Slurm
array jobs, written to OUT/.longpack-build/slurm/ and submitted with sbatch.

    tasks.sbatch   --array=0-(N-1), element I: `pack build <settings> --tasks N --task-index I
                   --no-merge` (--requeue: a requeued element resumes from its checkpoint)
    merge.sbatch   --array=0-(N-1), --dependency=afterok:<tasks job>: element I: `pack merge OUT
                   --task-index I` (places task I's shards; the last one to end finishes)

The merge is an array too so that placing the shards stays parallel over tasks (docs/SCALE.md).
Each element logs to task-I.log / merge-I.log beside the scripts, appending, so a requeued
element's earlier attempts stay readable. `--slurm-option` lines come after longpack's own
`#SBATCH` lines: where both set an option, Slurm takes the last, the user's.
--wait polls squeue (slurm_wait.py says why not `sbatch --wait`).
"""

import re
import shlex
import shutil
import sys
from pathlib import Path

import click

from longpack.core import SettingsError, to_flags, write_bytes
from longpack.pipeline.config import WORK_DIR, BuildConfig
from longpack.pipeline.distribute.slurm_wait import command, queued_jobs, wait_for_build
from longpack.pipeline.store.destination import Destination

SLURM_DIR = "slurm"  # OUT/WORK_DIR/SLURM_DIR: the scripts and the logs
# Set by the engine itself: a user's value would break the one-element-per-task layout, the
# merge's dependency or the log files --wait names.
_RESERVED = {"--array": "-a", "--dependency": "-d", "--output": "-o", "--error": "-e"}


def slurm_folder(out: str | Path) -> Path:
    return Path(out).absolute() / WORK_DIR / SLURM_DIR


def pack_command() -> str:
    """The `pack` of the running interpreter, so every node runs this very install."""
    beside = Path(sys.executable).parent / "pack"
    found = str(beside) if beside.is_file() else shutil.which("pack")
    if found is None:
        raise SettingsError(f"--engine slurm: no `pack` command beside {sys.executable} or on "
                            "PATH; install longpack (pip install -e .) in the environment the "
                            "nodes will use")
    return found


def check_options(options: tuple[str, ...]) -> None:
    for option in options:
        name = re.split(r"[=\s]", option.strip(), maxsplit=1)[0]
        if not option.startswith("-") or "\n" in option or "\r" in option:
            raise SettingsError(f"--slurm-option {option!r}: give one sbatch option as it "
                                "would follow #SBATCH, e.g. --partition=cpu or --time=04:00:00")
        for long, short in _RESERVED.items():
            # sbatch takes any unambiguous prefix of a long option, and a short one's value
            # may follow it directly (-a0-3)
            if (long.startswith(name) and len(name) > 3 if name.startswith("--")
                    else name[:2] == short):
                raise SettingsError(f"--slurm-option {option!r}: longpack sets {long} itself "
                                    "(one array element per task, the merge's dependency, the "
                                    f"logs in {WORK_DIR}/{SLURM_DIR})")


def _header(job_name: str, tasks: int, cpus: int, log: Path, options: tuple[str, ...],
            extra: tuple[str, ...] = ()) -> list[str]:
    lines = [f"--job-name={shlex.quote(job_name)}", f"--array=0-{tasks - 1}", "--ntasks=1",
             f"--cpus-per-task={cpus}", "--requeue", "--open-mode=append",
             f"--output={shlex.quote(str(log))}", f"--chdir={shlex.quote(str(Path.cwd()))}",
             *extra, *options]
    return ["#!/bin/bash"] + [f"#SBATCH {line}" for line in lines]


def _started(what: str, tasks: int) -> str:
    """The line each attempt of an element writes first: its log appends across requeues."""
    return (f'echo "longpack: {what} ${{SLURM_ARRAY_TASK_ID}} of {tasks}, job ${{SLURM_JOB_ID}}, '
            'attempt $((${SLURM_RESTART_COUNT:-0} + 1)) on $(hostname) at '
            '$(date -u +%Y-%m-%dT%H:%M:%SZ)"')


def scripts(cfg: BuildConfig, options: tuple[str, ...], dest: Destination | None = None
            ) -> tuple[str, str]:
    """(tasks.sbatch, merge.sbatch). --overwrite is not repeated: the launcher's prepare_tasks
    has already replaced the old build, and a requeued element must join the build under way."""
    pack, n, name = pack_command(), cfg.tasks, Path(cfg.out).absolute().name
    work = str((dest or Destination.of(cfg)).local)  # --out, or the staging folder of a URL
    # every setting but the once-only ones; --tasks goes last, beside the element's index
    flags = to_flags(cfg, skip=("tasks",), roles=("output", "recorded", "run"))
    build = " ".join(shlex.quote(part) for part in [pack, "build", *flags, "--tasks", str(n)])
    tasks = _header(f"longpack-{name}", n, cfg.workers, slurm_folder(work) / "task-%a.log",
                    options)
    tasks += ["", f"# task I of {n}: tokenize its share of the inputs into OUT/{WORK_DIR}/task.I/",
              "# (a requeued element resumes from its checkpoint)",
              _started("task", n),
              f'exec {build} --task-index "$SLURM_ARRAY_TASK_ID" --no-merge', ""]
    merge = _header(f"longpack-{name}-merge", n, 1, slurm_folder(work) / "merge-%a.log",
                    options, ("--kill-on-invalid-dep=yes",))
    merge += ["", "# once every task is done: place task I's shards; the element that places the",
              "# last one finishes the build", _started("merge of task", n),
              f"exec {shlex.quote(pack)} merge {shlex.quote(work)} "
              '--task-index "$SLURM_ARRAY_TASK_ID"', ""]
    return "\n".join(tasks), "\n".join(merge)


def submit(script: Path, *extra: str) -> str:
    """Submit `script`; its job id. A refusal is one SettingsError carrying sbatch's words."""
    done = command(["sbatch", "--parsable", *extra, str(script)])
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise SettingsError(f"sbatch refused {script.name}: {said}")
    return done.stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"


def _max_array_size() -> int | None:
    done = command(["scontrol", "show", "config"]) if shutil.which("scontrol") else None
    found = done and re.search(r"^MaxArraySize\s*=\s*(\d+)", done.stdout, re.MULTILINE)
    return int(found.group(1)) if found else None


def _refuse_running_jobs(out: str) -> None:
    """Two submissions of one build would run each task twice at once: refuse the second while
    the first's jobs are queued or running."""
    jobs = queued_jobs(slurm_folder(out))
    if jobs:
        ids = " ".join(sorted(jobs, key=int))
        raise SettingsError(f"{out} is already being built by Slurm job(s) {ids} (queued or "
                            f"running): wait for them (squeue -j {ids.replace(' ', ',')}) or "
                            f"stop them (scancel {ids}) first")


def run(cfg: BuildConfig, how, dest: Destination, show_progress: bool | None):
    """--engine slurm (launch.py): the tasks and the merge submitted as array jobs."""
    from longpack.pipeline.distribute.launch import Outcome

    return Outcome(exit_code=build_with_slurm(cfg, how.slurm_option, how.wait, how.dry_run,
                                              dest=dest))


def build_with_slurm(cfg: BuildConfig, options: tuple[str, ...], wait: bool, dry_run: bool,
                     poll_s: float = 5.0, dest: Destination | None = None) -> int:
    """Submit the build's tasks and merge as Slurm array jobs (--dry-run: print them); with
    `wait`, wait for the merge. The exit status for `pack build`."""
    check_options(options)
    dest = dest or Destination.of(cfg)
    tasks_script, merge_script = scripts(cfg, options, dest)
    work = str(dest.local)
    folder = slurm_folder(work)
    if dry_run:
        click.echo(f"# {folder / 'tasks.sbatch'}   (sbatch --parsable tasks.sbatch)")
        click.echo(tasks_script)
        click.echo(f"# {folder / 'merge.sbatch'}   (sbatch --parsable "
                   "--dependency=afterok:<tasks job id> merge.sbatch)")
        click.echo(merge_script)
        click.echo("dry run: nothing written, nothing submitted")
        return 0
    if shutil.which("sbatch") is None:
        raise SettingsError("--engine slurm needs Slurm's sbatch on PATH (run it on a login "
                            "node of the cluster; --dry-run prints the scripts)")
    limit = _max_array_size()
    if limit is not None and cfg.tasks > limit:
        raise SettingsError(f"--tasks {cfg.tasks}: this cluster's MaxArraySize is {limit}, so an "
                            f"array holds at most {limit} tasks; use --tasks {limit} or fewer")
    _refuse_running_jobs(work)
    from longpack.pipeline.distribute import tasks
    from longpack.pipeline.manifest import already_complete, summary

    finished = tasks.prepare_tasks(cfg, dest=dest)
    if finished is not None:
        click.echo(already_complete(finished, cfg.out))
        click.echo(summary(finished, cfg.out))
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    write_bytes(folder / "tasks.sbatch", tasks_script.encode())
    write_bytes(folder / "merge.sbatch", merge_script.encode())
    tasks_job = submit(folder / "tasks.sbatch")
    try:
        merge_job = submit(folder / "merge.sbatch", f"--dependency=afterok:{tasks_job}")
    except SettingsError:
        command(["scancel", tasks_job])  # tasks with no merge after them would only mislead
        raise
    click.echo(f"submitted tasks job {tasks_job} (array 0-{cfg.tasks - 1}, one element per "
               f"task) and merge job {merge_job} (afterok:{tasks_job})")
    click.echo(f"logs: {folder}/task-<I>.log, merge-<I>.log; follow: squeue -j "
               f"{tasks_job},{merge_job}")
    if not wait:
        return 0
    return wait_for_build(work, folder, tasks_job, merge_job, poll_s,
                          resubmit_merge=lambda: submit(folder / "merge.sbatch"),
                          shown_as=cfg.out)

