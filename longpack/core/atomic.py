"""Every output file is written under a temporary name and renamed into place.

A reader therefore sees either the old file, no file, or the complete new file: never a
half-written one, whatever kills the process (Ctrl+C, kill -9, a full disk).
"""

import contextlib
import errno
import hashlib
import json
import os
import re
from pathlib import Path

from longpack.core.errors import OutputError, SettingsError

TEMP_NAME = re.compile(r"\.(?P<name>.+)\.tmp\d+")  # what temp_name gives, for any pid

_REMEDY = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space (disk quota)",
           errno.EROFS: "make it writable", errno.EACCES: "make it writable",
           errno.EPERM: "make it writable",
           # no_follow's refusal of a symlink at the name: never written through
           errno.ELOOP: "move the symlink at that name away (nothing is written through one)"}


def remedy(error: OSError) -> str:
    """What a user does about an OSError of a write: "free some space", "make it writable"."""
    return _REMEDY.get(error.errno, "fix it")


def temp_name(path: Path) -> Path:
    # The pid keeps two writers apart; the leading dot keeps globs like shard.* off it.
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


@contextlib.contextmanager
def writing(path: Path):
    """Turn an OSError while writing `path` into an OutputError naming it: a full disk's
    write() error names no file at all. Every partial write is either undone (temp files) or
    cut back to the last checkpoint on resume (write-ahead files, skipped.jsonl), so the same
    command, re-run once the disk is fixed, resumes."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}; {remedy(e)}, then re-run "
                          "the same command: it resumes from its last checkpoint") from e


def write_bytes(path: Path, data: bytes | memoryview, fsync: bool = False) -> None:
    """Write `data` to `path` atomically. On any error the temp file is removed and the
    error re-raised, so nothing is left under either name."""
    path = Path(path)
    tmp = temp_name(path)
    with writing(path):
        # a symlink planted at the temporary name is refused (ELOOP) and left as it is, never
        # written through nor removed
        f = open(tmp, "wb", opener=no_follow)
        try:
            with f:
                f.write(data)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):  # a read-only disk refuses even this
                tmp.unlink(missing_ok=True)
            raise


def no_follow(path, flags: int) -> int:
    """open()'s opener that refuses a symlink at the name rather than write where it points."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


def write_json(path: Path, obj, fsync: bool = False) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    write_bytes(path, text.encode("utf-8"), fsync=fsync)


def sha256_file(path: Path) -> str:
    """sha256 of a file, read in 4 MiB pieces (memory stays flat for any size)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def open_write_ahead(path: Path, valid_bytes: int):
    """An append-only write-ahead file (a build's partial shard, a task's documents) opened
    where its checkpoint left it: cut back to the `valid_bytes` the checkpoint recorded. A
    file shorter than that cannot be resumed from: SettingsError naming it."""
    if (path.stat().st_size if path.exists() else 0) < valid_bytes:
        raise SettingsError(f"resume state does not match {path} (shorter than its "
                            "checkpoint); re-run with --overwrite to rebuild")
    with writing(path):
        f = open(path, "ab")
        f.truncate(valid_bytes)
    return f
