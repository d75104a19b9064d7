"""`pack build --engine slurm --wait`: follow the tasks and merge array jobs (engine_slurm.py)
until the build is finished or cannot be, by polling squeue.

Why not `sbatch --wait` on the merge job: when a task fails, the merge's afterok dependency can
never be met, and unless the cluster honours --kill-on-invalid-dep the merge job stays pending
with reason DependencyNeverSatisfied, so `sbatch --wait` would wait forever. Polling sees that,
cancels the merge job, and meanwhile prints how the tasks go. Why squeue and not sacct: sacct
needs job accounting, which small clusters (and the test one) do not run; squeue keeps an ended
job for MinJobAge (300 s by default), far longer than one poll. One poll is one squeue call for
both jobs, every `poll_s` seconds (5 by default: negligible load on slurmctld).
"""

import getpass
import subprocess
import time
from pathlib import Path

import click

from longpack.core import LongpackError, SettingsError

# States after which an element will not run again by itself (PREEMPTED and REQUEUED go back
# to PENDING on a job submitted with --requeue).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
         "BOOT_FAIL", "DEADLINE"}
SQUEUE_GIVE_UP_S = 300  # slurmctld unreachable this long: stop waiting (the jobs go on)
LISTED = 5  # failed tasks named one by one in the final line; the rest are counted
# Slurm (22.05 here) shows a requeued element as FAILED for a moment before it is pending again,
# and that moment is enough for it to cancel the merge job (afterok can no longer be met):
# before calling a build failed, look again this much later; and once every task is done,
# submit the merge again rather than report a failure.
SETTLE_S = 5.0


def command(args: list[str]) -> subprocess.CompletedProcess:
    """Run a Slurm command; one that cannot start at all is a SettingsError."""
    try:
        return subprocess.run(args, capture_output=True, text=True, check=False)
    except OSError as e:
        raise SettingsError(f"--engine slurm: cannot run {args[0]}: {e.strerror or e}") from None


def queue(job_ids: list[str]) -> dict[tuple[str, int], tuple[str, str]] | None:
    """(job id, array index) -> (state, reason) of each element squeue still knows about; None
    when squeue cannot answer (slurmctld busy or down)."""
    done = command(["squeue", "--noheader", "--array", "--states=all", "--jobs", ",".join(job_ids),
                 "--format=%F|%K|%T|%r"])
    if done.returncode != 0:
        # every id purged (ended more than MinJobAge ago): squeue refuses the list
        return {} if "Invalid job id" in done.stderr else None
    rows = {}
    for line in done.stdout.splitlines():
        job, index, state, reason = line.strip().split("|", 3)
        if index.isdigit():
            rows[(job, int(index))] = (state, reason)
    return rows


def queued_jobs(folder: Path) -> dict[str, str]:
    """{job id: script name} of this user's jobs, queued or running, whose batch script lies in
    `folder`: how a second submission of a build finds the first (no record file to go stale:
    job ids restart with a fresh cluster)."""
    done = command(["squeue", "--noheader", f"--user={getpass.getuser()}", "--format=%F|%o"])
    if done.returncode != 0:
        raise SettingsError(f"squeue cannot list your jobs: {' '.join(done.stderr.split())}")
    jobs = {}
    for line in done.stdout.splitlines():
        job, _, script = line.strip().partition("|")
        if Path(script).parent == folder:
            jobs[job] = Path(script).name
    return jobs


def _counts(rows: dict, job: str) -> str:
    states = [state for (j, _), (state, _) in sorted(rows.items()) if j == job]
    seen = sorted(set(states), key=states.index)
    return ", ".join(f"{states.count(s)} {s.lower()}" for s in seen) or "gone from squeue"


