"""Checkpoints' tensors, for every run (one process, DDP, FSDP): each process writes its part of
the model and the optimizer state with torch.distributed.checkpoint (DCP), and rank 0 the rest
(state.pt: step, RNG, config, the data's fingerprint, the optimizers' param_groups) and
COMPLETE, after every process has written. A one-process run's checkpoint is a one-part one.

    step-NNNNNNNN/  __R_0.distcp (process R's part)    .metadata (DCP's index of them)
                    state.pt (rank 0: no weights)      COMPLETE (last: sha256 of every file)

DCP stores each tensor under its name with the piece each process held (a DTensor's shard,
or a plain tensor once), so a checkpoint loads under any number of processes, sharded or not:
`load_into` asks for the tensors as the model holds them now (get_state_dict: sharded for
FSDP, whole otherwise) and DCP reads the pieces that cover them. The optimizer state is keyed
by parameter name (not by position), so it follows the parameters whatever their layout.

Nothing read from a checkpoint runs code. DCP reads its `.metadata` with plain pickle, and its
default planner each non-tensor ("bytes") item with torch.load(weights_only=False); both run
whatever a crafted file asks for. Here the metadata is read by `SafeReader`, whose unpickler
builds only DCP's own metadata classes, torch sizes and dtypes (anything else: "not a DCP
metadata file", nothing run), and bytes items by `SafeLoadPlanner`, with weights_only=True
(plain values only). The trainer writes no bytes item at all: DCP gets the tensors, and the
optimizers' param_groups (learning rates, betas: plain values) go into state.pt, itself read
with weights_only=True. Checkpoints written before held the param_groups as bytes items; they
load through the same planner.
"""

import io
import pickle
import warnings
from pathlib import Path

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

from longpack import TrainingError

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


def damage(folder: Path) -> str | None:
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
    _read(folder, target, distributed)
    set_state_dict(model, optimizers, model_state_dict=target["model"],
                   optim_state_dict={"state": optim["state"],
                                     "param_groups": optim.get("param_groups", param_groups)})


def _read(folder: Path, target: dict, distributed: bool) -> None:
    """dcp.load of `target` from `folder` through SafeReader and SafeLoadPlanner; a failure as
    one line (ValueError), whatever DCP wrapped it in."""
    problem = damage(folder)
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
        _read(folder, target, distributed=False)
    except (Unreadable, RuntimeError) as e:
        raise TrainingError(f"{folder} cannot be read: {e}") from None
    return {name[len(prefix):]: t for name, t in target.items()}
