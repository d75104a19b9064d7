"""Checkpoints: RUN/step-NNNNNNNN/ folders, written whole or not at all (saving.py), the
newest kept; what they hold (`capture`) and how a run takes them back (`check_model`,
`restore`; the data's order is checked by data/mixture.py's `check_resume`). docs/TRAIN.md,
"Checkpoints and resume", says what is where and why; in short:

    step-NNNNNNNN/  __R_0.distcp (process R's part)    .metadata (DCP's index of them)
                    state.pt (rank 0: no weights)      COMPLETE (last: sha256 of every file)

One format for every run (DCP: any number of processes, sharded or not, loads it); formats 1
and 2 (tensors in state.pt) still load. A run reads and prunes only its own checkpoints (the
record ending COMPLETE). Nothing read runs code: state.pt through torch.load(weights_only=True),
DCP's pickled `.metadata` through `SafeReader`'s allow-list, bytes items through
`SafeLoadPlanner` with weights_only=True.
"""

import io
import pickle
import random
import re
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from longpack.core import TrainingError, sha256_file
from longpack.training.data.mixture import MixedOrder
from longpack.training.parallel import fsdp
from longpack.training.step import TrainState

# 3: the model and optimizers' tensors in DCP files for every run; 2: in state.pt (torch.save)
# but for --fsdp runs; 1 (no "format" key): 2 plus "history", every step's metrics record.
FORMAT = 3
STEP_NAME = re.compile(r"step-(\d{8})")
RECORD = "longpack checkpoint of step {}"  # COMPLETE's last line
INCOMPLETE = "not a complete checkpoint (no COMPLETE file)"
RECENT_HASHES = 16
# numpy's array and dtype, which np.random.get_state() holds: data, rebuilt without running code
NUMPY_GLOBALS = [(getattr(np, "_core", None) or np.core).multiarray._reconstruct, np.ndarray,
                 np.dtype, type(np.dtype(np.uint32))]  # np._core: numpy 2; np.core: numpy 1.26


def is_checkpoint(path: Path) -> bool:
    """Whether `path` is a checkpoint this code wrote (`not_a_checkpoint` says why not)."""
    return not_a_checkpoint(path) is None


def not_a_checkpoint(path: Path) -> str | None:
    """Why `path` is not a checkpoint this code wrote, or None: one is named step-NNNNNNNN and
    has a COMPLETE whose record names that step (or, before the record, hashes alone)."""
    name = STEP_NAME.fullmatch(path.name)
    complete = path / "COMPLETE"
    if name is None or path.is_symlink() or not path.is_dir():
        return "not a checkpoint folder of this run (step-NNNNNNNN)"
    if not complete.is_file():
        return INCOMPLETE
    try:
        lines = complete.read_text().strip().split("\n")
    except (OSError, UnicodeDecodeError):
        return "its COMPLETE file is not a checkpoint's"
    if lines[-1].startswith("longpack checkpoint"):
        if lines[-1] != RECORD.format(int(name.group(1))):
            return f"its COMPLETE records another step ({lines[-1]!r}): a copy, left as it is"
        return None
    if all(re.fullmatch(r"[0-9a-f]{64}( {2}\S.*)?", line) for line in lines):
        return None  # written before the record
    return "its COMPLETE file is not a checkpoint's"


def checkpoints(run: Path) -> list[Path]:
    """RUN's checkpoints (is_checkpoint), oldest first."""
    return sorted((p for p in run.glob("step-*") if is_checkpoint(p)), key=lambda p: p.name)


def to_remove(names: list[str], saved: str, keep_last: int) -> list[str]:
    """The checkpoints (sorted names) that go once `saved` is written: all but the newest
    keep_last up to it, and every later one (an abandoned continuation of the run: --resume
    never, or a resume from an older checkpoint, rewrites those steps, as metrics.jsonl's)."""
    upto = [n for n in names if n <= saved]
    return upto[:-keep_last] + [n for n in names if n > saved]


def load(path: Path, flag: str = "--resume", fix: str = "pass a complete checkpoint "
         "directory, auto or never") -> tuple[dict, Path]:
    """The checkpoint in `path`, after checking state.pt against COMPLETE (on the CPU: each
    process moves what it needs to its own device). `flag` named `path` and `fix` says what
    to give it instead, in the one line of an error."""
    try:
        state = _read(path)
    except Exception as e:  # --resume DIR: one line naming it, not a traceback
        raise TrainingError(f"{flag} {path}: {e}; {fix}") from None
    return _readable(state, path), path


