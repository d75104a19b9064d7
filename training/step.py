"""One optimizer step, the one `train` runs each step and `train --dry-run` times.

    prepare(model, cfg, procs)   model -> TrainState: optimizers, grad scaler, and the loss as
                                 the run calls it (DDP over the processes, torch.compile)
    train_step(state, micro_batches, step, cfg, procs)
                                 forward + backward of each micro-batch (fp16: scaled), then
                                 unscale, clip, optimizer step, scaler update

The step's loss is the mean over the real (not padding) targets of the whole global batch,
however it is cut into micro-batches and processes: a micro-batch weighs by its real targets,
so one of padding counts for nothing. Every other number the model's loss returns (`ce`, the
next-token loss; `aux`; MoE's balance, z_loss, mtp, ...) is averaged with the same weights, so
`ce` + `aux` = `loss` for the step as for each micro-batch (StepResult.terms).
"""

import contextlib
import time
from dataclasses import dataclass, field

import torch

from training import distributed, fsdp
from training.batch import full_width
from training.optim import make_optimizers, set_lr
from training.schedule import lr_at


class LossOf(torch.nn.Module):
    """model.loss as a module's forward, so that DDP and torch.compile wrap the loss too."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, targets, doc_starts=None) -> dict:
        return self.model.loss(input_ids, targets, doc_starts)


@dataclass
class TrainState:
    """The model in training and what trains it; a checkpoint keeps model, optimizers, scaler."""
    model: torch.nn.Module
    optimizers: list[torch.optim.Optimizer]
    scaler: torch.amp.GradScaler
    loss: torch.nn.Module  # LossOf(model), wrapped in DDP and torch.compile as the run asks
    ddp: torch.nn.parallel.DistributedDataParallel | None


@dataclass(frozen=True)
class StepResult:
    loss: float | None  # None: no real target in the step (windows of padding only)
    targets: int  # real targets of the global batch
    lr: float
    grad_norm: float  # before clipping
    forward_backward_seconds: float  # by `clock`
    update_seconds: float
    # each other scalar of model.loss's dict (ce, aux, MoE's terms), the same weighted mean as
    # `loss`; None where `loss` is None
    terms: dict = field(default_factory=dict)


def prepare(model: torch.nn.Module, cfg, procs: distributed.Processes) -> TrainState:
    if cfg.fsdp:  # before the optimizers: they hold the sharded parameters
        fsdp.shard(model, cfg, procs)
    optimizers = make_optimizers(model, cfg)
    # fp16 needs loss scaling against underflow; bf16 and fp32 do not.
    scaler = torch.amp.GradScaler(procs.device.type, enabled=cfg.precision == "fp16")
    loss, ddp = LossOf(model), None
    if procs.world > 1 and not cfg.fsdp:
        # DDP broadcasts rank 0's weights now; a checkpoint loaded later into `model` is the
        # same on every rank, so the order of the two does not matter.
        ddp = loss = torch.nn.parallel.DistributedDataParallel(
            loss, device_ids=[procs.device] if procs.device.type == "cuda" else None)
    if cfg.compile:
        loss = torch.compile(loss)  # compiled at its first call
    return TrainState(model, optimizers, scaler, loss, ddp)


def train_step(state: TrainState, micro_batches: list[dict], step: int, cfg,
               procs: distributed.Processes, clock=time.perf_counter) -> StepResult:
    """One optimizer step over this process's micro-batches (model_inputs' dicts) at the
    learning rate of `step`. `clock`: the dry run passes one that waits for the GPU, so that
    its two timings are the device's."""
    t0 = clock()
    lr = lr_at(step, cfg)
    set_lr(state.optimizers, lr, cfg)
    counts = torch.stack([(b["targets"] != -100).sum() for b in micro_batches]).tolist()
    targets = round(distributed.total(sum(counts), procs))
    sums: dict[str, float] = {}  # of each scalar of the loss's dict x the micro-batch's targets
    for micro, (batch, count) in enumerate(zip(micro_batches, counts)):
        # DDP averages gradients on the last micro-step only, over the ranks (FSDP at every
        # micro-step): x world undoes that average, so the gradient is of the global mean.
        sync = state.ddp is None or micro == len(micro_batches) - 1
        with contextlib.nullcontext() if sync else state.ddp.no_sync():
            doc_starts = batch["doc_starts"] if cfg.doc_mask else None
            if cfg.compile and doc_starts is not None:  # one shape: compiled once
                doc_starts = full_width(doc_starts, batch["input_ids"].shape[1])
            with autocast(cfg, procs.device):
                out = state.loss(batch["input_ids"], batch["targets"], doc_starts)
            weight = count * procs.world / max(targets, 1)
            state.scaler.scale(out["loss"] * weight).backward()
        names = [k for k, v in out.items() if v.ndim == 0]  # "loss" first: model.loss's order
        values = torch.stack([out[k].detach().float() for k in names]).tolist()  # one sync
        for name, value in zip(names, values):
            sums[name] = sums.get(name, 0.0) + value * count
    means = {k: v / targets if targets else None
             for k, v in zip(sums, totals(list(sums.values()), procs))}
    loss = means.pop("loss")
    t1 = clock()
    for opt in state.optimizers:
        state.scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(state.model.parameters(), cfg.clip or float("inf"))
    for opt in state.optimizers:
        state.scaler.step(opt)  # fp16: skipped when the gradients overflowed
        opt.zero_grad(set_to_none=True)
    state.scaler.update()
    grad_norm = float(fsdp.whole(norm))
    return StepResult(loss, targets, lr, grad_norm, t1 - t0, clock() - t1, means)


def totals(values: list[float], procs: distributed.Processes) -> list[float]:
    """Each number summed over all processes, in one all-reduce (float64)."""
    if procs.world == 1 or not values:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=procs.device)
    dist.all_reduce(t)
    return t.tolist()


def autocast(cfg, device: torch.device):
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)
