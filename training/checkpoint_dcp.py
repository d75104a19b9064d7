"""Sharded checkpoints (`train --fsdp`): each process writes its part of the model and the
optimizer state with torch.distributed.checkpoint (DCP), and rank 0 the rest (state.pt: step,
RNG, config, the data's fingerprint) and COMPLETE, after every process has written.

    step-NNNNNNNN/  __R_0.distcp (process R's shards)  .metadata (DCP's index of them)
                    state.pt (rank 0: no weights)      COMPLETE (last: sha256 of every file)

DCP stores each tensor under its name with the piece each process held (a DTensor's shard,
or a plain tensor once), so a checkpoint loads under any number of processes, sharded or not:
`load_into` asks for the tensors as the model holds them now (get_state_dict: sharded for
FSDP, whole otherwise) and DCP reads the pieces that cover them. The optimizer state is keyed
by parameter name (not by position), so it follows the parameters whatever their layout.

DCP reads its `.metadata` with plain pickle, which runs whatever a crafted file asks for: it is
read here by `SafeReader`, whose unpickler builds only DCP's own metadata classes, torch sizes
and dtypes (anything else: "not a DCP metadata file", nothing run).
"""

import io
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from longpack import TrainingError

METADATA = ".metadata"

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
            raise ValueError(f"{Path(self.path) / METADATA} is not a DCP metadata file "
                             f"({type(e).__name__}: {e}); nothing in it was run") from None
        if metadata.storage_meta is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / METADATA).is_file()


def save_parts(folder: Path, model: torch.nn.Module, optimizers: list) -> None:
    """Every process: its part of the model and optimizer state into `folder` (a collective)."""
    model_state, optim_state = get_state_dict(model, optimizers)
    dcp.save({"model": model_state, "optimizers": optim_state}, checkpoint_id=folder)


def load_into(folder: Path, model: torch.nn.Module, optimizers: list, distributed: bool) -> None:
    """The checkpoint's model and optimizer state into `model` and `optimizers` as they are laid
    out now. `distributed`: the processes read together (FSDP, a collective); else each reads
    whole tensors for itself."""
    SafeReader(folder).read_metadata()  # refused here, in one line (DCP would wrap the error)
    model_state, optim_state = get_state_dict(model, optimizers)
    target = {"model": model_state, "optimizers": optim_state}
    with warnings.catch_warnings():  # no_dist: "assuming ... a single process", as meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(target, storage_reader=SafeReader(folder), no_dist=not distributed)
    set_state_dict(model, optimizers, model_state_dict=target["model"],
                   optim_state_dict=target["optimizers"])


def load_whole_into(state: dict, model: torch.nn.Module, optimizers: list) -> None:
    """A whole checkpoint (state.pt's model and optimizers, as one process saved them) into a
    sharded model: its optimizer state is keyed by position, re-keyed by parameter name."""
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


def model_weights(folder: Path, model: torch.nn.Module) -> None:
    """Only the model's weights of a sharded checkpoint into a plain model, in this one process
    (zoo export, generate, eval)."""
    try:
        SafeReader(folder).read_metadata()
    except ValueError as e:
        raise TrainingError(str(e)) from None
    weights = model.state_dict()
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": weights}, storage_reader=SafeReader(folder), no_dist=True)
    model.load_state_dict(weights)
