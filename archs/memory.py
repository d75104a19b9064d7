"""The memory one process of a training run needs, from the model's shapes alone (built on
the meta device, never allocated): what `train --dry-run` prints (training/dry_run.py) and what
refuses a run that cannot fit (`check_memory`).

    archs.layout(name, **overrides) -> Layout: every parameter's shape, optimizer role and block
    states(layout, optimizer, Sharding(world, fsdp, replicas), rank)
                               -> {"params", "grads", "optimizer", "buffers"}: exact bytes
    memory_plan(layout, model_cfg, batch, seq, precision, optimizer, sharding, checkpointing)
                               -> the states, activations (archs/activations.py: with and
                                  without checkpointing), total, and the floor a refusal uses

States, exact (tests/test_memory_plan.py sums the real tensors after a step: one process, and
two gloo processes prepared as the trainer prepares them, under FSDP, hybrid FSDP and DDP).
Parameters are fp32 (the master weights; --precision bf16 is autocast, or FSDP's
MixedPrecisionPolicy over them) and so are gradients.
Without --fsdp every process holds all of them (DDP), and DDP's gradient buckets are a second
fp32 copy of the gradients that the all-reduce works on (`buffers`; the trainer's
DistributedDataParallel has gradient_as_bucket_view=False: DDP_BUCKET_VIEW). With --fsdp (FSDP2
`fully_shard` on each block, then the root: training/parallel/fsdp.py) the world is
--fsdp-replicas groups of shard = world / replicas processes; a parameter with r rows (dim 0) is
cut as torch.chunk cuts it, in chunks of c = ceil(r / shard) rows, process i of a group owning
rows [i c, min((i + 1) c, r)) (the last ones fewer, or none). FSDP2 stores each process's shard
padded to c rows (FSDPParam._sharded_param_data) and its gradient is a view into the group's
padded reduce-scatter output: 4 c (other dims) bytes each, on every process. The optimizer's
state is made by zeros_like of the unpadded local shard: AdamW's exp_avg and exp_avg_sq (fp32)
and a 4-byte step per parameter; Muon (training/optim.py: the matrix and experts
roles) one fp32 momentum, AdamW the rest. The first process of a group owns the most (c rows):
the plan reports it. Module buffers (rotary's inverse frequencies) are whole on every process,
with the weights. Under --fsdp Muon gathers one whole matrix (weight, gradient, momentum) at a
time for its update (training/optim.py): a transient of the optimizer step, when no
activation is held, left out.

FSDP's buffers, an estimate (`fsdp_buffers`): a block's parameters are all-gathered before it
runs and freed after (reshard_after_forward) while the next one's all-gather is already issued
(prefetch): two blocks' unsharded weights; the root's (embedding, final norm, head) stay
unsharded from its forward to its backward, and its gradients from the head's backward to the
end; in backward a block's unsharded gradients and the fp32 reduce-scatter input of the same
size. Weights and gradients in flight are in FSDP's compute dtype: bf16 under --precision bf16
(MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)), else fp32.

The floor (`memory_plan`'s "floor"), what a run needs whatever the activation formula's error:
at the optimizer step the weights, gradients and optimizer state all exist (DDP's buckets too);
at the loss the weights, optimizer state, buckets and what the loss's moment keeps in any case
(the micro-batch, every block's input, the final norm, the loss). So the floor is weights +
optimizer + DDP's buckets + the larger of the gradients and that; a run past it could not run.
"""

from dataclasses import dataclass

from longpack.archs import Layout
from longpack.archs.activations import CAST_ROLES, activations

MUON_ROLES = ("matrix", "experts")  # training/optim.py's MUON
DDP_BUCKET_VIEW = False  # training/step.py's DDP: gradient_as_bucket_view (False: buckets copy)


@dataclass(frozen=True)
class Sharding:
    """How a run lays its states over its processes: DDP (whole on each) or FSDP in groups of
    `shard` processes (hybrid: `replicas` such groups)."""
    world: int = 1
    fsdp: bool = False
    replicas: int = 1

    @property
    def shard(self) -> int:
        return self.world // self.replicas if self.fsdp else 1

    @property
    def name(self) -> str:
        if not self.fsdp:
            return "DDP" if self.world > 1 else "one process"
        if self.replicas > 1:
            return f"hybrid FSDP ({self.replicas} replicas x {self.shard} shards)"
        return f"FSDP ({self.shard} shards)"


