"""Optimizers: AdamW with decay only on matrices, or Muon for the hidden matrices + AdamW.

Weight decay applies to the Linear weights of the blocks and to the output head; never to
norms, biases, embeddings or other parameters (routers' and resonance kernels' included).
Muon (torch.optim.Muon: Newton-Schulz orthogonalized momentum) takes the 2-D Linear weights
inside the blocks; embeddings, head, norms, biases and everything else stay with AdamW.
"""

import torch
import torch.nn as nn


def _groups(model: nn.Module):
    hidden, head, rest = [], [], []
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            name = f"{mname}.{pname}" if mname else pname
            in_blocks = name.startswith("blocks.") and not any(
                k in name for k in ("router", "predictor"))
            if isinstance(module, nn.Linear) and pname == "weight" and in_blocks:
                hidden.append(p)
            elif isinstance(module, nn.Linear) and pname == "weight" and name.startswith("head"):
                head.append(p)
            else:
                rest.append(p)
    return hidden, head, rest


def make_optimizers(model: nn.Module, cfg) -> list[torch.optim.Optimizer]:
    hidden, head, rest = _groups(model)
    fused = next(model.parameters()).is_cuda
    adamw = dict(lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    if cfg.optimizer == "adamw":
        return [torch.optim.AdamW([{"params": hidden + head, "weight_decay": cfg.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], **adamw)]
    return [torch.optim.Muon(hidden, lr=cfg.lr, weight_decay=cfg.weight_decay),
            torch.optim.AdamW([{"params": head, "weight_decay": cfg.weight_decay},
                               {"params": rest, "weight_decay": 0.0}], **adamw)]


def set_lr(optimizers: list, lr: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = lr
