"""Whether a run fits its device's memory, checked before anything is allocated: the run's
one-line refusal (training/loop.py) and the dry run's memory figures (training/dry_run.py). The
model is sized on the meta device and its memory laid out by archs/memory.py; nothing here
builds, probes or times anything.
"""

import os
import sys

import torch

from longpack import archs
from longpack.archs import Sharding, memory_plan
from longpack.core import SettingsError
from longpack.training.config import TrainConfig
from longpack.training.parallel import distributed


def plan_memory(cfg: TrainConfig, vocab: int, seq: int, world: int) -> dict:
    """archs/memory.py's memory_plan for this run on `world` processes, and its sharding
    (words). SettingsError, one line, for a model no tensor can hold or --fsdp-replicas that
    do not divide the processes."""
    overrides = cfg.model_overrides
    if cfg.fsdp and world % cfg.fsdp_replicas:
        raise SettingsError(f"--fsdp-replicas {cfg.fsdp_replicas} must divide the {world} "
                            "processes (each replica is a group of world / R processes)")
    try:
        lay = archs.layout(cfg.model, vocab_size=vocab, **overrides)
    except archs.TooLarge as e:
        raise SettingsError(f"{_model_flags(cfg)}: {e}") from None
    sharding = Sharding(world, cfg.fsdp, cfg.fsdp_replicas)
    model_cfg = archs.config(cfg.model, vocab_size=vocab, **overrides)
    # a compiled run's doc_starts is as wide as its rows (one shape); an eager run's as wide as
    # its batch's most documents in a row, which adds that many slots to a depth-routed block:
    # not known before the rows are read, and under 1% of its floor(c x seq) slots for rows of
    # documents of hundreds of tokens, it is not counted
    out = memory_plan(lay, model_cfg, cfg.batch_size, seq, cfg.precision, cfg.optimizer,
                      sharding, cfg.activation_checkpointing, cfg.doc_mask,
                      seq if cfg.compile else 0)
    return {**out, "count": lay.count, "bytes": 4 * lay.count + lay.buffer_bytes,
            "sharding": sharding.name}


def check_memory(cfg: TrainConfig, vocab: int, seq: int, device: torch.device,
                 world: int | None = None) -> dict:
    """The run's memory per process on `world` processes (this launch's by default), the model
    sized on the meta device (nothing allocated, not every layer built). SettingsError, one
    line, when its floor (memory.memory_plan: what it needs whatever the activations formula's
    error, so a run that fits is never refused) passes the device's memory (the CPU's shared by
    this machine's processes under torchrun), or when the weights pass the CPU's, where the
    model is built before it moves to a GPU."""
    world = distributed.launched().world if world is None else world
    mem = plan_memory(cfg, vocab, seq, world)
    need = mem["floor"]
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    have = archs.device_memory(device)
    if have is not None and need * sharing > have:
        shared = f" for {sharing} processes" if sharing > 1 else ""
        per = (mem["params"] + mem["grads"] + mem["optimizer"]) / mem["count"]
        sharded = f", {mem['sharding']}" if cfg.fsdp else ""
        raise SettingsError(
            f"{_model_flags(cfg)}: {mem['count']:,} parameters at the build's vocabulary of "
            f"{vocab:,}; training needs at least {gib(need * sharing)}{shared} ({per:.3g} "
            f"bytes a parameter for the weights, gradients and {_optimizer(cfg)} state"
            f"{sharded}, the loss's logits, each block's input for a micro-batch of "
            f"{cfg.batch_size:,} x {seq:,} tokens) and {device} has {gib(have)} of memory: "
            "choose a smaller model, --batch-size or --seq")
    if have is not None and mem["total"] * sharing > have and distributed.launched().rank == 0:
        # the floor fits, the estimate does not: the run may be killed for memory, by the
        # kernel on a CPU (no message of its own), so it is said before it starts
        print(f"train: warning: the memory plan's estimate is {gib(mem['total'] * sharing)} "
              f"and {device} has {gib(have)}: the run may run out of memory (train --dry-run "
              "shows the plan; a smaller --batch-size or --seq, or --activation-checkpointing, "
              "needs less)", file=sys.stderr, flush=True)
    host = archs.device_memory("cpu")
    if device.type != "cpu" and host is not None and mem["bytes"] > host:
        raise SettingsError(
            f"{_model_flags(cfg)}: {mem['count']:,} parameters; their weights "
            f"({gib(mem['bytes'])}) are built in the CPU's memory before they move to "
            f"{device}, and it has {gib(host)}: choose a smaller model")
    return mem


def _optimizer(cfg: TrainConfig) -> str:
    return "AdamW" if cfg.optimizer == "adamw" else "Muon (momentum) and AdamW"


def _model_flags(cfg: TrainConfig) -> str:
    return f"--model {cfg.model}" + "".join(f" --model-arg {a}" for a in cfg.model_args)


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
