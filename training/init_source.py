"""`train --init-from SOURCE`, SOURCE where it is: a longpack checkpoint, a run's newest sound
checkpoint, or a model folder (archs/hf/hf_import.py), read as far as its metadata; at a URL
(s3://, gs://, ...: longpack/core/store.py), first copied to this machine. training/init_from.py
checks it against the run and loads it.

    source = open_source("runs/a", log)           # or runs/a/step-00000100, hf-x, s3://b/runs/a
    source.family, source.config, source.shapes   # what the checks compare, no tensor read
    source.read()                                 # archs' name -> tensor, on the CPU

A checkpoint is read as a resume reads one: state.pt against COMPLETE, through
torch.load(weights_only=True), the DCP metadata through checkpoint.SafeReader's allow-list (a
crafted one refused, nothing of it run); a run's checkpoints as --resume auto finds them (the
newest sound one, each skipped said).

At a URL, what is copied goes to $XDG_CACHE_HOME/longpack/init-from/<16 hex of the URL's
sha256>/ (~/.cache when unset), written under a temporary name and renamed whole (the
processes of a run on one machine may fetch it together), and used again while the store's
objects are those the copy was made of (each one's size and the store's tag of its version,
ETag or the like, recorded beside the copy): a model folder's top-level files; a checkpoint
folder (.../step-NNNNNNNN); a run's newest checkpoint that has its COMPLETE (a checkpoint's
files are then checked against it, as any). Only reading is asked of the store.
"""

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from longpack import archs
from longpack.core import LongpackError, TrainingError, is_url, redact
from longpack.training.checkpoints import checkpoint

FIX = "pass a longpack run or checkpoint folder, or a transformers model folder"


@dataclass
class Source:
    """SOURCE read as far as its metadata (open_source)."""
    given: str  # as the user wrote it (a URL's credentials redacted)
    path: Path  # the checkpoint folder or model folder read (a URL's: its local copy)
    name: str  # as a model card names it: no path of this machine (a run's: RUN/step-N)
    kind: str  # "longpack checkpoint", "GPTNeoXForCausalLM", ...
    family: str
    model: str  # what it is a model of, in a few words: --model neox-tiny, a class
    config: dict | None  # archs config fields (None: a checkpoint of before the record)
    shapes: dict[str, tuple[int, ...]]  # archs' name -> shape
    read: Callable[[], dict]  # () -> archs' name -> tensor, read now
    extra: list[str] = field(default_factory=list)  # its tensors of no archs name
    tokenizer: dict | None = None  # a longpack checkpoint's record of its build's tokenizer
    step: int | None = None  # a checkpoint's step

    @property
    def vocab_size(self) -> int | None:
        embed = self.shapes.get("embed.weight")
        return embed[0] if embed else (self.config or {}).get("vocab_size")

    def where(self) -> str:
        return f"--init-from {self.given}"


def open_source(text: str, log) -> Source:
    """SOURCE's metadata: a checkpoint, a run's newest sound checkpoint, or a model folder."""
    from longpack.archs import is_model_folder, read_folder

    given = redact(text) if is_url(text) else text
    where = f"--init-from {given}"
    try:
        path = fetched(text, where) if is_url(text) else Path(text)
    except TrainingError:
        raise
    except LongpackError as e:  # the store's own line (a bucket not there, no credentials)
        raise TrainingError(f"{where}: {e}") from None
    if not path.exists():
        hint = ""
        if text in ("scratch", "resume") or text.startswith("gpt2"):
            hint = (" (nanoGPT's init_from names a way to start; here a run starts from "
                    "random weights without --init-from, and --resume auto resumes)")
        raise TrainingError(f"{where}: no such folder{hint}; {FIX}")
    if not path.is_dir():
        raise TrainingError(f"{where}: a file; {FIX} (the folder that holds it, with its "
                            "config.json)")
    if checkpoint.STEP_NAME.fullmatch(path.name):
        return _from_checkpoint(given, checkpoint.load(path, "--init-from", FIX))
    if any(checkpoint.STEP_NAME.fullmatch(p.name) for p in path.glob("step-*")):
        found = checkpoint.load_latest(path, lambda line: log(f"--init-from: {line}"))
        if found is None:
            raise TrainingError(f"{where}: none of its checkpoints can be read (each named "
                                f"above); {FIX}")
        return _from_checkpoint(given, found)
    if is_model_folder(path):
        try:
            folder = read_folder(path)
        except ValueError as e:
            raise TrainingError(f"{where}: {e}") from None
        return Source(given, path, path.name, folder.kind, folder.family, folder.kind,
                      folder.config, folder.shapes, folder.weights, folder.extra)
    raise TrainingError(f"{where}: neither a longpack run or checkpoint (step-NNNNNNNN/ with "
                        f"COMPLETE) nor a model folder (config.json); {FIX}")


