"""One writer per output directory: an exclusive `flock` on OUT/.longpack-build/lock, taken
through filelock's UnixFileLock.

The kernel drops a flock when its holder exits, however it exits (kill -9 included), so a lock
is never stale: a lock file left behind by a killed build is simply locked again (filelock's
fallback to a lock by the file's existence, which a killed holder would leave stale, is off). A
second `pack build` into the same --out is refused at once, naming the holder's PID and host,
which the holder writes into the lock file once it holds it; filelock never truncates a file it
has not locked, so a refused writer leaves that name in place.

The build removes its work folder when it finishes, and the lock file with it (filelock itself
leaves the file in place): the holder unlinks the lock file while still holding it, as the last
thing it does, so a finished tree keeps no lock file. Removing a locked file does not unlock it,
so a second writer may lock a file that is no longer there, or be racing the holder's removal.
filelock gives up a lock it won on a file with no links left; a waiter then tries again (making
the folder again if it went too), and a writer refused at once tries again if the file it met
is no longer the one at the path (its holder has just finished), so two writers never both
hold the lock of the same path.

filelock makes the lock file's folder, with its parents, when it starts; where the parent must
exist (`parents=False`), a parent made anew meanwhile (its last holder removed it) is FolderGone.
"""

import contextlib
import os
import socket
from pathlib import Path

from filelock import Timeout, UnixFileLock

from longpack.core import LongpackError, SettingsError, writing

LOCK_NAME = "lock"


class FolderGone(LongpackError):
    """The folder a lock was to go in has gone with its parent (a merged build's work folder)."""


class OutputLock:
    """`wait`: block until the holder lets go (the short steps of a build split into tasks,
    which its tasks take in turn) instead of refusing at once; `what`: what the lock guards, in
    the refusal (default: the output folder)."""

    def __init__(self, work_dir: Path, wait: bool = False, what: str | None = None,
                 parents: bool = True):
        """`parents=False`: the folder's parent must exist (a task's folder inside a work
        folder that a finished merge removes): FolderGone if it does not."""
        self.work_dir, self.path = Path(work_dir), Path(work_dir) / LOCK_NAME
        self.wait, self.what = wait, what or str(Path(work_dir).parent)
        self.parents = parents
        # thread_local=False: the hold is this object's, whichever thread lets it go
        self.lock = UnixFileLock(self.path, thread_local=False, fallback_to_soft=False)

    def __enter__(self) -> "OutputLock":
        with writing(self.path):
            while not self._locked():
                pass
            try:
                self.path.write_text(f"PID {os.getpid()} on {socket.gethostname()}\n")
            except BaseException:
                self.lock.release()
                raise
        return self

    def _locked(self) -> bool:
        """One try: True once held; False where what it met went meanwhile (try again)."""
        try:
            self.work_dir.mkdir(parents=self.parents, exist_ok=True)
            # an open folder keeps its inode number, so a parent made anew cannot pass for it
            parent = None if self.parents else os.open(self.work_dir.parent, os.O_RDONLY)
        except FileNotFoundError:
            raise FolderGone(f"{self.work_dir.parent} is gone") from None
        try:
            met = None if self.wait else _lock_file(self.path)[0]
            try:
                self.lock.acquire(blocking=self.wait)
            except FileNotFoundError:  # the folder went with the holder we waited for
                return False
            except Timeout:
                now, holder = _lock_file(self.path)
                if now is None or now != met:
                    return False
                raise SettingsError(
                    f"{self.what} is being written by another pack build "
                    f"({holder or 'PID unknown: it has just started'}); wait for it to "
                    "finish, or stop it and re-run to resume") from None
            if parent is not None and not _same_folder(parent, self.work_dir.parent):
                self.__exit__()
                with contextlib.suppress(OSError):
                    self.work_dir.parent.rmdir()  # filelock's, if nothing else is in it
                raise FolderGone(f"{self.work_dir.parent} is gone")
            return True
        finally:
            if parent is not None:
                os.close(parent)

    def __exit__(self, *exc) -> None:
        """Unlink the lock file (still held), remove the work folder if nothing else is in it,
        then unlock. Errors here would hide the build's own outcome: they are left unraised."""
        try:
            with contextlib.suppress(OSError):  # the folder stays: an unfinished build's state
                self.path.unlink(missing_ok=True)
                self.work_dir.rmdir()
        finally:
            self.lock.release()


def _lock_file(path: Path) -> tuple[tuple[int, int] | None, str]:
    """(device, inode) of the file at `path` (None: no file) and what its holder wrote in it."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            return (st.st_dev, st.st_ino), f.read(200).decode("utf-8", "replace").strip()
    except FileNotFoundError:
        return None, ""


def _same_folder(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
