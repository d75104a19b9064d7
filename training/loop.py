"""The training loop, top to bottom: processes -> data -> model -> optimizer -> resume -> steps.

Each step's rows come from the global order (sampler.py), so the run is a pure function of the
config and the shards: N steps straight and K steps + resume + N - K steps give the same losses
and weights (CPU, fp32), and a resume with another number of processes or per-device batch
(the same global batch) continues the same order. A checkpoint keeps model, optimizers, grad
scaler, step, RNG states and the recent batch hashes; a resumed run recomputes those hashes
from its own order and refuses to go on if they differ, and refuses other shards or --seq.

The models in archs/ draw no random numbers while training (no dropout, no router noise), so
nothing a rank computes depends on which rank it is or how many there are.

Under torchrun every process runs this same code on its slice of each step (DDP averages the
gradients); rank 0 logs and saves.
"""

import contextlib
import dataclasses
import math
import random
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch

import archs
from pipeline.errors import LongpackError
from training import checkpoint, distributed
from training.batch import make_batch, model_inputs
from training.config import TrainConfig
from training.data import Build, open_build
from training.loader import StepBatches, batches
from training.metrics import MetricsLog, check_installed, duration, peak_flops
from training.optim import make_optimizers, set_lr
from training.sampler import GlobalOrder, batch_hash
from training.schedule import lr_at

RECENT_HASHES = 16
SHARD_CACHE = "shard-cache"  # in the run directory, without --cache


class TrainingError(LongpackError):
    pass