def warn(line: str) -> None:
    """A note for the user on stderr, one line (the trainer passes its own log instead)."""
    print(f"warning: {line}", file=sys.stderr)


def read_checkpoint(run: Path, step: int | None = None, say=None) -> tuple[dict, Path]:
    """What `zoo` reads of a run: its newest sound checkpoint (`say`, stderr by default, is told
    of each one skipped), or step-N's; one line naming the steps there are when neither is."""
    if step is None:
        found = load_latest(run, say or warn)
        if found is None:
            raise TrainingError(f"{run}: no complete checkpoint (step-NNNNNNNN/ with COMPLETE); "
                                "pass the --out of a train run")
        return found
    steps = [int(p.name[5:]) for p in checkpoints(run)]
    have = (f"its complete checkpoints are of steps {', '.join(map(str, steps))}" if steps
            else f"{run} has no complete checkpoint")
    return load(run / f"step-{step:08d}", f"--step {step}:",
                f"{have}; pass one of them, or no --step for the newest")


def load_latest(run: Path, say=warn) -> tuple[dict, Path] | None:
    """The newest sound checkpoint of RUN; `say` is told of each one skipped, in one line."""
    paths = sorted((p for p in run.glob("step-*") if STEP_NAME.fullmatch(p.name)), reverse=True)
    for n, path in enumerate(paths):
        try:
            problem = not_a_checkpoint(path)
            if problem:
                raise ValueError(problem)
            state = _read(path)
        except Exception as e:  # truncated, missing or unreadable: fall back to the one before
            say(f"skipping checkpoint {path}: {e}; " + ("using the one before it"
                if n + 1 < len(paths) else "it was the only one: none is left to use"))
            continue
        # sound but newer: refused, since falling back to an older one would undo steps
        return _readable(state, path), path
    return None


def _read(path: Path) -> dict:
    problem = damage(path) or (dcp_damage(path)
                               if is_sharded_checkpoint(path) else None)
    if problem:
        raise ValueError(problem)
    try:
        with torch.serialization.safe_globals(NUMPY_GLOBALS):
            return torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle asking for more than data: refused, not run
        raise ValueError(f"state.pt holds more than a checkpoint's data, which is never loaded "
                         f"(nothing in it was run): {refusal(e)}") from None


def damage(path: Path) -> str | None:
    """What is wrong with the checkpoint folder's files against its COMPLETE, or None."""
    complete = path / "COMPLETE"
    if not complete.is_file():
        return INCOMPLETE
    lines = complete.read_text(errors="replace").split("\n")
    listed = dict(reversed(line.split("  ", 1)) for line in lines if "  " in line)
    if not listed:  # a whole checkpoint: state.pt's sha256 alone
        listed = {"state.pt": lines[0].strip()}
    for name, digest in sorted(listed.items()):
        if not (path / name).is_file():
            return f"{name} is missing"
        if sha256_file(path / name) != digest:
            return f"{name} does not match its checksum"
    return None


def _readable(state: dict, path: Path) -> dict:
    if state.get("format", 1) > FORMAT:
        raise TrainingError(f"{path} was written by a newer longpack (checkpoint format "
                            f"{state['format']}, this one reads up to {FORMAT}); upgrade "
                            "longpack to resume it, or pass --resume never or another --out")
    return state


def find(run: Path, resume: str, say=warn) -> tuple[dict, Path] | None:
    """--resume auto: the newest sound checkpoint in the run, if any (a run whose every
    checkpoint is unreadable is refused: starting afresh would quietly drop them); never:
    none; else the checkpoint directory named, as a path or by its name in the run
    (`--resume step-00000008`); one that is neither is refused, listing the run's."""
    if resume == "never":
        return None
    if resume == "auto":
        skipped = []
        found = load_latest(run, lambda line: (skipped.append(line), say(line)))
        if found is None and skipped:
            raise TrainingError(f"{run}: none of its {len(skipped)} checkpoint(s) can be read "
                                "(each named above); restore one, or pass --resume never to "
                                "start afresh")
        return found
    path = Path(resume)
    if not path.exists() and not path.is_absolute() and (run / resume).exists():
        path = run / resume
        if resume == "latest" and path.is_file():  # the run's pointer to its newest
            path = run / path.read_text().strip()
    if not path.exists():
        have = [p.name for p in checkpoints(run)] if run.is_dir() else []
        listed = (f"{run}'s checkpoints: {', '.join(have)}" if have else
                  f"{run} has no checkpoints")
        raise TrainingError(f"--resume {resume}: no such checkpoint ({listed}); pass one of "
                            "them, a checkpoint's path, auto (the newest) or never")
    return load(path)


