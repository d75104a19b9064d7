"""`train --dry-run`: what a run will cost, before any GPU money is spent.

First, at once, the static plan: resolved config, parameters (total and active, at the build's
vocabulary), tokens per step, steps, epochs over the shards, training FLOPs
(model.flops_per_token) and a memory estimate, a floor (`memory_floor`): weights + gradients +
optimizer state (16 bytes per parameter with AdamW in fp32), the fp32 logits the loss keeps and
their gradient (all of a micro-batch's within archs.layers' budget, else one chunk's), and each
block's fp32 input for the micro-batch (what activation checkpointing keeps; the rest of the
activations is not counted). A run, or a dry run, whose floor passes the device's memory is
refused in one line before any weight is allocated (`check_memory`, which training/loop.py
calls too before it builds the model). Then a probe, one line per probe step: a warm-up and
PROBE_STEPS timed steps, each step.train_step on one micro-batch: the step the run takes (grad
scaler, clipping, the optimizers, DDP under torchrun, torch.compile), its loss said beside its
time.

On a GPU a probe step is one full micro-batch (batch_size x seq): the measurement is the run's.
On a CPU that would take minutes (neox-tiny at seq 32768: 8 x 32767 tokens, ~23 TFLOPs a step,
four of them were 13 minutes with nothing printed), so a CPU probe step is cut to about
CPU_PROBE_FLOPS (fewer rows, then a shorter prefix of a row) and its time is scaled up by the
ratio of FLOPs (model.flops_per_token at each length, so attention's growth with the length is
counted); the output says what was probed and that it was scaled. The forward and backward are
scaled (and multiplied by --grad-accum), the update after them is not.
"""

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

import archs
from archs.layers import LOGITS_BUDGET_BYTES
from pipeline import REPEAT_WARNING_EPOCHS, SettingsError
from training import distributed
from training.batch import make_batch
from training.config import TrainConfig
from training.loop import resolve_steps
from training.metrics import duration
from training.mixture import make_order, open_sources
from training.step import prepare, train_step

PROBE_STEPS = 2  # timed, after one warm-up
CPU_PROBE_FLOPS = 3e10  # per probe step on a CPU: about a second or a few
MIN_PROBE_TOKENS = 16
CE_CHUNK = 4096  # tokens per chunk of archs.layers.chunked_cross_entropy (its default)


def plan(cfg: TrainConfig, say=print) -> dict:
    # Under torchrun the processes probe together, as they train.
    procs = distributed.start()
    try:
        with probe_cache(cfg, procs) as cache:
            return _plan(cfg, cache, say, procs)
    finally:
        distributed.stop(procs)


@contextlib.contextmanager
def probe_cache(cfg: TrainConfig, procs: distributed.Processes):
    """--cache, or else a temporary folder for the rows the probe reads, so that a dry run
    leaves nothing behind. Under torchrun it is one folder for all the launch's processes:
    mosaicml-streaming's first process on a machine fills it for the others."""
    if cfg.cache:
        yield Path(cfg.cache)
        return
    if procs.world == 1:
        with tempfile.TemporaryDirectory(prefix="longpack-plan-") as tmp:
            yield Path(tmp)
        return
    launch = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT", "0")
    path = Path(tempfile.gettempdir()) / f"longpack-plan-{launch}"
    path.mkdir(exist_ok=True)
    try:
        yield path
        distributed.barrier(procs)  # the others are done with it
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _plan(cfg: TrainConfig, cache: Path, say, procs: distributed.Processes) -> dict:
    data = open_sources(cfg, cache)
    cfg = resolve_steps(cfg, data.seq, procs.world)
    vocab = data.manifest["tokenizer"]["vocab_size"]
    seq = data.seq - 1
    memory = check_memory(cfg, vocab, seq, procs.device)  # before the model is built
    counted = archs.build(cfg.model, device="meta", vocab_size=vocab,  # sizes, no memory
                          **cfg.model_overrides())
    rows_per_step = cfg.batch_size * cfg.grad_accum * procs.world
    order = make_order(data, cfg, rows_per_step)
    steps, cut_by = order.last_step(cfg.max_steps)
    drawn = order.rows_before(steps)
    sources = [{"name": n, "train_rows": int(order.sizes[k]), "rows": int(drawn[k]),
                "tokens": int(drawn[k]) * seq, "epochs": float(drawn[k] / order.sizes[k])}
               for k, n in enumerate(data.names)]
    params = counted.num_params()
    p = {"config": cfg.to_dict(), "device": str(procs.device), "vocab_size": vocab,
         "params": params,
         "active_params": counted.active_params() if hasattr(counted, "active_params") else params,
         "seq": seq, "tokens_per_step": rows_per_step * seq, "steps": steps,
         "stopped_by_max_epochs": None if cut_by is None else data.names[cut_by],
         "tokens": rows_per_step * seq * steps,
         "epochs": steps * rows_per_step / len(data.train), "sources": sources,
         "no_val": [name for name, val in data.vals if val is None],
         "flops": counted.flops_per_token(seq) * rows_per_step * seq * steps,
         "memory_bytes_estimate": memory}
    say(render(p))
    rows, length = probe_shape(counted.flops_per_token, seq, cfg.batch_size, procs.device)
    p.update(probe(cfg, data, procs, vocab, rows, length, say, steps))
    say(render_time(p))
    return p


