"""A build split into tasks, as its work folder records it: the names of what the tasks
write there, and every record (tasks.json, fingerprint.json, each task's done.json and
placed.json) read back and checked before use.

    OUT/.longpack-build/
      tasks.json, fingerprint.json   the build: its tasks, settings and fingerprint
      task.NNNNN/                    task_build.py: one task's documents (task_stream.py),
        done.json                    skips and checkpoint; done.json when it is done,
        <split>/, placed.json        merge.py: the full shards it placed

Every record must be a sealed JSON object of the expected shape (`seal`: the sha256 of its own
content, added under SEAL) and every placed shard must be there with the bytes placed.json
records. Anything else is TaskDamaged: one line naming the file and the task whose re-run
writes it again (a finished task run again checks its files and its placement and redoes
what is damaged).
"""

import hashlib
import json
from pathlib import Path

import numpy as np

from longpack.core import LongpackError, SettingsError, sha256_file
from longpack.pipeline.config import PACKING_UNSET, SPLITS, WORK_DIR, BuildConfig
from longpack.pipeline.distribute.plan import Share
from longpack.pipeline.formats import get_format
from longpack.pipeline.store.output_dir import FINGERPRINT, TASKS

DONE, PLACED, SKIP_LOG = "done.json", "placed.json", "skipped.jsonl"
DOC_BYTES = 2 * 8  # a document in <split>.docs: uint64 (length in tokens, document hash)
BLOCK_BYTES = 1 << 24  # 16 MiB: a 1.3 G-token task's tokens have 160 block sums in done.json
SEAL = "record_sha256"


def task_folder(out: Path, index: int) -> Path:
    return Path(out) / WORK_DIR / f"task.{index:05d}"