def capture(s: TrainState, step: int, data, order: MixedOrder, cfg, run_id: str,
            began_from: dict | None = None) -> dict:
    """What a checkpoint after `step` steps holds (the state of this process); `run_id` names
    the run across its resumes (its W&B run); `began_from`: the weights it started from
    (training/init_from.py's record; None: random ones), kept across its resumes."""
    recent = range(max(0, step - RECENT_HASHES), step)
    # the model and optimizers: save() adds them to a whole checkpoint (a sharded one's parts
    # are written by every process)
    return {"format": FORMAT, "scaler": s.scaler.state_dict(), "rng": rng_state(), "step": step,
            "fingerprint": data.fingerprint, "seq": data.seq, "config": cfg.to_dict(),
            # what the ids mean, its sha256 first: a resume and zoo's export, generate and eval
            # refuse a build of another tokenizer by it (check_tokenizer, longpack/zoo/runs.py)
            "tokenizer": data.manifest["tokenizer"],
            "mixture": order.history, "global_batch": order.global_batch,
            # the model's config as built (preset + --model-arg): what resume, export and
            # generate rebuild it from
            "model_config": asdict(s.model.cfg),
            "recent_hashes": [(n, order.step_hash(n)) for n in recent], "run_id": run_id,
            "began_from": began_from}


def check_model(found: tuple[dict, Path], cfg) -> None:
    """Refuse to resume a checkpoint of another model (its weights would not load), or on a
    build of another tokenizer (check_tokenizer)."""
    state, path = found
    was = state["config"]["model"]
    if was != cfg.model:
        raise TrainingError(f"{path} holds a {was} model and this run asks for --model "
                            f"{cfg.model}; pass --model {was} to resume it, or --resume never "
                            "or another --out to start a new run")
    was_opt = state["config"].get("optimizer", "adamw")
    if was_opt != cfg.optimizer:  # its state is another optimizer's: nothing of it would load
        raise TrainingError(f"{path} was trained with --optimizer {was_opt} and this run asks for "
                            f"--optimizer {cfg.optimizer}; pass --optimizer {was_opt} to resume "
                            "it, or --resume never or another --out to start a new run with "
                            f"{cfg.optimizer}")
    saved = state.get("model_config")  # absent in checkpoints before --model-arg
    if saved is not None:
        from longpack import archs

        wants = asdict(archs.config(cfg.model, **cfg.model_overrides))
        differ = [f"{k} {saved[k]} -> {wants[k]}" for k in sorted(wants)
                  if k not in ("vocab_size", "checkpointing") and saved.get(k) != wants[k]]
        if differ:
            raise TrainingError(f"{path} holds the model with other settings ({'; '.join(differ)})"
                                "; pass the checkpoint's --model-arg values to resume it, or "
                                "--resume never or another --out to start a new run")
    check_tokenizer(found, cfg)


def check_tokenizer(found: tuple[dict, Path], cfg) -> None:
    """Refuse to resume a checkpoint on a build (each of --shards) of another tokenizer than the
    one it recorded (`capture`), whatever the build's folder now holds: its manifest, or a
    copy of another tokenizer (pipeline/builds/identity.py). Only manifests are read; a build
    that is not there is left for opening the data to name, and a checkpoint of before the
    record has nothing to hold a build to."""
    from longpack.core import LongpackError, is_url
    from longpack.pipeline import other_tokenizer, read_manifest

    state, path = found
    recorded = state.get("tokenizer")
    if recorded is None:
        return
    for _, location in cfg.mixture()[0]:
        try:
            theirs = read_manifest(location)["tokenizer"]
        except LongpackError:
            continue
        other = other_tokenizer(recorded, theirs, None if is_url(location) else Path(location),
                                location)
        if other:
            raise TrainingError(f"{path}: {other}; pass --shards with the run's build where it "
                                "is now, or --resume never or another --out to start a new run")


