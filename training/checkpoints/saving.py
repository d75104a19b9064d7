"""Writing a checkpoint: RUN/step-NNNNNNNN/ whole or not at all (checkpoint.py says what it
holds and how a run reads it back). Every process calls `save`; its stages (folders, the
tensors, state.pt and COMPLETE, the rename) are each agreed on by all processes, so a failure on
one (a full disk, a name in the way) stops all of them in one line naming the cause and the
checkpoint a re-run resumes from, the temporary folder removed, never a hang. Nothing is
written, renamed or removed through a symlink; `check_names` refuses one at a name the run
writes before its first step.
"""

import contextlib
import io
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from longpack.core import TEMP_NAME, TrainingError, remedy, sha256_file, write_bytes
from longpack.training.checkpoints.checkpoint import (
    RECORD,
    STEP_NAME,
    checkpoints,
    is_checkpoint,
    not_a_checkpoint,
    save_parts,
    to_remove,
)
from longpack.training.parallel import distributed, fsdp
from longpack.training.step import TrainState


def save(run: Path, step: int, s: TrainState, state: dict, keep_last: int,
         procs: distributed.Processes) -> Path | None:
    """Checkpoint step `step`: every process calls it (a sharded model's each write their
    part); rank 0 writes state.pt and COMPLETE. Returns the folder on rank 0. A save that
    cannot finish (a full disk, a name in the way) stops every process with one TrainingError
    naming the cause and the checkpoint a re-run resumes from, its temporary folder removed;
    nothing is written, renamed or removed through a symlink (check_names refuses them at
    the start, _begin and _publish here)."""
    final = run / f"step-{step:08d}"
    tmp = run / f".step-{step:08d}.tmp"
    main = procs.main
    _together(lambda: _begin(run, tmp, final) if main else None, run, tmp, step, procs)
    # A sharded model: every process writes its part, returning once all have written. Else
    # the first process holds the whole model and writes it alone, as the rest of the
    # checkpoint, so DDP's machines need no shared disk. The param_groups go in state.pt.
    sharded = fsdp.is_sharded(s.model)
    groups = _together(lambda: save_parts(tmp, s.model, s.optimizers, distributed=sharded)
                       if sharded or main else None, run, tmp, step, procs)
    _together(lambda: _seal(tmp, step, {**state, "param_groups": groups}) if main else None,
              run, tmp, step, procs)
    _together(lambda: _publish(run, tmp, final, keep_last) if main else None,
              run, tmp, step, procs)
    return final if main else None


class _InTheWay(TrainingError):
    """A name a save writes, held by what the run may not write through or remove."""


def _begin(run: Path, tmp: Path, final: Path) -> None:
    """The run folder and an empty temporary folder, once the names are known to be free."""
    run.mkdir(parents=True, exist_ok=True)
    _refuse_in_the_way(final)
    if tmp.is_symlink() or (tmp.exists() and not tmp.is_dir()):
        what = f"a symlink (to {os.readlink(tmp)})" if tmp.is_symlink() else "a file"
        raise _InTheWay(f"{tmp} is {what} at its temporary name, which a run never writes "
                        "through nor removes")
    shutil.rmtree(tmp, ignore_errors=True)  # a save cut short (rmtree unlinks links inside)
    tmp.mkdir()


def _seal(tmp: Path, step: int, state: dict) -> None:
    """state.pt, then COMPLETE: the sha256 of every file and the record naming the step."""
    buffer = io.BytesIO()  # torch's own file writer would turn a full disk into "write failed"
    torch.save(state, buffer)
    (tmp / "state.pt").write_bytes(buffer.getbuffer())
    files = sorted(p.name for p in tmp.iterdir())
    (tmp / "COMPLETE").write_text(
        "".join(f"{sha256_file(tmp / name)}  {name}\n" for name in files)
        + RECORD.format(step) + "\n")