def _from_checkpoint(given: str, found: tuple[dict, Path]) -> Source:
    state, path = found
    name = state["config"]["model"]
    family = archs.PRESETS.get(name, name)
    try:
        if checkpoint.is_sharded_checkpoint(path):
            meta = checkpoint.SafeReader(path).read_metadata().state_dict_metadata
            shapes = {k[6:]: tuple(m.size) for k, m in meta.items()
                      if k.startswith("model.") and hasattr(m, "size")}
        else:  # format 2 or before: the tensors in state.pt
            shapes = {k: tuple(v.shape) for k, v in state["model"].items()}
    except checkpoint.Unreadable as e:
        raise TrainingError(f"--init-from {given}: {path} cannot be read ({e})") from None
    args = "".join(f" --model-arg {a}" for a in state["config"].get("model_args") or ())
    return Source(given, path, f"{path.parent.name}/{path.name}", "longpack checkpoint",
                  family, f"--model {name}{args}", state.get("model_config"), shapes,
                  lambda: checkpoint.model_state(found), tokenizer=state.get("tokenizer"),
                  step=state.get("step"))


def fetched(url: str, where: str) -> Path:
    """The local copy of SOURCE at `url` (module docstring): the folder open_source then reads
    as it reads a local one."""
    from longpack.core import Store

    url = url.rstrip("/")
    name = url.rpartition("/")[2] or "source"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "longpack" / "init-from" / hashlib.sha256(url.encode()).hexdigest()[:16]
    files = {rel: [int(info.get("size") or 0), _version(info)]  # every object under the URL
             for rel, info in Store(url).listing().items()}
    top = {rel: seen for rel, seen in files.items() if "/" not in rel}
    if "config.json" in top or ("COMPLETE" in top and checkpoint.STEP_NAME.fullmatch(name)):
        return _copied(url, top, root / name)
    steps = sorted({rel.split("/")[0] for rel in files if rel.endswith("/COMPLETE")
                    and checkpoint.STEP_NAME.fullmatch(rel.split("/")[0])})
    if not steps:
        raise TrainingError(f"{where}: nothing there is a longpack checkpoint (step-NNNNNNNN/ "
                            f"with COMPLETE), a run with one, or a model folder (config.json); "
                            f"{FIX}")
    newest = steps[-1]
    _copied(f"{url}/{newest}", {rel.split("/", 1)[1]: seen for rel, seen in files.items()
                                if rel.startswith(f"{newest}/")}, root / name / newest)
    return root / name


def _version(info: dict) -> str | None:
    """The store's tag of an object's version, as fsspec's backends name it."""
    for key in ("ETag", "etag", "md5Hash", "generation", "LastModified", "mtime"):
        if info.get(key) is not None:
            return str(info[key])
    return None


def _copied(url: str, files: dict[str, list], target: Path) -> Path:
    """`files` (relative path -> [size, version]) of the store at `url` in `target`: the copy
    there when it was made of those, else a new one, written beside it and renamed over it,
    its record beside it."""
    from longpack.core import Store

    record = target.parent / f".{target.name}.objects.json"

    def same() -> bool:
        try:
            made_of = json.loads(record.read_text())
        except (OSError, ValueError):
            return False
        return made_of == files and all((target / rel).is_file() and
                                        (target / rel).stat().st_size == size
                                        for rel, (size, _) in files.items())

    if same():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    store = Store(url)
    try:
        for rel in sorted(files):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            store.get_file(rel, tmp / rel)
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)  # a copy of objects the store replaced
        try:
            tmp.rename(target)
        except OSError:  # another process of the run put its copy there first
            if not target.is_dir():
                raise
        else:
            record.write_text(json.dumps(files))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
