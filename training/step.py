"""One optimizer step, the one `train` runs each step and `train --dry-run` times.

    prepare(model, cfg, procs)   model -> TrainState: optimizers, grad scaler, and the loss as
                                 the run calls it (DDP over the processes, torch.compile)
    train_step(state, micro_batches, step, cfg, procs)
                                 forward + backward of each micro-batch, unscale, clip, update;
                                 its numbers stay on the device
    read_steps(results)          many steps' numbers on the host, in one copy

The step's loss is the mean over the real targets of the whole global batch: a micro-batch
weighs by its real targets (one of padding counts for nothing), and every term of the model's
loss is averaged with the same weights, so `ce` + `aux` = `loss`.
"""

import contextlib
import time
from dataclasses import dataclass

import torch

from longpack.training.data.loader import documents
from longpack.training.optim import lr_at, make_optimizers, set_lr
from longpack.training.parallel import distributed, fsdp


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
    """One step's numbers. `values` stays on the device, so that the step makes no host
    synchronisation and the CPU can queue the next one: the loop reads many steps' values in
    one copy (`read_steps`)."""
    names: tuple[str, ...]  # model.loss's scalars, "loss" first
    values: torch.Tensor  # float64: each name's sum x real targets, real targets, grad norm,
    # 1.0 if the update was skipped (a non-finite loss or gradient norm: `nonfinite`)
    lr: float
    forward_backward_seconds: float  # by `clock`
    update_seconds: float

    def read(self) -> dict:
        return read_steps([self])[0]


def read_steps(results: list[StepResult]) -> list[dict]:
    """Each step's numbers on the host, all in one copy: {"loss": the mean over the global
    batch's real targets (None: the step had none, windows of padding only), "targets": their
    number, "grad_norm": before clipping, "terms": each other scalar of model.loss's dict (ce,
    aux, MoE's terms) as the same weighted mean, "skipped": the update was skipped (its loss or
    gradient norm not finite)}."""
    rows = torch.stack([r.values for r in results]).tolist() if results else []
    steps = []
    for result, row in zip(results, rows):
        *sums, targets, grad_norm, skipped = row
        targets = round(targets)
        means = {k: v / targets if targets else None for k, v in zip(result.names, sums)}
        loss = means.pop("loss")
        steps.append({"loss": loss, "targets": targets, "grad_norm": grad_norm, "terms": means,
                      "skipped": bool(skipped)})
    return steps


