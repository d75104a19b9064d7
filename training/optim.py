"""Optimizers by parameter role: AdamW, or Muon for the hidden matrices + AdamW for the rest.

Each model names every parameter's role (`model.param_roles()`, tables in the model files; the
roles are archs.layers.OPTIMIZER_ROLES), never inferred from ndim or module type: MoE experts
are bare 3-D parameters, resonance's short convolution a 2-D one that is no hidden matrix.

    role              weight decay   --optimizer adamw   --optimizer muon
    matrix, experts   yes            AdamW               Muon (each expert's matrix on its own)
    head              yes            AdamW               AdamW
    embedding, norm,  no             AdamW               AdamW
    bias, router, kernel

Muon (torch.optim.Muon: Newton-Schulz orthogonalized momentum) takes 2-D parameters only; the
subclass below also takes MoE's stacks [experts, in, out] and treats each expert's [in, out]
as its own matrix, shaped like an nn.Linear weight [out, in] for Muon's learning-rate scaling.
"""

import torch
import torch.nn as nn

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
            if p.ndim == 2:
                params_with_grad.append(p)
                grads.append(g)
                momentum_bufs.append(buf)
                continue
            for i in range(p.shape[0]):  # views: Muon's in-place updates land in the stack
                params_with_grad.append(p[i].mT)
                grads.append(g[i].mT)
                momentum_bufs.append(buf[i].mT)
        return has_complex


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
    fused = next(model.parameters()).is_cuda
    adamw = dict(lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    if cfg.optimizer == "adamw":
        return [torch.optim.AdamW([{"params": decayed, "weight_decay": cfg.weight_decay},
                                   {"params": plain, "weight_decay": 0.0}], **adamw)]
    muon = [p for role in MUON for p in groups.get(role, [])]
    head = groups.get("head", [])
    return [Muon(muon, lr=cfg.lr, weight_decay=cfg.weight_decay),
            torch.optim.AdamW([{"params": head, "weight_decay": cfg.weight_decay},
                               {"params": plain, "weight_decay": 0.0}], **adamw)]


def set_lr(optimizers: list, lr: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = lr
