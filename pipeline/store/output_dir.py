"""What a build may remove or replace in --out: only files it can prove it wrote.

A build writes OUT/manifest.json, OUT/skipped.jsonl, shards and index.json in OUT/train/ and
OUT/val/, and its work folder OUT/.longpack-build/. A file there is the build's own when
  - a finished build's manifest.json lists it (manifest.json itself, skipped.jsonl, the copy of
    its tokenizer, each split's index.json, and the shards that index.json lists);
  - an unfinished build's journal lists it: `.longpack-build/outputs.txt` records every path
    outside the work folder before the file is created, so a build killed in between leaves
    no file unlisted;
  - it is in the work folder under a name the build gives its files there;
  - it is `.NAME.tmpPID` (atomic.temp_name) of one of those: left by a killed write. With the
    lock held no other writer can own it, so it is removed before the build goes on, and a
    resumed build's tree equals an uninterrupted one's, hidden files included.
Everything else in OUT, OUT/train and OUT/val is foreign. While anything foreign is there a
build refuses to write (with or without --overwrite), naming the first such path, so it never
deletes or replaces a file it did not write. Only re-running a finished build, which writes
nothing, tolerates foreign files.
"""

import dataclasses
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from longpack.core import TEMP_NAME, SettingsError, write_json, writing
from longpack.pipeline.build_state import BuildState
from longpack.pipeline.config import PACKING_UNSET, SPLITS, WORK_DIR, BuildConfig
from longpack.pipeline.formats import open_format
from longpack.pipeline.formats.base import ShardError
from longpack.pipeline.store.lock import LOCK_NAME
from longpack.pipeline.tokenize.kept import COPY_NAMES

JOURNAL = "outputs.txt"
FINGERPRINT, CHECKPOINT = "fingerprint.json", "checkpoint.npz"
TASKS = "tasks.json"  # a build split into tasks (distribute/tasks.py): how many, and its settings
_SPLIT = "|".join(SPLITS)
# Paths relative to the work folder: the single-machine build's files; a tasked build's record,
# each task's folder (distribute/task_build.py, distribute/merge.py) and the Slurm engine's
# scripts and logs.
_WORK_FILE = re.compile(
    rf"{re.escape(FINGERPRINT)}|{re.escape(CHECKPOINT)}|{JOURNAL}|{LOCK_NAME}|{re.escape(TASKS)}"
    rf"|({_SPLIT})\.\d{{5}}\.(rows|segs)"
    rf"|task\.\d{{5,}}/({LOCK_NAME}|{re.escape(CHECKPOINT)}|skipped\.jsonl|done\.json"
    rf"|placed\.json|({_SPLIT})\.(tokens|docs)|({_SPLIT})/shard\.\d{{5,}}\.[a-z.]+)"
    r"|slurm/((tasks|merge)\.sbatch|(task|merge)-\d+\.log)")