def prepare(model: torch.nn.Module, cfg, procs: distributed.Processes) -> TrainState:
    loss, ddp = LossOf(model), None
    # fp16 needs loss scaling against underflow; bf16 and fp32 do not.
    scaler = torch.amp.GradScaler(procs.device.type, enabled=cfg.precision == "fp16")
    if cfg.fsdp:  # before the optimizers: they hold the sharded parameters
        fsdp.shard(model, cfg, procs)
    optimizers = make_optimizers(model, cfg)
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
    """One optimizer step over this process's micro-batches (model_inputs' dicts: a compiled
    run's doc_starts padded to full width, so that it compiles once) at the learning rate of
    `step`. `clock`: the dry run passes one that waits for the GPU, so that its two timings are
    the device's."""
    t0 = clock()
    amp = autocast(cfg, procs.device)
    counts = torch.stack([(b["targets"] != -100).sum() for b in micro_batches]).double()
    targets = distributed.summed(counts.sum(), procs)  # the global batch's, on the device
    sums = None  # of each scalar of the loss's dict x the micro-batch's targets (float64)
    for micro, (batch, count) in enumerate(zip(micro_batches, counts)):
        # DDP averages gradients on the last micro-step only, over the ranks (FSDP at every
        # micro-step): x world undoes that average, so the gradient is of the global mean.
        sync = state.ddp is None or micro == len(micro_batches) - 1
        with contextlib.nullcontext() if sync else state.ddp.no_sync():
            with amp:
                out = state.loss(batch["input_ids"], batch["targets"],
                                 documents(batch) if cfg.doc_mask else None)
            weight = (count * procs.world / targets.clamp(min=1)).float()
            state.scaler.scale(out["loss"] * weight).backward()
        names = tuple(k for k, v in out.items() if v.ndim == 0)  # "loss" first: model.loss's
        values = torch.stack([out[k].detach().float().double() for k in names]) * count
        sums = values if sums is None else sums + values
    sums = distributed.summed(sums, procs)
    t1 = clock()
    for opt in state.optimizers:
        state.scaler.unscale_(opt)
    grad_norm = clip_gradients(state.model.parameters(), cfg.clip).reshape(1).to(sums.device)
    skipped = nonfinite(sums[0], grad_norm[0])
    lr = lr_at(step, cfg)
    set_lr(state.optimizers, lr, cfg)
    for opt in state.optimizers:
        # fused AdamW and training/optim.py's Muon skip the update where found_inf is 1, on the
        # device. Not through scaler.step: it would put its own flag there (or read it to the
        # host, for Muon); the gradients are unscaled already, and an overflowed one is in the
        # norm, so `skipped` is the scaler's flag too, for every optimizer at once.
        opt.found_inf = skipped.float()
        try:
            opt.step()
        finally:
            vars(opt).pop("found_inf", None)
        opt.zero_grad(set_to_none=True)
    state.scaler.update()  # fp16: the scale lowered after an overflow (unscale_ recorded it)
    values = torch.cat([sums, targets.reshape(1), grad_norm, skipped.double().reshape(1)])
    return StepResult(names, values, lr, t1 - t0, clock() - t1)


def clip_gradients(parameters, max_norm: float) -> torch.Tensor:
    """The gradients' global 2-norm before clipping (float64, on the device); when `max_norm`
    is not 0 and the norm is larger, every gradient scaled by max_norm / (norm + 1e-6), as
    torch's clip_grad_norm_ does. The norm is summed in float64 so that the coefficient, cast
    to float32, does not depend on how the gradients are sharded: FSDP's shard-by-shard sums and
    one process's whole-tensor sums part in float32's last bits, and a clipped update carries
    that into the weights (MoE's and MoD's routing then amplify it into a different run)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    # one stack and one reduction: sharded gradients' partial sums become whole in one all-reduce
    total = distributed.whole(torch.stack([squares(g.detach()) for g in grads]).sum()).sqrt()
    if max_norm:
        coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0).float()
        by_device = {}
        for g in grads:
            by_device.setdefault(g.device, []).append(g)
        for device, some in by_device.items():
            torch._foreach_mul_(some, coefficient.to(device))
    return total


SQUARES_CHUNK = 1 << 24  # elements cast to float64 at once: a copy of 128 MiB at most


def squares(g: torch.Tensor) -> torch.Tensor:
    """sum(g ** 2) in float64, SQUARES_CHUNK elements cast at a time (a whole float64 copy of a
    large embedding or expert tensor would be gigabytes at the optimizer step's peak). A
    DTensor's is its local part's, a partial sum over the mesh dimensions it is sharded on."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    local = g.to_local() if isinstance(g, DTensor) else g
    flat = local.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=local.device)
    for start in range(0, flat.numel(), SQUARES_CHUNK):
        chunk = flat[start:start + SQUARES_CHUNK].double()
        total += torch.dot(chunk, chunk)
    if not isinstance(g, DTensor):
        return total
    return DTensor.from_local(total, g.device_mesh, [Partial() if p.is_shard() else Replicate()
                                                     for p in g.placements], run_check=False)


def nonfinite(loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
    """1.0 (on the device, never read here) when the step's update must be skipped: its loss,
    or its gradient norm, is NaN or infinite. Every process computes the same (both numbers are
    the whole global batch's)."""
    return (~torch.isfinite(loss_sum) | ~torch.isfinite(grad_norm)).double()


def autocast(cfg, device: torch.device):
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)