def _publish(run: Path, tmp: Path, final: Path, keep_last: int) -> None:
    """The whole checkpoint in place (this run's older one of the step replaced, anything else
    there refused), `latest` pointed at it, and the checkpoints it supersedes removed."""
    _refuse_in_the_way(final)  # again: the folder may have changed while the parts were written
    latest = run / "latest"
    if latest.is_symlink():  # renaming over it would not follow it, but remove another's link
        raise _InTheWay(f"{latest} is a symlink (to {os.readlink(latest)}) where this run names "
                        "its newest checkpoint, which a run never writes through nor removes")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    write_bytes(run / "latest", (final.name + "\n").encode())
    for old in to_remove([p.name for p in checkpoints(run)], final.name, keep_last):
        shutil.rmtree(run / old, ignore_errors=True)


def _refuse_in_the_way(final: Path) -> None:
    if final.is_symlink():  # dangling or not: never followed, never removed
        raise _InTheWay(f"{final} is a symlink (to {os.readlink(final)}) in the way of it, "
                        "which a run never writes through nor removes")
    if final.exists() and not is_checkpoint(final):
        raise _InTheWay(f"{final} is in the way of it and was not written by this run "
                        f"({not_a_checkpoint(final)}), so it is left as it is")


def _together(work, run: Path, tmp: Path, step: int, procs: distributed.Processes):
    """work()'s result on this process, once every process has learned whether it failed on
    any (a collective, in place of a barrier: no process waits for one that stopped). On a
    failure every process raises (_failed_save), rank 0 having removed the temporary folder."""
    failure = result = None
    try:
        result = work()
    except (Exception, CheckpointException) as e:  # DCP's is a BaseException
        failure = e
    except BaseException:  # a second Ctrl+C: the temporary folder goes all the same
        if procs.main:
            _remove_temp(tmp)
        raise
    if distributed.anyone(failure is not None, procs):
        raise _failed_save(failure, run, tmp, step, procs)
    return result


def _failed_save(failure: BaseException | None, run: Path, tmp: Path, step: int,
                 procs: distributed.Processes) -> BaseException:
    """The error a failed save raises on this process: one line naming the cause and the
    checkpoint a re-run resumes from; a failure that is neither the disk's nor a name's (a
    bug) as it was, its traceback kept."""
    cause = fix = None
    if isinstance(failure, _InTheWay):
        cause, fix = str(failure), "move it out of the run folder"
    elif failure is not None:
        error = _os_error(failure) or _probe(tmp if tmp.is_dir() and not tmp.is_symlink()
                                             else run)
        if error is not None:
            cause, fix = f"{error.strerror or error} (writing in {run})", remedy(error)
    distributed.barrier(procs)  # every process's probe made before the temporary folder goes
    if procs.main:
        _remove_temp(tmp)
    if failure is not None and cause is None:
        return failure
    if cause is None:  # this process's part was written: another one failed, and says why
        cause, fix = "another process of the run could not write it", "see that one's error"
    return TrainingError(f"the checkpoint of step {step} was not saved: {cause}; {fix}, then "
                         f"re-run the same command: {resume_point(run)}")


def resume_point(run: Path) -> str:
    """Where a re-run of a run stopped now starts: its newest complete checkpoint."""
    done = checkpoints(run) if run.is_dir() else []
    return (f"it resumes from {done[-1]}, the run's newest complete checkpoint" if done else
            "the run has no complete checkpoint, so it trains from the start")