def owned_shards(offset: int, tokens: int, seq: int, rows_per_shard: int) -> range:
    """The full shards whose last token lies in a task's tokens [offset, offset + tokens):
    the ones it places (layout.py says why). Needs only the counts of the tasks up to it."""
    span = rows_per_shard * seq
    return range(offset // span, (offset + tokens) // span)


def stream_files(split: str) -> tuple[str, str]:
    """A task's documents of one split: <split>.tokens and <split>.docs (task_stream.py)."""
    return f"{split}.tokens", f"{split}.docs"


class TaskDamaged(SettingsError):
    """A file of task `task` is not what that task wrote: re-running the task writes it again
    (a finished task run again checks its files and runs again from its start when one is
    damaged, task_build.py)."""

    def __init__(self, path: Path, task: int, tasks: int, what: str):
        super().__init__(f"{path}: {what}; re-run task {task} to write it again (the build's "
                         f"command with --tasks {tasks} --task-index {task}), then `pack merge` "
                         "if it does not merge by itself")
        self.path, self.task = Path(path), task


class TasksUnfinished(SettingsError):
    def __init__(self, out: Path, tasks: int, missing: list[int]):
        shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        super().__init__(f"{out}: {len(missing)} of its {tasks} tasks are not done (task "
                         f"{shown}); run each (the build's command with --tasks {tasks} "
                         "--task-index I), then `pack merge` (the last task merges by itself)")
        self.missing = missing


# -- records: sealed, read back, checked ------------------------------------------------

def seal(record: dict) -> dict:
    """The record with the sha256 of its own content added (under SEAL)."""
    body = {k: v for k, v in record.items() if k != SEAL}
    return {**body, SEAL: _digest(body)}


def seal_broken(record: dict) -> bool:
    """True if the record's SEAL is not its content's (a record without one, written before
    records were sealed, is taken as it is)."""
    return SEAL in record and record[SEAL] != _digest({k: v for k, v in record.items()
                                                       if k != SEAL})


def _digest(body: dict) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_record(path: Path) -> tuple[dict | None, str | None]:
    """(a JSON record, None), (None, what is wrong with it), or (None, None) if there is no
    file. Nothing but a readable JSON object whose seal holds is a record."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (FileNotFoundError, NotADirectoryError):  # a folder above it is a file: none
        return None, None
    except IsADirectoryError:
        return None, "a folder, not a file"
    except UnicodeDecodeError:
        return None, "not UTF-8 text (damaged)"
    try:
        record = json.loads(text)
    except ValueError as e:
        return None, f"not JSON ({e}; damaged or cut)"
    if not isinstance(record, dict):
        return None, f"not a JSON object but {type(record).__name__} (damaged)"
    if seal_broken(record):
        return None, "its content does not match its sha256 (damaged since it was written)"
    return record, None


def shape_error(value, shape, where: str = "") -> str | None:
    """Where `value` first differs from `shape`: a type or tuple of types (bool is not an int
    here), a dict (these keys at least, each of its shape) or a list of one shape (a list of
    such). None when it fits."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where or 'it'} is not an object"
        for key, sub in shape.items():
            if key not in value:
                return f"no {where + '.' if where else ''}{key}"
            if (wrong := shape_error(value[key], sub, f"{where + '.' if where else ''}{key}")):
                return wrong
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is not a list"
        return next((w for i, v in enumerate(value)
                     if (w := shape_error(v, shape[0], f"{where}[{i}]"))), None)
    types = shape if isinstance(shape, tuple) else (shape,)
    if (isinstance(value, bool) and int in types and bool not in types) or not isinstance(
            value, types):
        return f"{where} is {json.dumps(value)[:40]}, not {' or '.join(t.__name__ for t in types)}"
    return None


# -- done.json ----------------------------------------------------------------------------

_NUMBER = (int, float)
DONE_SHAPE = {  # what the merge reads of a done.json, and its types
    "task": int, "tasks": int, "skip_log_bytes": int,
    "share": {"start": [int], "stop": [int], "bytes": int},
    "counts": {"documents": int, "tokens": int,
               "splits": {s: {"documents": int, "tokens": int} for s in SPLITS}},
    "tokenizer": {"dtype": str, "eos_id": int}, "engine": dict,
    "timings": {"started": _NUMBER, "seconds": _NUMBER, "tokens_this_run": int,
                "resumed": bool, "runs": int}}


def share_record(share: Share) -> dict:
    return {"start": list(share.start), "stop": list(share.stop), "bytes": share.bytes}


def task_files(done: dict) -> dict[str, int]:
    """{name: the bytes its counts say it holds} of each file a finished task recorded."""
    itemsize = np.dtype(done["tokenizer"]["dtype"]).itemsize
    files = {}
    for split in SPLITS:
        tokens, docs = stream_files(split)
        counts = done["counts"]["splits"][split]
        files[tokens], files[docs] = counts["tokens"] * itemsize, counts["documents"] * DOC_BYTES
    files[SKIP_LOG] = done["skip_log_bytes"]
    return files


_done_records: dict[tuple, dict] = {}


def read_done(folder: Path, index: int, tasks: int) -> dict | None:
    """Task `index`'s done.json, or None if it has none; TaskDamaged (one line naming it and
    the task to re-run) if it is not a sealed record of that task of `tasks` in the expected
    shape. Read once per process: a task placing its shards needs the records of every task
    before it, and one process running many tasks in turn (`--tasks N` without an index)
    would otherwise read them O(N^2) times. A record never changes once written; its size and
    time tell a replaced one apart."""
    path = folder / DONE
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    if key not in _done_records:
        record, wrong = read_record(path)
        wrong = wrong or (None if record is None else _done_error(record))
        if record is None and wrong is None:
            return None  # removed meanwhile
        if wrong:
            raise TaskDamaged(path, index, tasks, wrong)
        _done_records[key] = record
    record = _done_records[key]
    if (record["task"], record["tasks"]) != (index, tasks):
        raise TaskDamaged(path, index, tasks, f"the record of task {record['task']} of "
                          f"{record['tasks']}, not of task {index} of {tasks}")
    return record


def _done_error(done: dict) -> str | None:
    """What is wrong with a done.json's shape, or None. One written before checksums were
    recorded (no "files", no seal) is taken with its sizes alone."""
    wrong = shape_error(done, DONE_SHAPE) or _not_counts(done["counts"], "counts")
    if wrong:
        return wrong
    if done["tokenizer"]["dtype"] not in ("uint16", "uint32"):
        return f"tokenizer.dtype is {done['tokenizer']['dtype']!r}, not uint16 or uint32"
    if "files" not in done:
        return None
    if SEAL not in done:
        return f"it records its files but has no {SEAL}"
    block, files, want = done.get("block_bytes"), done["files"], task_files(done)
    if shape_error(block, int) or block <= 0:
        return f"block_bytes is {block!r}, not a positive integer"
    if not isinstance(files, dict) or sorted(files) != sorted(want):
        return f"files does not list {', '.join(sorted(want))}"
    for name, need in want.items():
        rec = files[name]
        wrong = shape_error(rec, {"bytes": int, "blocks": [str]}, f"files.{name}")
        if wrong or rec["bytes"] != need:
            return wrong or f"files.{name} records {rec['bytes']} bytes, its counts {need}"
        if len(rec["blocks"]) != -(-need // block):
            return f"files.{name} has {len(rec['blocks'])} block sums for {need} bytes"
    return None


def _not_counts(counts: dict, where: str) -> str | None:
    """The merge sums every number under counts: each must be an integer."""
    for k, v in counts.items():
        wrong = (_not_counts(v, f"{where}.{k}") if isinstance(v, dict)
                 else shape_error(v, int, f"{where}.{k}"))
        if wrong:
            return wrong
    return None


class TaskedBuild:
    """A build split into tasks, as its work folder records it: tasks.json and each task's
    done.json, read when first needed."""

    def __init__(self, out: Path):
        self.out, self.work = Path(out), Path(out) / WORK_DIR
        path = self.work / TASKS
        record, wrong = read_record(path)
        if record is None and wrong is None:
            raise SettingsError(f"{self.out} holds no build split into tasks (no "
                                f"{WORK_DIR}/{TASKS}); `pack merge` finishes a build that "
                                "`pack build --tasks N` started")
        wrong = wrong or shape_error(record, {"tasks": int, "config": {"inputs": list},
                                             "fingerprint": dict})
        if not wrong:
            try:
                # a tasks.json of a longpack before --packing has none: concat's, as then
                self.cfg = BuildConfig(**{"packing": PACKING_UNSET, **record["config"],
                                          "out": str(self.out),
                                          "inputs": tuple(record["config"]["inputs"])})
            except (TypeError, ValueError, LongpackError) as e:
                wrong = f"its settings are not a build's ({e})"
        if wrong or record["tasks"] < 1:
            raise SettingsError(f"{path}: {wrong or 'no tasks'}; re-run one of the build's "
                                "tasks to write it again (the build's command with --task-index"
                                " I), then `pack merge`")
        self.tasks = record["tasks"]
        self.upload_to = record.get("upload_to")  # an --out URL: OUT is its staging folder
        self.fingerprint = record["fingerprint"]  # the same as fingerprint.json's
        fingerprint, wrong = read_record(self.work / FINGERPRINT)
        if wrong or (fingerprint is not None and fingerprint != self.fingerprint):
            raise SettingsError(f"{self.work / FINGERPRINT}: {wrong or 'not the fingerprint'} "
                                f"{TASKS} records; re-run one of the build's tasks to write it "
                                f"again (the build's command with --tasks {self.tasks} "
                                "--task-index I), then `pack merge`")
        self.entry_keys = get_format(self.cfg.format).entry_keys
        self._done: dict[int, dict] = {}
        self._seen_done: set[int] = set()
        self._layouts: dict = {}  # split -> its BestFitLayout, as far as it is read

    def is_done(self, i: int) -> bool:
        """Once done, a task stays done: only a task not seen done is looked at again."""
        if i not in self._seen_done and (task_folder(self.out, i) / DONE).is_file():
            self._seen_done.add(i)
        return i in self._seen_done

    def done(self, i: int) -> dict:
        """Task i's done.json (read once)."""
        if i not in self._done:
            self._done[i] = read_done(task_folder(self.out, i), i, self.tasks)
        return self._done[i]

    def dones(self, upto: int | None = None) -> list[dict]:
        return [self.done(i) for i in range(self.tasks if upto is None else upto)]

    def missing(self, upto: int | None = None) -> list[int]:
        """The tasks (up to `upto`) not done: a look at each folder, no file read."""
        return [i for i in range(self.tasks if upto is None else upto) if not self.is_done(i)]

    def placed(self, i: int) -> dict | None:
        """Task i's placed.json, None if it has none; TaskDamaged if it is not one."""
        path = task_folder(self.out, i) / PLACED
        record, wrong = read_record(path)
        if record is not None:  # split -> {shard number: index entry}, "uploaded"
            entry = dict.fromkeys(self.entry_keys, object)
            wrong = shape_error(record, dict.fromkeys(SPLITS, dict)) or next(
                (f"{s}.{k}: {w}" for s in SPLITS for k, e in record[s].items()
                 if (w := "not a shard number" if not k.isdigit() else shape_error(e, entry))),
                None) or shape_error(record.get("uploaded", False), bool, "uploaded")
        if wrong:
            raise TaskDamaged(path, i, self.tasks, wrong)
        return record

    def owned(self, i: int, split: str) -> range:
        """The full shards of `split` task i places (its done.json and those before it; under
        best-fit, their documents' lengths too: layout.py)."""
        if self.cfg.packing == "best-fit":
            return self.layout(split, i + 1).owned(i)
        tokens = [d["counts"]["splits"][split]["tokens"] for d in self.dones(i + 1)]
        return owned_shards(sum(tokens[:i]), tokens[i], self.cfg.seq, self.rows_per_shard())

    def layout(self, split: str, upto: int, final: bool = False):
        """Where `split`'s rows and shards fall (layout.py), from tasks 0..upto-1 (`final`: all
        of them, the split's last rows included). A best-fit layout is read once, task by
        task, and kept: placing several tasks, or checking every placement, reads each task's
        document lengths once."""
        from longpack.pipeline.distribute.layout import BestFitLayout, SplitLayout
        from longpack.pipeline.distribute.task_stream import read_stream

        if self.cfg.packing != "best-fit":
            counts = [d["counts"]["splits"][split]["tokens"] for d in self.dones(upto)]
            return SplitLayout(counts, self.cfg.seq, self.rows_per_shard(), self.cfg.last_row)
        layout = self._layouts.setdefault(split, BestFitLayout(self.cfg.seq,
                                                               self.rows_per_shard()))
        for j in range(layout.tasks_read, upto):
            _, docs = read_stream(task_folder(self.out, j), split, self.dtype, self.done(j), j,
                                  self.tasks)
            layout.extend(docs[:, 0].astype(np.int64))
        if final:
            layout.close()
        return layout

    # -- the pieces a shard is cut from ------------------------------------------------------
    def _any_done(self) -> dict:
        return self.done(next(i for i in range(self.tasks) if self.is_done(i)))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._any_done()["tokenizer"]["dtype"])

    @property
    def eos_id(self) -> int:
        return self._any_done()["tokenizer"]["eos_id"]

    def format(self, split: str):
        cfg = self.cfg
        return get_format(cfg.format).for_writing(self.out / split, cfg.seq, self.dtype,
                                                  cfg.shard_compression(), cfg.shard_bytes)

    def rows_per_shard(self) -> int:
        return self.cfg.shard_rows(self.dtype.itemsize)


    # -- placed.json, checked against the shards it lists ----------------------------------
    def intact_placement(self, i: int, hashes: bool) -> dict | None:
        """Task i's placed.json if it and every shard it lists are intact (`hashes`: their
        sha256 too, else their sizes), else None: the task places them again."""
        try:
            placed = self.placed(i)
            if placed is not None:
                self.check_placed(i, placed, hashes)
            return placed
        except TaskDamaged:
            return None

    def check_placed(self, index: int, placed: dict, hashes: bool = False) -> None:
        """TaskDamaged unless placed.json lists the shards task `index` owns and each file is
        in its folder, or already moved into OUT by a merge cut short, with the bytes
        (`hashes`: and the sha256) it records. Uploaded shards (an --out URL) are in the
        store, not looked at."""
        path = task_folder(self.out, index) / PLACED
        for split in SPLITS:
            owned = self.owned(index, split)
            if sorted(map(int, placed[split])) != list(owned):
                raise TaskDamaged(path, index, self.tasks, f"it lists other {split} shards than "
                                  f"the {len(owned)} task {index} owns")
            if placed.get("uploaded"):
                continue
            fmt = self.format(split)
            for k, entry in placed[split].items():
                try:
                    files = stored_files(fmt, entry)
                except (KeyError, TypeError, ValueError, IndexError):
                    raise TaskDamaged(path, index, self.tasks, f"its {split} shard {k} is not "
                                      "an index entry") from None
                for stored in files:
                    source = task_folder(self.out, index) / split / stored.basename
                    found = next((p for p in (source, self.out / split / stored.basename)
                                  if p.is_file()), None)
                    if found is None:
                        raise TaskDamaged(source, index, self.tasks,
                                          f"missing (task {index} placed it; {PLACED} lists it)")
                    if found.stat().st_size != stored.bytes or (
                            hashes and stored.sha256 and sha256_file(found) != stored.sha256):
                        raise TaskDamaged(found, index, self.tasks, "not the shard task "
                                          f"{index} placed (its {PLACED} records other bytes)")


def stored_files(fmt, entry: dict) -> list:
    """The files of one index entry, as StoredFile (the format reads its own entry schema)."""
    one = type(fmt)(fmt.folder, fmt.index_json([entry]))
    return one.stored(0)


