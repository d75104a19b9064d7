"""One writer per output directory: an exclusive `flock` on OUT/.longpack-build/lock.

The kernel drops a flock when its holder exits, however it exits (kill -9 included), so a lock
is never stale: a lock file left behind by a killed build is simply locked again. A second
`pack build` into the same --out is refused at once, naming the holder's PID.

The build removes its work folder when it finishes, and the lock file with it. Removing a
locked file does not unlock it, so a second writer may lock a file that is no longer there, or
be racing the holder's removal: after locking, the writer checks that the path still names the
very file it locked (same inode), and otherwise tries again. The holder unlinks the lock file
while still holding it, as the last thing it does, so a finished tree keeps no lock file.
"""

import contextlib
import fcntl
import os
import socket
from pathlib import Path

from longpack.atomic import writing
from longpack.errors import LongpackError, SettingsError

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
        self.fd: int | None = None

    def __enter__(self) -> "OutputLock":
        with writing(self.path):
            while self.fd is None:
                # in the loop: a holder we waited for may have removed the folder with the lock
                try:
                    self.work_dir.mkdir(parents=self.parents, exist_ok=True)
                except FileNotFoundError:
                    raise FolderGone(f"{self.work_dir.parent} is gone") from None
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
                    os.close(fd)
                    raise SettingsError(
                        f"{self.what} is being written by another pack build "
                        f"({holder or 'PID unknown: it has just started'}); wait for it to "
                        "finish, or stop it and re-run to resume") from None
                if self._still_there(fd):
                    self.fd = fd
                else:
                    os.close(fd)  # its holder finished and removed it: lock the new one
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"PID {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        return self

    def _still_there(self, fd: int) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        own = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)

    def __exit__(self, *exc) -> None:
        """Unlink the lock file (still held), remove the work folder if nothing else is in it,
        then unlock. Errors here would hide the build's own outcome: they are left unraised."""
        try:
            with contextlib.suppress(OSError):  # the folder stays: an unfinished build's state
                self.path.unlink(missing_ok=True)
                self.work_dir.rmdir()
        finally:
            os.close(self.fd)
            self.fd = None