class Journal:
    """OUT/.longpack-build/outputs.txt: OUT-relative paths, one a line, each recorded (and
    fsynced) before the file is created."""

    def __init__(self, out: Path):
        self.out, self.path = out, out / WORK_DIR / JOURNAL
        self.listed = _read_journal(out)
        self.lock = threading.Lock()
        with writing(self.path):
            self.file = open(self.path, "a", encoding="utf-8")

    def claim(self, path: Path) -> None:
        rel = path.relative_to(self.out).as_posix()
        with self.lock, writing(self.path):  # the shard writer thread claims too
            if rel in self.listed:
                return
            self.file.write(rel + "\n")
            self.file.flush()
            os.fsync(self.file.fileno())
            self.listed.add(rel)

    def close(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass  # what did not reach the disk was never claimed: nothing was created after it


def _read_journal(out: Path) -> set[str]:
    path = out / WORK_DIR / JOURNAL
    return set(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else set()


def _read_manifest(out: Path) -> dict | None:
    """A finished longpack build's manifest, or None (absent, or not one of ours)."""
    try:
        m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("fingerprint"), dict) else None


def _listed_by_manifest(out: Path, m: dict) -> set[str]:
    listed = {"manifest.json", m.get("skipped_log", "skipped.jsonl")}
    tokenizer = m.get("tokenizer")
    if isinstance(tokenizer, dict) and tokenizer.get("file") in COPY_NAMES.values():
        listed.add(tokenizer["file"])  # only a name a build gives its copy: nothing else
    for split in m.get("splits", {}).values():
        folder = split.get("path", "")
        if not (out / folder / "index.json").is_file():
            continue
        try:
            fmt = open_format(out / folder)
        except ShardError:
            continue  # its shards cannot be proven ours: they will show up as foreign
        listed.add(f"{folder}/index.json")
        listed.update(f"{folder}/{f.basename}" for i in range(len(fmt)) for f in fmt.stored(i))
    return listed


@dataclass
class Survey:
    """Everything in OUT, sorted into the build's own files, stale temp files and the rest."""
    fingerprint: dict | None = None  # the build found there: finished or not
    complete: bool = False
    own: list[Path] = field(default_factory=list)
    temps: list[Path] = field(default_factory=list)
    foreign: list[Path] = field(default_factory=list)

    def sort(self, path: Path, is_own, live: bool = False) -> None:
        """`live`: a folder other processes write in while this one looks (a running task's):
        a file gone since it was listed is not there, and a temp file is someone's write in
        progress, left alone unless the whole build is replaced."""
        temp = TEMP_NAME.fullmatch(path.name)
        if live and not os.path.lexists(path):
            return
        if path.is_file() and not path.is_symlink() and is_own(path.name):
            self.own.append(path)
        elif path.is_file() and temp and is_own(temp["name"]):
            (self.own if live else self.temps).append(path)
        else:
            self.foreign.append(path)


def survey(out: Path) -> Survey:
    s = Survey()
    m = _read_manifest(out)
    listed = _read_journal(out)
    if m is not None:
        s.fingerprint, s.complete = m["fingerprint"], True
        listed |= _listed_by_manifest(out, m)
    elif (out / WORK_DIR / FINGERPRINT).is_file():
        s.fingerprint = _read_fingerprint(out / WORK_DIR / FINGERPRINT)
    if not out.is_dir():
        return s
    for entry in sorted(out.iterdir()):
        if entry.name == WORK_DIR and entry.is_dir() and not entry.is_symlink():
            for path in sorted(_files_under(entry)):
                folder = path.parent.relative_to(entry).as_posix()
                s.sort(path, lambda name, d=folder: _WORK_FILE.fullmatch(
                    name if d == "." else f"{d}/{name}"), live=folder != ".")
        elif entry.name in SPLITS and entry.is_dir() and not entry.is_symlink():
            for path in sorted(entry.iterdir()):
                s.sort(path, lambda name, d=entry.name: f"{d}/{name}" in listed)
        else:
            s.sort(entry, lambda name: name in listed)
    return s


# What survey says of a fingerprint.json that cannot be read: a build, but none that matches
DAMAGED = {"damaged": "fingerprint.json"}


def _read_fingerprint(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DAMAGED
    return found if isinstance(found, dict) else DAMAGED


def _files_under(folder: Path):
    """Every entry under `folder` but the folders themselves (a link to a folder included).
    A folder removed while listed (a task's, by the merge) has nothing under it."""
    try:
        entries = list(folder.iterdir())
    except FileNotFoundError:
        return
    for path in entries:
        if path.is_dir() and not path.is_symlink():
            yield from _files_under(path)
        else:
            yield path


def _remove_empty_folders(work: Path) -> None:
    """The task and Slurm folders of the work folder, once their files are gone."""
    for folder in sorted((p for p in work.iterdir() if p.is_dir() and not p.is_symlink()),
                         reverse=True):
        for sub in [folder / s for s in SPLITS] + [folder]:
            if sub.is_dir() and not any(sub.iterdir()):
                with writing(sub):
                    sub.rmdir()


def refuse_tasked_build(out: Path, overwrite: bool) -> None:
    """A single-machine `pack build` never resumes into a build split into tasks."""
    tasks = out / WORK_DIR / TASKS
    if tasks.is_file() and not overwrite:
        try:
            n = json.loads(tasks.read_text(encoding="utf-8"))["tasks"]
        except (OSError, ValueError, KeyError, TypeError):
            raise SettingsError(f"{out} holds a build split into tasks whose {tasks} is damaged: "
                                "re-run one of its tasks (the command with --tasks N) to write "
                                "it again, or pass --overwrite to replace the build") from None
        raise SettingsError(f"{out} holds a build split into {n} tasks: run its tasks (the same "
                            f"command with --tasks {n}), or `pack merge {out}` once they are "
                            "done; --overwrite replaces it")


def differences(old: dict, new: dict) -> str:
    # a build setting left out of a fingerprint has its default, but for --packing: one left out
    # is concat (config.py's PACKING_UNSET), whatever the default is now
    unset = {f.name: f.default for f in dataclasses.fields(BuildConfig)}
    unset["packing"] = PACKING_UNSET
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "import" and (a is None) != (b is None):  # only an import's has one
            out.append(f"it is the output of pack {'build' if a is None else 'import'}, this "
                       f"command's of pack {'build' if b is None else 'import'}")
        elif key == "settings" and isinstance(a, dict) and isinstance(b, dict):
            out += [f"--{k.replace('_', '-')} {a.get(k, unset.get(k))} -> "
                    f"{b.get(k, unset.get(k))}"
                    for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif key == "packing" and (a is None or b is None):
            continue  # best-fit against concat: --packing, above
        elif key == "packing":  # the same --packing, another longpack's window or rule
            if _per_row(a, old) != _per_row(b, new):  # not only --seq's, named above
                out.append("best-fit's window or rule: another longpack packed it")
        else:  # a setting of one kind of build only (pack build against pack import): named
            out.append(f"{key} changed")
    return "; ".join(out)


def _per_row(packing, fingerprint: dict):
    """A best-fit record with its window's tokens in rows of the build's --seq: they follow
    from --seq, which `differences` names on its own."""
    try:
        window = {**packing["window"]}
        window["tokens"] /= fingerprint["settings"]["seq"]
        return {**packing, "window": window}
    except (TypeError, KeyError, ZeroDivisionError):
        return packing


def _base_name(name: str) -> str:
    temp = TEMP_NAME.fullmatch(name)
    return temp["name"] if temp else name


def _remove(paths: list[Path]) -> None:
    """Proven files before their proof (manifest.json, the journal), so a removal cut short
    leaves nothing unproven; the held lock stays (lock.py removes it last)."""
    def proof_last(path: Path):
        return path.name in ("manifest.json", JOURNAL), path.parent.name == WORK_DIR

    for path in sorted(paths, key=proof_last):
        if path.name != LOCK_NAME or path.parent.name != WORK_DIR:
            with writing(path):
                path.unlink(missing_ok=True)


def remove_stale_temps(out: Path) -> None:
    """With the lock held: the temp files a killed writer left in OUT and its split folders
    (not in a task's folder, where a running task may be writing)."""
    _remove(survey(out).temps)


def remove_work_files(out: Path) -> None:
    """The finished build's last step: its work folder goes, all but the held lock."""
    work = out / WORK_DIR
    if work.is_dir():
        own = []
        for path in _files_under(work):
            folder = path.parent.relative_to(work).as_posix()
            name = _base_name(path.name)
            if _WORK_FILE.fullmatch(name if folder == "." else f"{folder}/{name}"):
                own.append(path)
        _remove(own)
        _remove_empty_folders(work)


def prepare_output(out: Path, fingerprint: dict, overwrite: bool):
    """With the lock held: returns 'complete' (this very build is already there), the
    BuildState of a checkpoint to resume, or None (start afresh). Raises SettingsError rather
    than touch a foreign file."""
    s = survey(out)
    if s.fingerprint is None and s.foreign:
        raise SettingsError(f"{out} is not empty and holds no longpack build ({s.foreign[0]} "
                            "is not one of its files); refusing to write into it: choose a "
                            "new or empty --out")
    if s.fingerprint is DAMAGED and not overwrite:
        raise SettingsError(f"{out / WORK_DIR / FINGERPRINT} is damaged (not a JSON object): the "
                            "unfinished build there cannot be told apart from another; pass "
                            "--overwrite to replace it")
    if s.fingerprint is not None and s.fingerprint != fingerprint and not overwrite:
        raise SettingsError(f"{out} holds a build with different settings "
                            f"({differences(s.fingerprint, fingerprint)}); re-run with the "
                            "same settings to resume it, or pass --overwrite to replace it")
    if s.complete and not overwrite:
        remove_work_files(out)  # left by a build killed while cleaning up
        return "complete"
    if s.foreign:
        raise SettingsError(f"{s.foreign[0]} is not a file of the longpack build in {out}: a "
                            "build never deletes or replaces a file it did not write; move it "
                            "away and re-run")
    _remove(s.temps)
    work = out / WORK_DIR
    if overwrite or s.fingerprint != fingerprint:  # replace a build, or debris of one
        _remove(s.own)
        if work.is_dir():
            _remove_empty_folders(work)
        for split in SPLITS:
            if (out / split).is_dir():
                with writing(out / split):
                    (out / split).rmdir()  # empty now: nothing foreign was in it
        s.fingerprint = None
    if s.fingerprint is None:
        write_json(work / FINGERPRINT, fingerprint)
        return None
    ckpt = work / CHECKPOINT
    return BuildState.read(ckpt) if ckpt.exists() else None