def restore(found: tuple[dict, Path], s: TrainState, cfg) -> int:
    """Load the checkpoint into the train state and the RNGs; returns its step."""
    state, path = found
    try:
        from longpack import archs  # a Mamba's weights of before its RMSNorm: refused in one line, named
        archs.mamba.refuse_layernorm_weights(state.get("model") or SafeReader(
            path).read_metadata().state_dict_metadata)
        if is_sharded_checkpoint(path):
            load_into(path, s.model, s.optimizers, state.get("param_groups"),
                                     distributed=fsdp.is_sharded(s.model))
        else:  # a checkpoint of format 2 or before: the model and optimizers in state.pt
            load_whole_into(state, s.model, s.optimizers)
    except Unreadable as e:  # damaged past its COMPLETE, or crafted: nothing ran
        raise TrainingError(f"{path} cannot be read ({e}); resume from an earlier checkpoint "
                            "(--resume RUN/step-NNNNNNNN), or pass --resume never or another "
                            "--out to start afresh") from None
    except (RuntimeError, KeyError, ValueError) as e:  # other shapes: archs/ changed since
        raise TrainingError(f"{path}: its weights do not fit --model {cfg.model} as archs/ "
                            f"builds it now ({str(e).strip().splitlines()[0]}); pass --resume "
                            "never or another --out to start afresh") from None
    s.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    return state["step"]


def model_state(found: tuple[dict, Path]) -> dict[str, torch.Tensor]:
    """The checkpoint's model weights by name, whole, on the CPU (either format)."""
    state, path = found
    if is_sharded_checkpoint(path):
        return tensors(path, "model.")
    return state["model"]


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            # this process's device only: the others belong to other ranks
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# -- the tensors: DCP files, read without running code ---------------------------------------

METADATA = ".metadata"


class Unreadable(ValueError):
    """A sharded checkpoint that cannot be read as it claims: its metadata, a file it names, or
    an item (damaged, or crafted to run code: refused, nothing run)."""

# (module, name) an honest .metadata refers to (torch 2.x's DCP): data classes, no functions
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name in _METADATA_GLOBALS.get(module, ()) or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP metadata file")


class SafeReader(FileSystemReader):
    """DCP's file reader, its metadata unpickled by an allow-list (module docstring)."""

    def read_metadata(self, *args, **kwargs):
        data = (Path(self.path) / METADATA).read_bytes()
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except Exception as e:  # a crafted or damaged file: nothing of it was run
            raise Unreadable(f"{Path(self.path) / METADATA} is not a DCP metadata file "
                             f"({type(e).__name__}: {e}); nothing in it was run") from None
        if not isinstance(metadata, Metadata):
            raise Unreadable(f"{Path(self.path) / METADATA} is not a DCP metadata file (it holds "
                             f"a {type(metadata).__name__})")
        if metadata.storage_meta is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, its non-tensor items read as plain values only (module docstring):
    DefaultLoadPlanner.load_bytes with weights_only=True."""

    def load_bytes(self, read_item, value) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as e:  # a pickle asking for more than data: refused, not run
            why = refusal(e)
            raise Unreadable(f"its item {read_item.dest_index.fqn} holds more than data, which "
                             f"is never loaded (nothing in it was run): {why}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def refusal(e: Exception) -> str:
    """The line of torch.load(weights_only=True)'s refusal that names what was asked for (its
    message also suggests weights_only=False, which is never done here)."""
    lines = [line.strip() for line in str(e).strip().splitlines()]
    return next((line for line in lines if "GLOBAL" in line or "global" in line),
                lines[0] if lines else type(e).__name__)


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / METADATA).is_file()


def dcp_damage(folder: Path) -> str | None:
    """What makes a sharded checkpoint unreadable before a tensor is read, or None: metadata
    that is not DCP's, or an item whose file is missing or shorter than the metadata says."""
    try:
        metadata = SafeReader(folder).read_metadata()
    except (ValueError, OSError) as e:
        return str(e)
    sizes = {}
    for info in (metadata.storage_data or {}).values():
        name = str(info.relative_path)
        if name not in sizes:
            file = folder / name
            if Path(name).name != name or not file.is_file():
                return f"{name}, which {METADATA} names, is missing"
            sizes[name] = file.stat().st_size
        if info.offset < 0 or info.length < 0 or info.offset + info.length > sizes[name]:
            return f"{name} is shorter than {METADATA} says (truncated)"
    return None


def save_parts(folder: Path, model: torch.nn.Module, optimizers: list,
               distributed: bool) -> list:
    """The model and optimizer tensors into `folder`: with `distributed` (a sharded model) every
    process calls it and writes its part, a collective; else the calling process writes them
    whole, alone. Returns the optimizers' param_groups (plain values, the
    same on every process), which the caller keeps in state.pt: DCP is given tensors only, so
    it pickles nothing."""
    model_state, optim_state = get_state_dict(model, optimizers)
    tensors = {"model": model_state, "optimizers": {"state": optim_state["state"]}}
    kept = [key for key, value in _leaves(tensors) if not isinstance(value, torch.Tensor)]
    if kept:  # an optimizer whose state is not all tensors: say so rather than pickle it
        raise TrainingError(f"the optimizer state holds values that are not tensors ({kept[0]}); "
                            "a checkpoint holds tensors only")
    with warnings.catch_warnings():  # no_dist: "assuming ... a single process", as meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(tensors, checkpoint_id=folder, no_dist=not distributed)
    return optim_state["param_groups"]


