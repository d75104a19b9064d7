"""`train --dry-run`: what a run will cost, before any GPU money is spent.

Resolved config, parameters (total and active), tokens per step, steps, epochs over the shards,
training FLOPs (model.flops_per_token), a memory estimate (weights + gradients + optimizer
state: 16 bytes per parameter with AdamW in fp32, plus one loss chunk's fp32 logits and their
gradient; activations are not counted) and an
ETA from timing a few probe steps on this device (the first is a warm-up and not counted).
"""

import tempfile
import time
from pathlib import Path

import torch

import archs
from training import distributed
from training.batch import make_batch
from training.config import TrainConfig
from training.data import open_build
from training.loop import autocast, resolve_steps
from training.optim import make_optimizers

PROBE_STEPS = 3
CE_CHUNK = 4096  # tokens per chunk of archs.layers.chunked_cross_entropy


def plan(cfg: TrainConfig) -> dict:
    # The probe reads a few rows; without --cache they go to a temporary one, so a dry run
    # leaves nothing behind.
    with tempfile.TemporaryDirectory(prefix="longpack-plan-") as tmp:
        return _plan(cfg, Path(cfg.cache or tmp))


def _plan(cfg: TrainConfig, cache: Path) -> dict:
    build = open_build(cfg.shards, cache, cfg.cache_limit, cfg.seq)
    procs = distributed.launched()  # under torchrun: this rank's device, a larger global batch
    world, device = procs.world, procs.device
    cfg = resolve_steps(cfg, build.seq, world)
    source = build.train
    model = archs.build(cfg.model, vocab_size=build.manifest["tokenizer"]["vocab_size"]).to(device)
    seq = build.seq - 1
    rows_per_step = cfg.batch_size * cfg.grad_accum * world
    tokens_per_step = rows_per_step * seq
    params = model.num_params()
    active = model.active_params() if hasattr(model, "active_params") else params
    optimizers = make_optimizers(model, cfg)
    batch = make_batch([source.get(i % len(source)) for i in range(cfg.batch_size)], device)
    times = []
    for _ in range(PROBE_STEPS + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(cfg.grad_accum):
            with autocast(cfg, device):
                loss = model.loss(batch["input_ids"], batch["targets"],
                                  batch["doc_starts"] if cfg.doc_mask else None)["loss"]
            loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    step_seconds = sorted(times[1:])[len(times[1:]) // 2]
    return {"config": cfg.to_dict(), "device": str(device), "params": params,
            "active_params": active, "seq": seq, "tokens_per_step": tokens_per_step,
            "steps": cfg.max_steps, "tokens": tokens_per_step * cfg.max_steps,
            "epochs": cfg.max_steps * rows_per_step / len(source),
            "flops": model.flops_per_token(seq) * tokens_per_step * cfg.max_steps,
            "memory_bytes_estimate": 16 * params + 8 * min(cfg.batch_size * seq, CE_CHUNK)
            * model.cfg.vocab_size,
            "probe_step_seconds": step_seconds, "eta_seconds": step_seconds * cfg.max_steps}


def render(p: dict) -> str:
    c = p["config"]
    lines = ["train --dry-run: nothing is trained", "  config      " + ", ".join(
        f"{k}={v}" for k, v in c.items())]
    lines += [f"  model       {c['model']}: {p['params']:,} parameters ({p['active_params']:,} "
              f"active) on {p['device']}",
              f"  data        {p['tokens_per_step']:,} tokens/step x {p['steps']:,} steps = "
              f"{p['tokens']:,} tokens, {p['epochs']:.2f} epochs over train",
              f"  compute     {p['flops']:.3g} FLOPs; memory ~{p['memory_bytes_estimate'] / 2**30:.2f}"
              " GiB (weights, gradients, AdamW state, one loss chunk)",
              f"  time        {p['probe_step_seconds']:.3f} s/step measured here -> ETA "
              f"{p['eta_seconds'] / 3600:.2f} h"]
    return "\n".join(lines)
