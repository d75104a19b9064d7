"""A run's checkpoints in a bucket: uploaded in the background, found again on a fresh machine
(docs/TRAIN.md, "Checkpoints in a bucket").

    remote = RemoteRun("s3://bucket/run")       # reaches the store now: one line if it cannot
    remote.fetch_newest(run)                     # --resume auto: the bucket's newest complete
                                                 # checkpoint into RUN, if newer than RUN's own
    remote.submit(run / "step-00000100", run, keep_last=3)   # returns at once
    remote.close()                               # waits for the upload in flight

COMPLETE goes up last and comes down first, so a checkpoint cut short anywhere is never taken
for complete. One upload at a time, in a thread; its failure is raised at the next submit or at
close, and the local checkpoint is whole whatever happens to the upload.
"""

import shutil
import tempfile
import threading
from pathlib import Path

from longpack.core import StorageError, Store, redact
from longpack.training.checkpoints import checkpoint


class RemoteRun:
    def __init__(self, url: str):
        self.store = Store(url)
        self.store.check_writable()  # credentials, endpoint, bucket: before any step
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- in the background -----------------------------------------------------------------
    def submit(self, step_dir: Path, run: Path, keep_last: int) -> None:
        """Upload the checkpoint `step_dir` of `run` in the background (after the previous
        upload ends)."""
        self.wait()
        metrics = run / "metrics.jsonl"
        metrics_bytes = metrics.stat().st_size if metrics.is_file() else 0  # lines written so far
        self._thread = threading.Thread(target=self._upload, name="checkpoint-upload",
                                        args=(step_dir, run, metrics_bytes, keep_last),
                                        daemon=True)
        self._thread.start()

    def _upload(self, step_dir: Path, run: Path, metrics_bytes: int, keep_last: int) -> None:
        try:
            name = step_dir.name
            for f in sorted(step_dir.iterdir(), key=lambda p: p.name == "COMPLETE"):
                self.store.put_file(f, f"{name}/{f.name}")  # COMPLETE last
            if metrics_bytes:
                with open(run / "metrics.jsonl", "rb") as f:
                    self.store.write_bytes("metrics.jsonl", f.read(metrics_bytes))
            self.store.write_bytes("latest", (name + "\n").encode())
            complete, cut_short = self._steps()
            for old in checkpoint.to_remove(complete, name, keep_last) + cut_short:
                self._remove_checkpoint(old)
        except BaseException as e:  # raised in the training thread by wait()
            self._error = e

    def wait(self) -> None:
        """Until the upload in flight is done; raises its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, StorageError):
                raise StorageError(f"checkpoint upload: {error}") from None
            if isinstance(error, Exception):  # a local file unreadable, ...: one line too
                raise StorageError(f"checkpoint upload to {redact(self.store.url)}: "
                                   f"{type(error).__name__}: {error}") from error
            raise error

    close = wait

    # -- what the bucket holds -----------------------------------------------------------------
    def complete_steps(self) -> list[str]:
        """The bucket's checkpoint folders that have both state.pt and COMPLETE, oldest first."""
        return self._steps()[0]

    def _steps(self) -> tuple[list[str], list[str]]:
        """(complete checkpoint folders, the others: uploads cut short), oldest first."""
        sizes = self.store.sizes()
        steps = {rel.split("/")[0] for rel in sizes if checkpoint.STEP_NAME.fullmatch(rel.split("/")[0])}
        complete = {s for s in steps if f"{s}/COMPLETE" in sizes and f"{s}/state.pt" in sizes}
        return sorted(complete), sorted(steps - complete)

    def _remove_checkpoint(self, name: str) -> None:
        files = [rel for rel in self.store.sizes(name)]
        self.store.remove([rel for rel in files if rel.endswith("/COMPLETE")])
        self.store.remove([rel for rel in files if not rel.endswith("/COMPLETE")])

    def fetch(self, name: str, run: Path) -> Path:
        """Checkpoint `name` from the bucket into RUN/name (through a temporary folder beside
        it, renamed whole: another process of the run may be fetching it too)."""
        target = run / name
        if target.is_dir():
            return target
        run.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=run))
        try:
            for rel in self.store.sizes(name):
                self.store.get_file(rel, tmp / rel.split("/", 1)[1])
            try:
                tmp.rename(target)
            except OSError:  # another process put it there first
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target

    def fetch_newest(self, run: Path, metrics: bool = True) -> Path | None:
        """The bucket's newest complete checkpoint, into RUN, when it is newer than RUN's own
        newest complete one (a fresh machine has none); with it (`metrics`: the process that
        writes it) the run's metrics.jsonl, when RUN has none. A checkpoint whose files do not
        match its COMPLETE is skipped for the one before (it is not removed: the bucket is
        not this machine's to clean)."""
        local = [p.name for p in checkpoint.checkpoints(run)]
        newest_local = max(local, default="")
        for name in reversed(self.complete_steps()):
            if name <= newest_local:
                return None
            path = self.fetch(name, run)
            if checkpoint.damage(path) is None:
                if metrics and not (run / "metrics.jsonl").is_file() and \
                        self.store.size("metrics.jsonl"):
                    self.store.get_file("metrics.jsonl", run / "metrics.jsonl")
                return path
            shutil.rmtree(path, ignore_errors=True)
        return None