class LossOf(torch.nn.Module):
    """model.loss as a module's forward, so that DDP and torch.compile wrap the loss too."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, targets, doc_starts=None) -> dict:
        return self.model.loss(input_ids, targets, doc_starts)


def train(cfg: TrainConfig, resume: str = "auto", log=print,
          stop_at: int | None = None) -> list[dict]:
    """Train to cfg.max_steps, or stop early after step `stop_at` with a checkpoint (what a
    SIGTERM handler does; tests use it to interrupt a run). Returns the metrics history."""
    procs = distributed.start()
    try:
        return _train(cfg, resume, log if procs.main else (lambda _: None), stop_at, procs)
    finally:
        distributed.stop(procs)


def _train(cfg, resume, log, stop_at, procs):
    run = Path(cfg.out)
    check_installed(cfg.report_to)
    # -- resume point: read, and its model checked, before the data is opened ----------------
    found = find_checkpoint(run, resume)
    if found:
        check_model(*found, cfg)
    # -- data, model, resume: checked before the run starts; what a failure here made under
    # --out (the shard cache) goes again, so a refused run leaves nothing behind --------------
    with removed_on_failure(run):
        build = open_build(cfg.shards, Path(cfg.cache or run / SHARD_CACHE), cfg.cache_limit,
                           cfg.seq)
        cfg = resolve_steps(cfg, build.seq, procs.world)
        order = GlobalOrder(len(build.train), cfg.batch_size * cfg.grad_accum * procs.world,
                            cfg.seed, build.fingerprint)
        if found:
            check_resume(*found, build, order)
        # -- device and model -------------------------------------------------------------
        device = procs.device
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        model = archs.build(cfg.model,
                            vocab_size=build.manifest["tokenizer"]["vocab_size"]).to(device)
        optimizers = make_optimizers(model, cfg)
        # fp16 needs loss scaling against underflow; bf16 and fp32 do not.
        scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
        step, history = 0, []
        # -- resume -------------------------------------------------------------------------
        if found:
            state, path = found
            try:
                model.load_state_dict(state["model"])
            except RuntimeError as e:  # same name, other shapes: archs/ changed since
                raise TrainingError(f"{path}: its weights do not fit --model {cfg.model} as "
                                    f"archs/ builds it now ({str(e).splitlines()[0]}); pass "
                                    "--resume never or another --out to start afresh") from None
            for opt, s in zip(optimizers, state["optimizers"]):
                opt.load_state_dict(s)
            scaler.load_state_dict(state["scaler"])
            set_rng_state(state["rng"])
            step, history = state["step"], state["history"]
    # -- the run starts: its directory and metrics ------------------------------------------
    run.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(run, cfg.report_to, cfg.to_dict()) if procs.main else None
    if found:
        log(f"resumed from {found[1]} at step {step}")
    if metrics:
        metrics.truncate(step)  # lines of steps from here on (a crash, --resume never) go again
    net = LossOf(model)
    ddp = None
    if procs.world > 1:
        ddp = net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device] if device.type == "cuda" else None)
    if cfg.compile:
        net = torch.compile(net)
    # -- steps ------------------------------------------------------------------------------
    # SIGINT/SIGTERM: finish the step in hand, save, and return (the CLI exits 0).
    signals = {"stop": False}
    previous = {}
    if threading.current_thread() is threading.main_thread():  # handlers live in the main thread
        previous = {sig: signal.signal(sig, lambda *_: signals.__setitem__("stop", True))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    data = StepBatches(order, build.train, procs.rank, procs.world, cfg.batch_size,
                       cfg.grad_accum)
    stream = iter(batches(data, step, cfg.max_steps, cfg.workers))
    peak = peak_flops(device)
    step_tokens = order.global_batch * (build.seq - 1)
    eta = Eta(cfg.max_steps)
    try:
        while step < cfg.max_steps:
            t0 = time.perf_counter()
            lr = lr_at(step, cfg)
            set_lr(optimizers, lr)
            t_data = time.perf_counter()
            micro_batches = [model_inputs(next(stream), device) for _ in range(cfg.grad_accum)]
            waited = time.perf_counter() - t_data
            # The step's loss is the mean over the real (not padding) targets of the whole
            # global batch, however it is cut into micro-batches and ranks: a micro-batch weighs
            # by its real targets, so one of padding counts for nothing.
            counts = torch.stack([(b["targets"] != -100).sum() for b in micro_batches]).tolist()
            targets = round(distributed.total(sum(counts), procs))
            loss_sum = 0.0
            for micro, (batch, count) in enumerate(zip(micro_batches, counts)):
                # DDP averages gradients on the last micro-step only, over the ranks: x world
                # undoes that average, so the gradient is of the global mean.
                sync = ddp is None or micro == cfg.grad_accum - 1
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    with autocast(cfg, device):
                        out = net(batch["input_ids"], batch["targets"],
                                  batch["doc_starts"] if cfg.doc_mask else None)
                    weight = count * procs.world / max(targets, 1)
                    scaler.scale(out["loss"] * weight).backward()
                loss_sum += out["loss"].item() * count
            # None: no real target in the step (windows of padding); the gradients were zero.
            total = distributed.total(loss_sum, procs) / targets if targets else None
            if total is not None and not math.isfinite(total):
                raise TrainingError(f"loss is {total} at step {step}; the last good checkpoint "
                                    f"is in {run} (resume from it with a lower --lr)")
            for opt in optimizers:
                scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip or float("inf"))
            for opt in optimizers:
                scaler.step(opt)
                opt.zero_grad(set_to_none=True)
            scaler.update()
            seconds = time.perf_counter() - t0
            record = {"step": step, "loss": total, "targets": targets, "lr": lr,
                      "grad_norm": float(norm),
                      "tokens": (step + 1) * step_tokens, "batch": batch_hash(order.step_rows(step)),
                      "seconds": seconds, "data_seconds": waited,
                      "tokens_per_second": step_tokens / seconds}
            if peak:
                flops = model.flops_per_token(build.seq - 1) * step_tokens
                record["mfu"] = flops / seconds / (peak * procs.world)
            if device.type == "cuda":
                record["memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps:
                record.update(evaluate(model, build, cfg, procs) or {})
            record.update(eta.after(step))
            history.append(record)
            if metrics:
                metrics.write(record)
            if "console" in cfg.report_to and (step % cfg.log_every == 0 or "val_loss" in record):
                log(console_line(record, cfg.max_steps))
            step += 1
            stopping = distributed.anyone(signals["stop"], procs) or (
                stop_at is not None and step >= stop_at)
            if step % cfg.save_every == 0 or step == cfg.max_steps or stopping:
                if procs.main:
                    checkpoint.save(run, step, {
                        "model": model.state_dict(),
                        "optimizers": [o.state_dict() for o in optimizers],
                        "scaler": scaler.state_dict(), "rng": rng_state(),
                        "step": step, "history": history, "fingerprint": build.fingerprint,
                        "seq": build.seq, "config": cfg.to_dict(),
                        "recent_hashes": [(h["step"], h["batch"])
                                          for h in history[-RECENT_HASHES:]]},
                        cfg.keep_last)
                distributed.barrier(procs)
            if stopping:
                log(f"stopped at step {step}: re-run the same command to resume")
                break
    finally:
        stream.close()  # the loader's workers go now, not at garbage collection
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return history


@contextlib.contextmanager
def removed_on_failure(run: Path):
    """If the block fails, remove what it made under the run directory: the directory itself,
    or in an existing run the shard cache or a build's folder in it (shard-cache/FINGERPRINT of
    other shards, before the resume refuses them). A --cache elsewhere may be shared with
    other runs and is left alone."""
    cache = run / SHARD_CACHE
    made_run, made_cache = not run.exists(), not cache.exists()
    before = set(cache.iterdir()) if cache.is_dir() else set()
    try:
        yield
    except BaseException:
        if made_run or made_cache:
            shutil.rmtree(run if made_run else cache, ignore_errors=True)
        elif cache.is_dir():
            for path in set(cache.iterdir()) - before:
                shutil.rmtree(path, ignore_errors=True)
        raise


def resolve_steps(cfg: TrainConfig, seq: int, world: int = 1) -> TrainConfig:
    """--total-tokens -> max_steps (tokens per step = global batch x (seq - 1) predictions)."""
    if cfg.total_tokens is not None:
        per_step = cfg.batch_size * cfg.grad_accum * world * (seq - 1)
        cfg = dataclasses.replace(cfg, max_steps=math.ceil(cfg.total_tokens / per_step),
                                  total_tokens=None)
    if cfg.warmup > cfg.max_steps:
        raise TrainingError(f"--warmup {cfg.warmup} is longer than the run ({cfg.max_steps} "
                            "steps)")
    return cfg


def find_checkpoint(run: Path, resume: str) -> tuple[dict, Path] | None:
    """--resume auto: the newest sound checkpoint in the run, if any; never: none; else the
    checkpoint directory named."""
    if resume == "never":
        return None
    if resume == "auto":
        return checkpoint.load_latest(run)
    return checkpoint.load(Path(resume))


def check_model(state: dict, path: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a checkpoint of another model (its weights would not load)."""
    was = state["config"]["model"]
    if was != cfg.model:
        raise TrainingError(f"{path} holds a {was} model and this run asks for --model "
                            f"{cfg.model}; pass --model {was} to resume it, or --resume never "
                            "or another --out to start a new run")


