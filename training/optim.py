"""Optimizers by parameter role (AdamW, or Muon for the hidden matrices + AdamW for the rest), and
the learning rate by step (docs/TRAIN.md, "Steps").

Each model names every parameter's role (`model.param_roles()`), never inferred from shapes:
MoE experts are bare 3-D parameters, resonance's short convolution a 2-D one that is no hidden
matrix. Muon here also takes MoE's stacks [experts, in, out], each expert's matrix on its own.
The learning rate is a pure function of the step (`lr_at`), set just before each update.
"""

import math

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor

MUON = ("matrix", "experts")
DECAYED = (*MUON, "head")  # tuples: the parameters' order (optimizer state) is fixed


class Muon(torch.optim.Muon):
    """torch.optim.Muon over 2-D matrices and 3-D stacks of matrices [n, in, out] (x @ w[i]),
    each of the n orthogonalized, scaled and decayed exactly as a separate [out, in] parameter
    would be; its momentum is one buffer per stack."""

    def __init__(self, params, **kwargs):
        params = list(params)
        for group in params:
            for p in group["params"] if isinstance(group, dict) else [group]:
                if p.ndim not in (2, 3):
                    raise ValueError(f"Muon takes matrices or stacks of them, not {tuple(p.shape)}")
        # torch's constructor checks the settings, then refuses any parameter that is not 2-D:
        # give it a 2-D stand-in, then register the real parameters with the checked defaults.
        super().__init__([torch.zeros(1, 1, requires_grad=True)], **kwargs)
        torch.optim.Optimizer.__init__(self, params, self.defaults)

    def _init_group(self, group, params_with_grad, grads, momentum_bufs):
        params, grad_list, bufs = [], [], []
        has_complex = super()._init_group(group, params, grad_list, bufs)
        for p, g, buf in zip(params, grad_list, bufs):
            for lists, value in zip((params_with_grad, grads, momentum_bufs), matrices(p, g, buf)):
                lists.extend(value)
        return has_complex

    @torch.no_grad()
    def step(self, closure=None):
        """Sharded parameters (train --fsdp: DTensors split along dim 0) are updated one at a
        time from their whole matrices: each process gathers the parameter, its gradient and
        momentum, runs torch's Muon update on them (Newton-Schulz needs the whole matrix), and
        keeps its own shard of the results, so the update equals unsharded Muon's (to float
        rounding: tests/test_train_fsdp.py). The whole of one matrix is held at a time; every
        process computes every matrix's update (the simple way, not the cheapest).

        `self.found_inf` (a 0-d tensor, as fused AdamW takes it; set by the trainer's step):
        where it is non-zero the update is skipped on the device, parameters and momentum
        kept as they were, with no read of the flag to the host."""
        from torch.optim._muon import _single_tensor_muon

        found_inf = getattr(self, "found_inf", None)
        sharded = any(isinstance(p, DTensor) for g in self.param_groups for p in g["params"])
        if not sharded and found_inf is None:
            return super().step(closure)

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            settings = {k: group[k] for k in ("lr", "weight_decay", "momentum", "nesterov",
                                              "ns_coefficients", "ns_steps", "eps",
                                              "adjust_lr_fn")}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                whole = [t.full_tensor() if isinstance(t, DTensor) else t
                         for t in (p.detach(), p.grad, buf)]
                if found_inf is not None:  # updated in copies, kept only where the step is good
                    before = whole[0], whole[2]
                    whole = [whole[0].clone(), whole[1], whole[2].clone()]
                _single_tensor_muon(*matrices(*whole), **settings, has_complex=False)
                if found_inf is not None:
                    keep = found_inf.to(p.device) != 0
                    whole[0] = torch.where(keep, before[0], whole[0])
                    whole[2] = torch.where(keep, before[1], whole[2])
                    if not isinstance(p, DTensor):
                        p.copy_(whole[0])
                        buf.copy_(whole[2])
                        continue
                for target, value in ((p, whole[0]), (buf, whole[2])):
                    if isinstance(target, DTensor):  # this process's shard of the result
                        target.to_local().copy_(distribute_tensor(
                            value, target.device_mesh, target.placements,
                            src_data_rank=None).to_local())
        return loss


def matrices(p, g, buf) -> tuple[list, list, list]:
    """A parameter, its gradient and momentum as Muon's matrices: a 2-D one as it is, a stack
    [n, in, out] as n views [out, in] (Muon's in-place updates land in the stack)."""
    if p.ndim == 2:
        return [p], [g], [buf]
    return ([p[i].mT for i in range(p.shape[0])], [g[i].mT for i in range(p.shape[0])],
            [buf[i].mT for i in range(p.shape[0])])


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """{role: parameters}: every parameter once, under the role its model gives it."""
    params = dict(model.named_parameters())
    groups: dict[str, list[nn.Parameter]] = {}
    for name, role in model.param_roles().items():
        groups.setdefault(role, []).append(params[name])
    return groups