def owned_rows(rows: int, shard: int, rank: int) -> int:
    """Rows of a dim-0 size `rows` that process `rank` of a shard group owns (torch.chunk)."""
    chunk = -(-rows // shard)
    return max(0, min(chunk, rows - rank * chunk))


def states(lay: Layout, optimizer: str, sharding: Sharding, rank: int = 0,
           precision: str = "fp32") -> dict:
    """{"params", "grads", "optimizer", "buffers"}: bytes process `rank` (of its shard group)
    holds; rank 0 holds the most. See the module's docstring."""
    shard = sharding.shard
    params = grads = opt = 0
    for p in lay.params:
        rows = p.shape[0] if p.shape else 1
        rest = p.numel // rows if rows else 0
        if sharding.fsdp:
            stored, own = -(-rows // shard) * rest, owned_rows(rows, shard, rank) * rest
        else:
            stored = own = p.numel
        params += 4 * stored
        grads += 4 * stored
        if optimizer == "muon" and p.role in MUON_ROLES:
            opt += 4 * own  # momentum
        else:
            opt += 8 * own + 4  # exp_avg, exp_avg_sq, step
    params += lay.buffer_bytes
    if sharding.fsdp:
        buffers = fsdp_buffers(lay, precision)
    else:
        buffers = 0 if sharding.world == 1 or DDP_BUCKET_VIEW else grads
    return {"params": params, "grads": grads, "optimizer": opt, "buffers": buffers}


def block_numel(lay: Layout, roles=None) -> dict:
    """{block: parameters in it (of `roles`)}, the root under None."""
    out = {}
    for p in lay.params:
        if roles is None or p.role in roles:
            out[p.block] = out.get(p.block, 0) + p.numel
    return out


def fsdp_buffers(lay: Layout, precision: str) -> int:
    """FSDP's unsharded weights and gradients in flight (an estimate; module docstring)."""
    dtype = 4 if precision == "fp32" else 2  # MixedPrecisionPolicy(param_dtype) under autocast
    sizes = block_numel(lay)
    root = sizes.pop(None, 0)
    block = max(sizes.values(), default=0)
    return 2 * block * dtype + block * (dtype + 4) + 2 * root * dtype


# -- a run's plan ----------------------------------------------------------------------------

GIB = 2**30


def memory_plan(lay: Layout, model_cfg, batch: int, seq: int, precision: str = "fp32",
                optimizer: str = "adamw", sharding: Sharding | None = None,
                checkpointing: bool = False, docs: bool = True, doc_width: int = 0) -> dict:
    """Bytes per process of a run: {"params", "grads", "optimizer", "buffers", "activations"
    (the run's: with checkpointing or not), "total", "activations_checkpointed",
    "activations_full", "floor"}. `floor` is what the run needs at least, at the optimizer step
    or at the loss, whatever the formula's error: weights, optimizer state, DDP's buckets and
    the larger of the gradients and what the loss's moment keeps (the micro-batch, every block's
    input, the final norm, the loss's log-probabilities). `doc_width`: activations.Tokens'."""
    sharding = sharding or Sharding()
    s = states(lay, optimizer, sharding, 0, precision)
    cast = block_numel(lay, CAST_ROLES)  # the weights bf16 autocast copies, by block
    act = activations(model_cfg, batch, seq, precision, docs, sharding.fsdp, cast, doc_width)
    used = act.checkpointed if checkpointing else act.peak
    resid = 2 if sharding.fsdp and precision != "fp32" else 4  # a block's input (activations)
    kept_at_loss = act.inputs + model_cfg.n_layers * resid * batch * seq * model_cfg.d_model + \
        act.detail["final"] + act.detail["loss"]
    fixed = s["params"] + s["optimizer"] + (0 if sharding.fsdp else s["buffers"])
    return {**s, "activations": used, "total": s["params"] + s["grads"] + s["optimizer"]
            + s["buffers"] + used, "activations_checkpointed": act.checkpointed,
            "activations_full": act.peak, "floor": fixed + max(s["grads"], kept_at_loss)}


def bytes_text(n: int) -> str:
    """Bytes as GiB, or MiB/KiB when small."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n} B"