def check_resume(state: dict, path: Path, build: Build, order: GlobalOrder) -> None:
    """Refuse a checkpoint of other shards, another --seq, or another order of rows."""
    if state["fingerprint"] != build.fingerprint:
        raise TrainingError(f"{path} was trained on other shards (fingerprint "
                            f"{state['fingerprint']}, these are {build.fingerprint}); pass "
                            "--resume never or the original --shards")
    if state["seq"] != build.seq:
        raise TrainingError(f"{path} was trained with --seq {state['seq']}, this run has "
                            f"{build.seq}; pass --seq {state['seq']} or --resume never")
    for step_no, h in state["recent_hashes"]:
        if batch_hash(order.step_rows(step_no)) != h:
            raise TrainingError(f"resume check failed: step {step_no} would read other rows "
                                "than the checkpointed run did (seed or global batch changed?)")


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            # this process's device only: the others belong to other ranks
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def autocast(cfg: TrainConfig, device: torch.device):
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def evaluate(model, build: Build, cfg: TrainConfig, procs) -> dict | None:
    """Loss and perplexity over the first eval_batches * batch_size samples of val: the sum of
    the loss of every real target over their number (all processes together; padding counts
    for nothing), so it does not depend on how the samples are batched. The batches are shared
    out over the processes. None without val rows, or if those samples are padding only."""
    if build.val is None:
        return None
    n = min(len(build.val), cfg.eval_batches * cfg.batch_size)
    starts = range(0, n, cfg.batch_size)
    was_training = model.training
    model.eval()
    loss_sum, targets = 0.0, 0
    with torch.no_grad():
        for i in starts[procs.rank::procs.world]:
            rows = [build.val.get(r) for r in range(i, min(i + cfg.batch_size, n))]
            batch = make_batch(rows, procs.device)
            with autocast(cfg, procs.device):
                out = model.loss(batch["input_ids"], batch["targets"],
                                 batch["doc_starts"] if cfg.doc_mask else None)
            count = int((batch["targets"] != -100).sum())
            loss_sum += out["ce"].item() * count  # ce is the mean over these targets
            targets += count
    model.train(was_training)
    loss_sum, targets = distributed.total(loss_sum, procs), round(distributed.total(targets, procs))
    if not targets:
        return None
    loss = loss_sum / targets
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)), "val_targets": targets}


class Eta:
    """Time left from the wall-clock pace of this process's steps (evaluations and checkpoint
    saves included), leaving out its first step, which pays for warm-up and compilation."""

    def __init__(self, total: int):
        self.total, self.first_step, self.t_first = total, None, None

    def after(self, step: int) -> dict:
        """{progress, eta_seconds} once `step` (0-based) is done; eta None until the pace is
        known (the first step of a process)."""
        now = time.perf_counter()
        if self.t_first is None:
            self.first_step, self.t_first = step, now
        done, left = step - self.first_step, self.total - (step + 1)
        eta = 0.0 if not left else left * (now - self.t_first) / done if done else None
        return {"progress": (step + 1) / self.total, "eta_seconds": eta}


def console_line(r: dict, total: int) -> str:
    extra = f" val {r['val_loss']:.4f}" if "val_loss" in r else ""
    extra += f" mfu {100 * r['mfu']:.1f}%" if "mfu" in r else ""
    extra += f" mem {r['memory_gib']:.1f} GiB" if "memory_gib" in r else ""
    eta = r.get("eta_seconds")
    extra += f" ETA {'-' if eta is None else duration(eta)}"  # "-": known after one more step
    loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"  # "-": padding only
    return (f"step {r['step'] + 1:>{len(str(total))}}/{total} ({100 * r['progress']:5.1f}%) "
            f"loss {loss} lr {r['lr']:.2e} grad {r['grad_norm']:.2f} "
            f"{r['tokens_per_second']:,.0f} tok/s{extra}")
