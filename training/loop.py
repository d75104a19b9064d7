"""The training loop, top to bottom: config -> data -> model -> optimizer -> resume -> steps.

Each step's rows come from the global order (sampler.py), so the run is a pure function of the
config and the shards: N steps straight and K steps + resume + N - K steps give the same losses
and weights (CPU, fp32). A checkpoint keeps model, optimizers, step, RNG state and the recent
batch hashes; a resumed run recomputes those hashes from its own order and refuses to go on if
they differ, and refuses shards whose fingerprint is not the checkpoint's.
"""

import contextlib
import dataclasses
import json
import math
import signal
import threading
import time
from pathlib import Path

import torch

import archs
from training import checkpoint
from training.batch import make_batch
from training.config import TrainConfig
from training.data import RowSource, dataset_fingerprint
from training.metrics import MetricsLog, peak_flops
from training.optim import make_optimizers, set_lr
from training.sampler import GlobalOrder, batch_hash
from training.schedule import lr_at

RECENT_HASHES = 16


class TrainingError(Exception):
    pass


def train(cfg: TrainConfig, resume: str = "auto", log=print,
          stop_at: int | None = None) -> list[dict]:
    """Train to cfg.max_steps, or stop early after step `stop_at` with a checkpoint (what a
    SIGTERM handler will do; tests use it to interrupt a run)."""
    # -- data -------------------------------------------------------------------------------
    shards = Path(cfg.shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    cfg = resolve_steps(cfg, manifest)
    fingerprint = dataset_fingerprint(shards)
    source = RowSource(shards / "train")
    val = RowSource(shards / "val")
    order = GlobalOrder(len(source), cfg.batch_size * cfg.grad_accum, cfg.seed, fingerprint)
    # -- device and model -----------------------------------------------------------------
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(cfg.seed)
    model = archs.build(cfg.model, vocab_size=manifest["tokenizer"]["vocab_size"]).to(device)
    optimizers = make_optimizers(model, cfg)
    # fp16 needs loss scaling against underflow; bf16 and fp32 do not.
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
    run = Path(cfg.out)
    run.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(run, cfg.log, cfg.to_dict())
    step, history = 0, []
    # -- resume -----------------------------------------------------------------------------
    found = checkpoint.load_latest(run) if resume == "auto" else None
    if resume not in ("auto", "never"):
        found = (torch.load(Path(resume) / "state.pt", weights_only=False), Path(resume))
    if found:
        state, path = found
        if state["fingerprint"] != fingerprint:
            raise TrainingError(f"{path} was trained on other shards (fingerprint "
                                f"{state['fingerprint']}, these are {fingerprint}); pass "
                                "--resume never or the original --shards")
        for step_no, h in state["recent_hashes"]:
            if batch_hash(order.step_rows(step_no)) != h:
                raise TrainingError(f"resume check failed: step {step_no} would read other rows "
                                    "than the checkpointed run did (seed or batch size changed?)")
        model.load_state_dict(state["model"])
        for opt, s in zip(optimizers, state["optimizers"]):
            opt.load_state_dict(s)
        torch.set_rng_state(state["torch_rng"])
        scaler.load_state_dict(state["scaler"])
        step, history = state["step"], state["history"]
        log(f"resumed from {path} at step {step}")
    # -- steps ------------------------------------------------------------------------------
    # SIGINT/SIGTERM: finish the step in hand, save, and return (the CLI exits 0).
    signals = {"stop": False}
    previous = {}
    if threading.current_thread() is threading.main_thread():  # handlers live in the main thread
        previous = {sig: signal.signal(sig, lambda *_: signals.__setitem__("stop", True))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _steps(cfg, model, optimizers, scaler, order, source, val, run, fingerprint,
                      step, history, log, stop_at, signals, metrics)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resolve_steps(cfg: TrainConfig, manifest: dict) -> TrainConfig:
    """--total-tokens -> max_steps (tokens per step = global batch x (seq - 1) predictions)."""
    if cfg.total_tokens is not None:
        per_step = cfg.batch_size * cfg.grad_accum * (manifest["seq"] - 1)
        cfg = dataclasses.replace(cfg, max_steps=math.ceil(cfg.total_tokens / per_step),
                                  total_tokens=None)
    if cfg.warmup > cfg.max_steps:
        raise TrainingError(f"--warmup {cfg.warmup} is longer than the run ({cfg.max_steps} "
                            "steps)")
    return cfg


def autocast(cfg: TrainConfig, device: torch.device):
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def to_device(batch: dict, device: torch.device) -> dict:
    pin = device.type == "cuda"
    return {k: (v.pin_memory() if pin else v).to(device, non_blocking=pin)
            for k, v in batch.items()}


def evaluate(model, val: RowSource, cfg: TrainConfig) -> dict | None:
    """Mean loss and perplexity over the first eval_batches * batch_size rows of val."""
    n = min(len(val), cfg.eval_batches * cfg.batch_size)
    if n == 0:
        return None
    was_training = model.training
    model.eval()
    losses = []
    with torch.no_grad():
        for i in range(0, n, cfg.batch_size):
            device = next(model.parameters()).device
            batch = to_device(make_batch([val.get(r)
                                          for r in range(i, min(i + cfg.batch_size, n))]), device)
            with autocast(cfg, device):
                out = model.loss(batch["input_ids"], batch["targets"],
                                 batch["doc_starts"] if cfg.doc_mask else None)
            losses.append(out["ce"].item())
    model.train(was_training)
    loss = sum(losses) / len(losses)
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}


def _steps(cfg, model, optimizers, scaler, order, source, val, run, fingerprint, step, history,
           log, stop_at, signals, metrics):
    B = cfg.batch_size
    device = next(model.parameters()).device
    peak = peak_flops(device)
    while step < cfg.max_steps:
        t0 = time.perf_counter()
        lr = lr_at(step, cfg)
        set_lr(optimizers, lr)
        rows = order.step_rows(step)
        total = 0.0
        for micro in range(cfg.grad_accum):
            batch = to_device(make_batch([source.get(int(r))
                                          for r in rows[micro * B:(micro + 1) * B]]), device)
            with autocast(cfg, device):
                out = model.loss(batch["input_ids"], batch["targets"],
                                 batch["doc_starts"] if cfg.doc_mask else None)
            scaler.scale(out["loss"] / cfg.grad_accum).backward()
            total += out["loss"].item() / cfg.grad_accum
        if not math.isfinite(total):
            raise TrainingError(f"loss is {total} at step {step}; the last good checkpoint is "
                                f"in {run} (resume from it with a lower --lr)")
        for opt in optimizers:
            scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip or float("inf"))
        for opt in optimizers:
            scaler.step(opt)
            opt.zero_grad(set_to_none=True)
        scaler.update()
        seconds = time.perf_counter() - t0
        step_tokens = len(rows) * batch["input_ids"].shape[1]
        record = {"step": step, "loss": total, "lr": lr, "grad_norm": float(norm),
                  "tokens": (step + 1) * step_tokens, "batch": batch_hash(rows),
                  "seconds": seconds, "tokens_per_second": step_tokens / seconds}
        if peak:
            flops = model.flops_per_token(batch["input_ids"].shape[1]) * step_tokens
            record["mfu"] = flops / seconds / peak
        if device.type == "cuda":
            record["memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps:
            record.update(evaluate(model, val, cfg) or {})
        history.append(record)
        metrics.write(record)
        if "console" in cfg.log and (step % cfg.log_every == 0 or "val_loss" in record):
            extra = f" val {record['val_loss']:.4f}" if "val_loss" in record else ""
            extra += f" mfu {100 * record['mfu']:.1f}%" if "mfu" in record else ""
            log(f"step {step:>6} loss {total:.4f} lr {lr:.2e} grad {float(norm):.2f} "
                f"{record['tokens_per_second']:,.0f} tok/s{extra}")
        step += 1
        stopping = signals["stop"] or stop_at is not None and step >= stop_at
        if step % cfg.save_every == 0 or step == cfg.max_steps or stopping:
            checkpoint.save(run, step, {
                "model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                "step": step, "history": history, "torch_rng": torch.get_rng_state(),
                "scaler": scaler.state_dict(),
                "fingerprint": fingerprint, "config": cfg.to_dict(),
                "recent_hashes": [(h["step"], h["batch"]) for h in history[-RECENT_HASHES:]]},
                cfg.keep_last)
        if stopping:
            log(f"stopped at step {step}: re-run the same command to resume")
            break
    return history

