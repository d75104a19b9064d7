"""`train --fsdp`: parameters, gradients and optimizer state sharded with FSDP2
(torch.distributed.fsdp.fully_shard), as torchtitan and OLMo-core do (docs/TRAIN.md,
"Sharded training").

    shard(model, cfg, procs)      in place: each block of model.blocks is a unit, then the root

The root unit holds what is outside the blocks (embeddings, final norm, head, MTP). The zoo's
loss is `model.loss(...)`, not `forward`, so it is registered as a forward method of the root:
otherwise FSDP's hooks never run for it ("mixed torch.Tensor and DTensor"). --fsdp-replicas R
shards within groups of world / R and replicates across them; bf16 gathers in bf16 and reduces
in fp32 over fp32 master weights.
"""

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from longpack.core import SettingsError
from longpack.training.parallel import distributed


def mesh(cfg, procs: distributed.Processes):
    """The device mesh: 1-D over every process, or (replicas, shard) for hybrid sharding."""
    replicas = cfg.fsdp_replicas
    if procs.world % replicas:
        raise SettingsError(f"--fsdp-replicas {replicas} does not divide the {procs.world} "
                            "processes")
    if replicas == 1:
        return init_device_mesh(procs.device.type, (procs.world,), mesh_dim_names=("shard",))
    return init_device_mesh(procs.device.type, (replicas, procs.world // replicas),
                            mesh_dim_names=("replicate", "shard"))


def shard(model: torch.nn.Module, cfg, procs: distributed.Processes) -> None:
    """Apply FSDP2 to `model` in place: every block, then the root (see the module docstring).
    Done before the optimizers are made: they must hold the sharded parameters."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if cfg.precision == "bf16" else MixedPrecisionPolicy()
    where = mesh(cfg, procs)
    for block in model.blocks:
        fully_shard(block, mesh=where, mp_policy=policy)
    fully_shard(model, mesh=where, mp_policy=policy)
    register_fsdp_forward_method(model, "loss")


def is_sharded(model: torch.nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())