def make_optimizers(model: nn.Module, cfg) -> list[torch.optim.Optimizer]:
    groups = param_groups(model)
    decayed = [p for role in DECAYED for p in groups.get(role, [])]
    plain = [p for role, ps in groups.items() if role not in DECAYED for p in ps]
    # fused on every device: its kernel takes `found_inf`, so that a step with a non-finite
    # loss or gradient is skipped on the device, with no host read (training/step.py)
    adamw = dict(lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                 fused=True)
    if cfg.optimizer == "adamw":
        return [torch.optim.AdamW([{"params": decayed, "weight_decay": cfg.weight_decay},
                                   {"params": plain, "weight_decay": 0.0}], **adamw)]
    muon = [p for role in MUON for p in groups.get(role, [])]
    head = groups.get("head", [])
    return [Muon(muon, lr=muon_lr(cfg.lr, cfg), weight_decay=cfg.weight_decay,
                 momentum=cfg.muon_momentum, ns_steps=cfg.muon_ns_steps),
            torch.optim.AdamW([{"params": head, "weight_decay": cfg.weight_decay},
                               {"params": plain, "weight_decay": 0.0}], **adamw)]


def muon_lr(lr: float, cfg) -> float:
    """Muon's learning rate when the schedule is at `lr`: --muon-lr on the same schedule
    (scaled by --muon-lr / --lr), or `lr` itself without --muon-lr."""
    return lr if cfg.muon_lr is None else lr * cfg.muon_lr / cfg.lr


def set_lr(optimizers: list, lr: float, cfg=None) -> None:
    """Every group at the schedule's `lr`; Muon's at muon_lr, with the run's --muon-momentum
    and --muon-ns-steps, so a resumed run takes this run's flags (as it takes --lr) over the
    ones its checkpoint's optimizer state recorded."""
    for opt in optimizers:
        muon = isinstance(opt, torch.optim.Muon) and cfg is not None
        for group in opt.param_groups:
            group["lr"] = muon_lr(lr, cfg) if muon else lr
            if muon:
                group["momentum"], group["ns_steps"] = cfg.muon_momentum, cfg.muon_ns_steps


# -- the learning rate: a pure function of the step -------------------------------------------

SCHEDULE = ("max_steps", "schedule", "warmup", "lr", "min_lr", "restart_every", "muon_lr")


def schedule_change(saved: dict, cfg, step: int) -> str | None:
    """One line saying how a resumed run's schedule differs from its checkpoint's (`saved`:
    the checkpoint's config), and the learning rate at `step` both ways; None if it does
    not. A resume takes the command's settings: a larger --max-steps stretches the decay."""
    import dataclasses

    from longpack.core import flag_of

    fields = {f.name: f for f in dataclasses.fields(cfg)}
    changed = [k for k in SCHEDULE if k in saved and saved[k] != getattr(cfg, k)]
    if not changed:
        return None
    was = dataclasses.replace(cfg, **{k: saved[k] for k in changed})
    what = ", ".join(f"{flag_of(fields[k])} {saved[k]} -> {getattr(cfg, k)}" for k in changed)
    return (f"the learning-rate schedule differs from the checkpoint's run ({what}): from step "
            f"{step} it follows this run's, {lr_at(step, cfg):.3g} now (was to be "
            f"{lr_at(step, was):.3g})")


ONECYCLE_DIV = 25.0  # OneCycleLR's div_factor: where its warmup starts, lr / 25
ONECYCLE_WARMUP = 0.3  # its pct_start: the share of the steps that rise, without --warmup


def lr_at(step: int, cfg) -> float:
    """Learning rate for optimizer step `step` (0-based) under cfg.schedule."""
    if cfg.schedule == "onecycle":
        return _onecycle(step, cfg)
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "cosine-restarts":
        done = (max(step - cfg.warmup, 0) % cfg.restart_every) / cfg.restart_every
        return _cosine(cfg.lr, cfg.min_lr, done)
    span = max(cfg.max_steps - cfg.warmup, 1)
    done = min(max(step - cfg.warmup, 0) / span, 1.0)
    if cfg.schedule == "cosine":
        return _cosine(cfg.lr, cfg.min_lr, done)
    # wsd: warmup, stable at lr, then the last 20% of the steps decay linearly to min_lr
    decay_from = 0.8
    if done < decay_from:
        return cfg.lr
    return cfg.lr + (cfg.min_lr - cfg.lr) * (done - decay_from) / (1 - decay_from)


def _cosine(start: float, end: float, done: float) -> float:
    """From start (done 0) to end (done 1) along half a cosine."""
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * done))


def _onecycle(step: int, cfg) -> float:
    """Up from lr / ONECYCLE_DIV to lr over the warmup, then down to min_lr, both halves of a
    cosine; the warmup is --warmup steps, or ONECYCLE_WARMUP of the steps without one."""
    rise = cfg.warmup or max(1, round(ONECYCLE_WARMUP * cfg.max_steps))
    if step < rise:
        return _cosine(cfg.lr / ONECYCLE_DIV, cfg.lr, (step + 1) / rise)
    done = min((step + 1 - rise) / max(cfg.max_steps - rise, 1), 1.0)
    return _cosine(cfg.lr, cfg.min_lr, done)
