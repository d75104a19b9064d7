"""pipeline/store/lock.py: one writer per folder, over filelock's flock lock. Every test takes
real locks on real files; two OutputLocks in one process conflict as two processes' do (each
has its own open file), so most run in this process, and the kill -9 one in a child."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from longpack.core.errors import SettingsError
from longpack.pipeline.store.lock import LOCK_NAME, FolderGone, OutputLock

ME = f"PID {os.getpid()} on {socket.gethostname()}"


def refused(folder: Path, what: str | None = None, holder: str = ME) -> None:
    with pytest.raises(SettingsError, match=re.escape(
            f"{what or folder.parent} is being written by another pack build ({holder}); wait "
            "for it to finish, or stop it and re-run to resume")):
        OutputLock(folder, what=what).__enter__()


def test_a_second_writer_is_refused_at_once_naming_the_holder(tmp_path):
    work = tmp_path / "out" / ".longpack-build"
    with OutputLock(work):
        assert (work / LOCK_NAME).read_text() == ME + "\n"
        t0 = time.monotonic()
        refused(work)
        refused(work, what="task 3 of out")
        assert time.monotonic() - t0 < 2
        # the refused writers opened the holder's file: its name is still there
        assert (work / LOCK_NAME).read_text() == ME + "\n"
    with OutputLock(work):  # let go: the next writer takes it
        assert (work / LOCK_NAME).exists()


def test_a_finished_holder_leaves_no_lock_file_and_no_empty_folder(tmp_path):
    work = tmp_path / "out" / ".longpack-build"
    with OutputLock(work):
        pass
    assert not work.exists() and (tmp_path / "out").is_dir()
    with OutputLock(work):  # an unfinished build's state stays, its lock file does not
        (work / "checkpoint.npz").write_bytes(b"state")
    assert [p.name for p in work.iterdir()] == ["checkpoint.npz"]


def test_a_folder_whose_parent_must_exist_is_gone_without_it(tmp_path):
    folder = tmp_path / "work" / "task.00001"
    with pytest.raises(FolderGone, match=re.escape(f"{folder.parent} is gone")):
        OutputLock(folder, parents=False).__enter__()
    assert not (tmp_path / "work").exists()
    with OutputLock(folder):  # the default makes the parents
        assert (folder / LOCK_NAME).exists()


HOLD = """
import sys, time
from longpack.pipeline.store.lock import OutputLock
lock = OutputLock(sys.argv[1]).__enter__()  # kept: a lock let go of is unlocked
print("held", flush=True)
time.sleep(600)
"""


def test_the_lock_of_a_killed_holder_is_not_stale(tmp_path):
    work = tmp_path / "out" / ".longpack-build"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(work)], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline() == "held\n"
        refused(work, holder=f"PID {holder.pid} on {socket.gethostname()}")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=60)
    assert (work / LOCK_NAME).exists()  # left behind, and no obstacle
    with OutputLock(work):
        assert (work / LOCK_NAME).read_text() == ME + "\n"


def waiter(folder: Path, **kw) -> tuple[threading.Thread, dict]:
    """An OutputLock(wait=True) entered in a thread: what it got, in the dict."""
    got = {}

    def enter():
        try:
            got["lock"] = OutputLock(folder, wait=True, **kw).__enter__()
        except Exception as e:  # noqa: BLE001 (handed to the test, which checks it)
            got["error"] = e

    thread = threading.Thread(target=enter)
    thread.start()
    time.sleep(0.05)  # it is trying
    assert thread.is_alive() and not got
    return thread, got


def test_a_waiter_racing_the_holders_removal_holds_the_file_at_the_path(tmp_path):
    """The holder unlinks its lock file and removes its folder, then unlocks, while a waiter
    keeps trying: the waiter ends up holding the file the path names (a third writer is
    refused), never a file no longer there. Eight rounds, each finishing at another moment of
    the waiter's tries."""
    work = tmp_path / "out" / ".longpack-build"
    first = OutputLock(work).__enter__()
    for i in range(8):
        thread, got = waiter(work)
        time.sleep(i * 0.007)
        first.__exit__(None, None, None)
        thread.join(timeout=30)
        first = got["lock"]
        assert (work / LOCK_NAME).read_text() == ME + "\n"
        refused(work)  # if the waiter held a file no longer there, this writer would not be
    first.__exit__(None, None, None)
    assert not work.exists()


@pytest.mark.parametrize("third", [False, True])
def test_a_writer_refused_by_a_holder_that_has_just_finished_tries_again(tmp_path, third):
    """Refused at the moment its holder lets go (the file it met gone with its folder), a
    writer takes the lock; if a third writer took it in between, it is refused naming that one."""
    work = tmp_path / "out" / ".longpack-build"
    first = OutputLock(work).__enter__()
    second = OutputLock(work)
    tried, taken = second.lock.acquire, []

    def acquire(**kw):
        try:
            return tried(**kw)
        finally:
            if not taken:  # the first try, refused: its holder finishes now
                first.__exit__(None, None, None)
                taken.append(OutputLock(work).__enter__() if third else None)

    second.lock.acquire = acquire
    if third:
        with pytest.raises(SettingsError, match="being written by another pack build"):
            second.__enter__()
        taken[0].__exit__(None, None, None)
    else:
        second.__enter__()
        assert (work / LOCK_NAME).read_text() == ME + "\n"
        refused(work)
        second.__exit__(None, None, None)
    assert len(taken) == 1 and not work.exists()


def test_a_waiter_whose_parent_went_meanwhile_is_gone(tmp_path):
    """A task's lock waited for while a merge finishes (the work folder goes, the task's
    folder with it): FolderGone, and nothing made again."""
    folder = tmp_path / "out" / ".longpack-build" / "task.00000"
    folder.parent.mkdir(parents=True)
    first = OutputLock(folder, parents=False).__enter__()
    thread, got = waiter(folder, parents=False)
    while folder.parent.exists():  # the waiter's polling may put a file back mid-removal
        shutil.rmtree(folder.parent, ignore_errors=True)
    first.__exit__(None, None, None)
    thread.join(timeout=30)
    assert isinstance(got.get("error"), FolderGone), got
    assert not folder.parent.exists()


def test_a_parent_made_anew_while_the_lock_is_taken_is_gone(tmp_path, monkeypatch):
    """filelock makes the lock's folder with its parents when it starts: a work folder
    removed just before (a merge finishing then) is made anew, locked in, found not to be the
    one OutputLock saw, removed again, and reported gone."""
    work = tmp_path / "out" / ".longpack-build"
    folder = work / "task.00000"
    work.mkdir(parents=True)
    real_mkdir, calls, removed = Path.mkdir, [], []

    def mkdir(self, *args, **kw):
        calls.append(self)
        if calls.count(folder) == 2 and not removed:  # filelock's, after OutputLock's own
            shutil.rmtree(work)
            removed.append(work)
        real_mkdir(self, *args, **kw)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(FolderGone, match=re.escape(f"{work} is gone")):
        OutputLock(folder, parents=False).__enter__()
    assert removed and not work.exists() and (tmp_path / "out").is_dir()