def _remove_temp(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind `error`: itself, its cause or context, or a process's failure inside
    DCP's CheckpointException."""
    todo, seen = [error], set()
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        todo += [e.__cause__, e.__context__]
        if isinstance(e, CheckpointException):
            todo += [f[0] if isinstance(f, tuple) else f for f in (e.failures or {}).values()]
    return None


def _probe(folder: Path) -> OSError | None:
    """The OSError that writing 1 MiB in `folder` meets now (a full disk, a quota), or None.
    DCP's writer, torch.save within it, loses the OSError of a failed write (a RuntimeError
    "unexpected pos"); the disk it filled is still full until the temporary folder goes."""
    try:
        fd, name = tempfile.mkstemp(prefix=".probe-", dir=folder)
    except OSError as e:
        return e
    try:
        data = memoryview(bytes(1 << 20))
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
        return None
    except OSError as e:
        return e
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


# The names a run writes in its folder (save, MetricsLog; `latest` and metrics.jsonl through
# atomic.write_bytes's temporary names), none of which may be a symlink (check_names)
TEMP_FOLDER = re.compile(r"\.step-\d{8}\.tmp")  # save's `tmp`
FILES = ("latest", "metrics.jsonl")  # the names of WRITTEN that are files, not folders
WRITTEN = {STEP_NAME: "where this run saves a checkpoint",
           TEMP_FOLDER: "where this run writes a checkpoint before renaming it",
           re.compile(r"latest"): "where this run names its newest checkpoint",
           re.compile(r"metrics\.jsonl"): "where this run writes its metrics"}


def check_names(run: Path) -> None:
    """Before a run trains a step: refuse in one line a run folder whose saves would fail after
    steps were trained, or write outside it. The folder (or its nearest existing parent) must
    be a writable folder; no name the run writes in it (WRITTEN, and those names' atomic
    temporary names) may be a symlink, dangling or not, nor anything inside a save's leftover
    temporary folder. Costs one listing of the run folder."""
    where = run
    while not os.path.lexists(where) and where.parent != where:
        where = where.parent
    if where.is_symlink() and not where.exists():
        target = os.readlink(where)
        raise TrainingError(f"{where} is a symlink to {target}, which does not exist, so the "
                            f"run folder {run} cannot be made; create {target} or remove the "
                            "link, or pass another --out")
    if not where.is_dir():
        raise TrainingError(f"{where} is a file, not a folder, so the run folder {run} cannot "
                            "be made there; pass another --out")
    if not os.access(where, os.W_OK | os.X_OK):
        raise TrainingError(f"{where} cannot be written (read-only, or not yours), so the run "
                            f"could not save its checkpoints in {run}; make it writable or "
                            "pass another --out")
    if where != run:
        return
    for entry in sorted(os.scandir(run), key=lambda e: e.name):
        temp = TEMP_NAME.fullmatch(entry.name)
        name = temp["name"] if temp else entry.name
        role = next((what for pattern, what in WRITTEN.items() if pattern.fullmatch(name)), None)
        if role is None:
            continue
        if entry.is_symlink():
            _refuse_link(Path(entry.path), f"where this run writes {name} before renaming it"
                         if temp else role)
        elif name in FILES and not temp and not entry.is_file(follow_symlinks=False):
            raise TrainingError(f"{entry.path} is not a file, {role}; move it out of the run "
                                "folder, then re-run the same command (no step was trained)")
        elif TEMP_FOLDER.fullmatch(entry.name) and not entry.is_dir(follow_symlinks=False):
            raise TrainingError(f"{entry.path} is not a folder, {role}; move it out of the run "
                                "folder, then re-run the same command (no step was trained)")
        elif TEMP_FOLDER.fullmatch(entry.name):
            for inner in os.scandir(entry.path):  # what a save cut short left there
                if inner.is_symlink():
                    _refuse_link(Path(inner.path), "in the folder a save cut short left")


def check_steps_free(run: Path, start: int, last: int) -> None:
    """Before a run trains a step: refuse in one line a folder or file at the name of a
    checkpoint the run may save, steps start + 1 to `last` (any of them, when a stop saves),
    that is not one of its checkpoints: the save there would refuse it (and leave it), losing
    the steps since the last checkpoint. Others' folders at later steps, which the run never
    writes, stay as they are. Costs one listing of the run folder."""
    if not run.is_dir():
        return
    for entry in sorted(os.scandir(run), key=lambda e: e.name):
        name = STEP_NAME.fullmatch(entry.name)
        if name is None or not start < int(name.group(1)) <= last or entry.is_symlink():
            continue  # a symlink: check_names has refused it already
        why = not_a_checkpoint(Path(entry.path))
        if why is not None:
            raise TrainingError(f"{entry.path} is where this run would save its checkpoint of "
                                f"step {int(name.group(1))}, and was not written by this run "
                                f"({why}); move it out of the run folder, then re-run the "
                                "same command (no step was trained)")


def _refuse_link(path: Path, where: str) -> None:
    raise TrainingError(f"{path} is a symlink (to {os.readlink(path)}) {where}, and a run never "
                        "writes through a link nor removes one; remove it, then re-run the same "
                        "command (no step was trained)")