def check_memory(cfg: TrainConfig, vocab: int, seq: int, device: torch.device) -> int:
    """The floor of what training needs on `device` (`memory_floor`), the model sized on the
    meta device (archs.footprint: nothing allocated, not every layer built). SettingsError,
    one line, when it passes the device's memory (the CPU's shared by this machine's processes
    under torchrun), or when the weights pass the CPU's, where the model is built before it
    moves to a GPU."""
    overrides = cfg.model_overrides()
    try:
        size = archs.footprint(cfg.model, vocab_size=vocab, **overrides)
    except archs.TooLarge as e:
        raise SettingsError(f"{_model_flags(cfg)}: {e}") from None
    model_cfg = archs.config(cfg.model, vocab_size=vocab, **overrides)
    need = memory_floor(size["params"], model_cfg, cfg.batch_size, seq)
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    have = archs.device_memory(device)
    if have is not None and need * sharing > have:
        shared = f" for {sharing} processes" if sharing > 1 else ""
        raise SettingsError(
            f"{_model_flags(cfg)}: {size['params']:,} parameters at the build's vocabulary of "
            f"{vocab:,}; training needs at least {_gib(need * sharing)}{shared} (16 bytes a "
            "parameter for the weights, gradients and AdamW state, the loss's logits, each "
            f"block's input for a micro-batch of {cfg.batch_size:,} x {seq:,} tokens) and "
            f"{device} has {_gib(have)} of memory: choose a smaller model, --batch-size or --seq")
    host = archs.device_memory("cpu")
    if device.type != "cpu" and host is not None and size["bytes"] > host:
        raise SettingsError(
            f"{_model_flags(cfg)}: {size['params']:,} parameters; their weights "
            f"({_gib(size['bytes'])}) are built in the CPU's memory before they move to "
            f"{device}, and it has {_gib(host)}: choose a smaller model")
    return need


def memory_floor(params: int, model_cfg, batch_size: int, seq: int) -> int:
    """Bytes a training step needs at least: 16 a parameter (fp32 weights, gradients, AdamW's
    two moments), the loss's logits (loss_bytes), the micro-batch's inputs and targets (int64)
    and each block's fp32 input, which backward needs even with activation checkpointing."""
    tokens = batch_size * seq
    blocks = 4 * tokens * model_cfg.d_model * model_cfg.n_layers
    return 16 * params + loss_bytes(tokens, model_cfg.vocab_size) + 16 * tokens + blocks


def _model_flags(cfg: TrainConfig) -> str:
    return f"--model {cfg.model}" + "".join(f" --model-arg {a}" for a in cfg.model_args)


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def loss_bytes(tokens: int, vocab: int) -> int:
    """fp32 logits and their gradient as archs.layers.chunked_cross_entropy holds them for a
    micro-batch of `tokens` predictions: all of them within its budget, else one chunk."""
    kept = tokens if tokens * vocab * 4 <= LOGITS_BUDGET_BYTES else min(tokens, CE_CHUNK)
    return 8 * kept * vocab