def _last_line(log: Path) -> str:
    """The log's last line (a failed `pack` command's `Error:` line), or '' if unreadable."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode("utf-8", "replace").split("\n")
    except OSError:
        return ""
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last if len(last) <= 300 else last[:297] + "..."


def _named(what: str, indexes: list[int], states: dict, job: str, logs: Path, name: str) -> str:
    parts = []
    for i in indexes[:LISTED]:
        state = states.get((job, i), ("not seen in squeue", ""))[0]
        log = logs / f"{name}-{i}.log"
        last = _last_line(log)
        parts.append(f"{what} {i} {state} (log {log}" + (f": {last})" if last else ")"))
    if len(indexes) > LISTED:
        parts.append(f"and {len(indexes) - LISTED} more {what}s")
    return "; ".join(parts)


def _all_tasks_done(out: str) -> bool:
    from longpack.pipeline.distribute.tasks import task_status

    try:
        return not task_status(Path(out))["missing"]
    except LongpackError:
        return False


def _failure(out: str, logs: Path, tasks_job: str, merge_job: str, states: dict,
             cancelled: bool) -> str:
    from longpack.pipeline.distribute.tasks import task_status

    try:
        missing = task_status(Path(out))["missing"]
    except LongpackError:  # no record of the tasks left: go by what Slurm said
        missing = sorted(i for (job, i), (state, _) in states.items()
                         if job == tasks_job and state != "COMPLETED")
    if missing:
        merge = (f"; merge job {merge_job} cancelled (its dependency can never be met)"
                 if cancelled else "")
        return (f"the build did not finish: {_named('task', missing, states, tasks_job, logs, 'task')}"
                f"{merge}. Fix the cause and re-run the same command: finished tasks are not "
                "redone")
    failed = sorted(i for (job, i), (state, _) in states.items()
                    if job == merge_job and state != "COMPLETED")
    return (f"every task finished but the merge did not: "
            f"{_named('merge element', failed, states, merge_job, logs, 'merge')}. "
            f"`pack merge {out}` finishes it")


def wait_for_build(out: str, logs: Path, tasks_job: str, merge_job: str, poll_s: float,
                   resubmit_merge=None, shown_as: str | None = None) -> int:
    """Poll until the merge job has ended (or never can); 0 if OUT/manifest.json is there,
    else 1 with one line naming the unfinished tasks and their logs (in `logs`).
    `resubmit_merge()`: submits the merge job again, without a dependency, returning its id:
    for a merge Slurm cancelled although every task ended done (a requeue, above). `shown_as`:
    the build's name in the summary (an --out URL, whose OUT here is its staging folder)."""
    from longpack.pipeline.manifest import summary

    states: dict[tuple[str, int], tuple[str, str]] = {}
    start = time.monotonic()
    shown = unanswered_since = None
    cancelled = settled = resubmitted = False
    try:
        while True:
            rows = queue([tasks_job, merge_job])
            if rows is None:
                unanswered_since = unanswered_since or time.monotonic()
                if time.monotonic() - unanswered_since > SQUEUE_GIVE_UP_S:
                    raise SettingsError(f"squeue has not answered for {SQUEUE_GIVE_UP_S} s; the "
                                        f"jobs go on: follow them with squeue -j "
                                        f"{tasks_job},{merge_job}")
                time.sleep(poll_s)
                continue
            unanswered_since = None
            states.update(rows)
            line = f"tasks job {tasks_job}: {_counts(rows, tasks_job)}; merge job {merge_job}: " \
                   f"{_counts(rows, merge_job)}"
            if line != shown:
                elapsed = int(time.monotonic() - start)
                click.echo(f"[{elapsed // 60}m{elapsed % 60:02d}s] {line}")
                shown = line
            if not any(j == tasks_job and s not in ENDED for (j, _), (s, _) in rows.items()):
                merge = [(s, r) for (j, _), (s, r) in rows.items() if j == merge_job]
                never = any(r == "DependencyNeverSatisfied" and s not in ENDED for s, r in merge)
                if never:
                    command(["scancel", merge_job])
                if never or all(s in ENDED for s, _ in merge):
                    cancelled = never or any(r == "DependencyNeverSatisfied" for _, r in merge)
                    if (Path(out) / "manifest.json").is_file():
                        break
                    if not settled:
                        settled = True
                        time.sleep(SETTLE_S)
                        continue
                    if cancelled and resubmit_merge and not resubmitted and _all_tasks_done(out):
                        merge_job, resubmitted, cancelled, settled = resubmit_merge(), True, \
                            False, False
                        click.echo(f"every task is done but Slurm cancelled the merge job (a "
                                   f"requeued task counted as failed for a moment): merge job "
                                   f"{merge_job} submitted again")
                        continue
                    break
            settled = False
            time.sleep(poll_s)
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: jobs {tasks_job} and {merge_job} go on running (squeue -j "
                   f"{tasks_job},{merge_job}; scancel {tasks_job} {merge_job} stops them)",
                   err=True)
        return 130
    manifest = Path(out) / "manifest.json"
    if manifest.is_file():
        import json

        click.echo(summary(json.loads(manifest.read_text(encoding="utf-8")), shown_as or str(out)))
        return 0
    click.echo(f"Error: {_failure(out, logs, tasks_job, merge_job, states, cancelled)}", err=True)
    return 1