def _leaves(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, tree


def load_into(folder: Path, model: torch.nn.Module, optimizers: list, param_groups: list | None,
              distributed: bool) -> None:
    """The checkpoint's model and optimizer state into `model` and `optimizers` as they are laid
    out now; `param_groups`: state.pt's (None in checkpoints that hold them as DCP items).
    `distributed`: the processes read together (FSDP, a collective); else each reads whole
    tensors for itself."""
    model_state, optim_state = get_state_dict(model, optimizers)
    optim = {"state": optim_state["state"]}
    if param_groups is None:
        optim["param_groups"] = optim_state["param_groups"]
    target = {"model": model_state, "optimizers": optim}
    _read_parts(folder, target, distributed)
    set_state_dict(model, optimizers, model_state_dict=target["model"],
                   optim_state_dict={"state": optim["state"],
                                     "param_groups": optim.get("param_groups", param_groups)})


def _read_parts(folder: Path, target: dict, distributed: bool) -> None:
    """dcp.load of `target` from `folder` through SafeReader and SafeLoadPlanner; a failure as
    one line (ValueError), whatever DCP wrapped it in."""
    problem = dcp_damage(folder)
    if problem:
        raise Unreadable(problem)
    try:
        with warnings.catch_warnings():  # no_dist: "assuming ... a single process", as meant
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(target, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(),
                     no_dist=not distributed)
    except CheckpointException as e:
        raise _first_failure(e) from None


def _first_failure(e: CheckpointException) -> Exception:
    """The first process's error inside DCP's CheckpointException: Unreadable as it was raised
    here; a tensor of another shape (archs/ changed) as the RuntimeError it is; anything else
    (a file that does not unzip, a short read) as Unreadable, in one line."""
    for failure in (getattr(e, "failures", None) or {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure  # (error, its stack)
        if isinstance(inner, BaseException):
            line = (str(inner).strip().splitlines() or [type(inner).__name__])[0]
            if isinstance(inner, Unreadable):
                return inner
            if "mismatch sizes" in line or "size mismatch" in line:
                return RuntimeError(line)
            if isinstance(inner, pickle.UnpicklingError):  # a tensor item asking for more
                return Unreadable(f"an item holds more than data, which is never loaded "
                                  f"(nothing in it was run): {refusal(inner)}")
            return Unreadable(f"{type(inner).__name__}: {line}")
    return Unreadable((str(e).strip().splitlines() or ["unreadable"])[0])


def load_whole_into(state: dict, model: torch.nn.Module, optimizers: list) -> None:
    """A checkpoint of format 2 or before (state.pt's model and optimizers, as one process saved
    them) into a model, sharded or not: its optimizer state is keyed by position, re-keyed by
    parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    by_name = {"state": {}, "param_groups": []}
    for opt, saved in zip(optimizers, state["optimizers"]):
        order = [names[id(p)] for group in opt.param_groups for p in group["params"]]
        by_name["state"].update({order[i]: s for i, s in saved["state"].items()})
        for group, saved_group in zip(opt.param_groups, saved["param_groups"]):
            by_name["param_groups"].append(
                {**saved_group, "params": [names[id(p)] for p in group["params"]]})
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=by_name,
                   options=StateDictOptions(full_state_dict=True))


def tensors(folder: Path, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint whose name starts with `prefix` (the model's weights by
    default), whole, on the CPU, named without it; read in this one process through SafeReader
    and SafeLoadPlanner (zoo export, generate, eval; tests comparing runs)."""
    try:
        metadata = SafeReader(folder).read_metadata()
        target = {name: torch.empty(meta.size, dtype=meta.properties.dtype)
                  for name, meta in metadata.state_dict_metadata.items()
                  if name.startswith(prefix) and isinstance(meta, TensorStorageMetadata)}
        _read_parts(folder, target, distributed=False)
    except (Unreadable, RuntimeError) as e:
        raise TrainingError(f"{folder} cannot be read: {e}") from None
    return {name[len(prefix):]: t for name, t in target.items()}