def probe_shape(flops_per_token, seq: int, batch_size: int, device) -> tuple[int, int]:
    """(rows, predicted tokens per row) of a probe micro-batch: the real one on a GPU; on a CPU
    cut to about CPU_PROBE_FLOPS, first in rows, then in length."""
    if device.type != "cpu":
        return batch_size, seq
    tokens = max(MIN_PROBE_TOKENS, int(CPU_PROBE_FLOPS / flops_per_token(seq)))
    if tokens >= seq:
        return min(batch_size, tokens // seq), seq
    return 1, min(tokens, seq)


def probe(cfg: TrainConfig, data, procs: distributed.Processes, vocab: int, rows: int,
          length: int, say, steps: int) -> dict:
    """Time PROBE_STEPS training steps of one micro-batch of `rows` x `length` after a warm-up;
    scale the forward and backward to the run's micro-batch by FLOPs and to its step by
    grad_accum, and add the update."""
    seq, device = data.seq - 1, procs.device
    scaled = (rows, length) != (cfg.batch_size, seq)
    say(f"  probe       1 warm-up + {PROBE_STEPS} timed steps of {rows} x {length} tokens on "
        f"{device}" + (f" (the run's micro-batch is {cfg.batch_size} x {seq}: the time is "
                       "scaled up by FLOPs)" if scaled else ""))
    torch.manual_seed(cfg.seed)  # the run's initial weights (the same on every process)
    model = archs.build(cfg.model, vocab_size=vocab, **cfg.model_overrides()).to(device)
    state = prepare(model, cfg, procs)
    train = data.train
    samples = [train.get(i % len(train)) for i in range(rows)]
    batch = make_batch([_prefix(s, length + 1) for s in samples], device)
    micro, updates, losses = [], [], []
    for i in range(PROBE_STEPS + 1):
        out = train_step(state, [batch], i, cfg, procs, clock=lambda: _now(device))
        micro.append(out.forward_backward_seconds)
        updates.append(out.update_seconds)
        losses.append(out.loss)
        loss = "-" if out.loss is None else f"{out.loss:.4f}"  # "-": padding only
        say(f"  probe       step {i + 1}/{PROBE_STEPS + 1}: "
            f"{out.forward_backward_seconds + out.update_seconds:.3f} s, loss {loss}"
            + (" (warm-up, not counted)" if i == 0 else ""))
    micro_seconds, update_seconds = _median(micro[1:]), _median(updates[1:])
    flops = model.flops_per_token
    scale = (flops(seq) * cfg.batch_size * seq) / (flops(length) * rows * length)
    step_seconds = micro_seconds * scale * cfg.grad_accum + update_seconds
    return {"probe_rows": rows, "probe_tokens": length, "probe_scaled": scaled,
            "probe_losses": losses, "probe_step_seconds": step_seconds,
            "eta_seconds": step_seconds * steps}


def _prefix(sample, n: int):
    """The first n tokens of a sample, with the segments that start in them."""
    tokens, starts, hashes = sample
    keep = int((starts < n).sum())
    return tokens[:n], starts[:keep], None if hashes is None else hashes[:keep]


def _now(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def render(p: dict) -> str:
    c = p["config"]
    lines = ["train --dry-run: nothing is trained", "  config      " + ", ".join(
        f"{k}={v}" for k, v in c.items())]
    lines += [f"  model       {c['model']}: {p['params']:,} parameters ({p['active_params']:,} "
              f"active) at the build's vocabulary of {p['vocab_size']:,}, on {p['device']}",
              f"  data        {p['tokens_per_step']:,} tokens/step x {p['steps']:,} steps = "
              f"{p['tokens']:,} tokens, {p['epochs']:.2f} epochs over train"
              + (f" (the run stops here: {p['stopped_by_max_epochs']} reaches --max-epochs; "
                 f"--max-steps is {c['max_steps']:,})" if p["stopped_by_max_epochs"] else ""),
              f"  compute     {p['flops']:.3g} FLOPs; memory ~{p['memory_bytes_estimate'] / 2**30:.2f}"
              " GiB at least (weights, gradients, AdamW state, the loss's logits, each block's "
              "input)"]
    if len(p["sources"]) > 1:
        for src in p["sources"]:
            lines.append(f"  source      {src['name']}: {src['tokens']:,} tokens "
                         f"({src['rows']:,} rows), {src['epochs']:.2f} epochs of its "
                         f"{src['train_rows']:,} train rows")
    for name in p["no_val"]:
        lines.append(f"  val         {name}: the build has no val rows: no val loss for it")
    for src in p["sources"]:
        if src["epochs"] > REPEAT_WARNING_EPOCHS:
            lines.append(f"  warning     {src['name']} is repeated {src['epochs']:.1f} times: "
                         f"past about {REPEAT_WARNING_EPOCHS} epochs repeated tokens are worth "
                         "much less than new ones; lower its weight or add data "
                         "(--max-epochs stops the run before)")
    return "\n".join(lines)


def render_time(p: dict) -> str:
    how = (f"probed at {p['probe_rows']} x {p['probe_tokens']} tokens and scaled by FLOPs"
           if p["probe_scaled"] else "measured here")
    return (f"  time        {p['probe_step_seconds']:.3f} s/step ({how}) -> ETA "
            f"{duration(p['eta_seconds'])} for {p['steps']:,} steps")

