"""`train --fsdp`: the model's parameters, gradients and optimizer state sharded over the
processes with FSDP2 (torch.distributed.fsdp.fully_shard), as torchtitan and OLMo-core do.

    shard(model, cfg, procs)      in place: each block of model.blocks is a unit, then the root

A unit's parameters become DTensors split along dim 0 over the shard group; the forward of a
unit gathers its parameters (all-gather) and frees them after; backward reduce-scatters the
gradients. The root unit holds what is outside the blocks: embeddings, final norm, the head
(whose weight the chunked loss reads directly: archs.layers.chunked_cross_entropy) and MoE's
MTP projections. The zoo's loss is `model.loss(...)`, not `forward`, so it is registered as a
forward method of the root (else FSDP's hooks never run for it: "mixed torch.Tensor and
DTensor").

--fsdp-replicas R: hybrid sharding (HSDP) on a 2-D mesh (R, world / R): parameters are
sharded within each group of world / R processes (a node, say) and replicated across the R
groups, so the all-gathers stay inside a group and only the gradients cross groups.

--precision bf16: parameters are gathered in bf16 for compute and gradients reduced in fp32,
over fp32 master weights (MixedPrecisionPolicy). fp16 (a gradient scaler over sharded
gradients) is refused with --fsdp, in one line, by TrainConfig. Muon runs on sharded
parameters: its Newton-Schulz step needs whole matrices, which training/optim.py gathers
(tests/test_train_fsdp.py: Muon on sharded parameters is Muon on whole ones).

Gradients are reduce-scattered at every micro-step of an accumulation (memory stays sharded;
skipping the sync would keep whole unsharded gradients between micro-steps). Clipping uses the
global norm: clip_grad_norm_ over DTensor gradients reduces their squares over the shards.
"""

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from longpack import SettingsError
from training.parallel import distributed


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
