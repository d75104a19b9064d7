"""`train --dry-run` and `longpack.plan`: what a run will cost, before any GPU money is spent
(docs/TRAIN.md, "At a glance" and "Memory plan"). Above the trainer: it builds the run's data,
model and step from training/, and training/ never imports it.

First the static plan, at once: the resolved config, parameters, tokens, steps, epochs, FLOPs
and the memory one process needs (training/fits.py over archs/memory.py; a run that cannot fit
this device is refused in one line). Then a probe: a warm-up and PROBE_STEPS timed steps of the
run's own step (step.train_step), on a CPU cut to about step_time.CPU_PROBE_FLOPS and scaled
up by FLOPs.
`--world-size N` plans for N processes from this one: memory and batch for N, no probe.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

from longpack import archs
from longpack.archs import GIB, bytes_text
from longpack.core import SettingsError
from longpack.pipeline import REPEAT_WARNING_EPOCHS
from longpack.training.config import TrainConfig
from longpack.training.data.loader import make_batch
from longpack.training.fits import check_memory, plan_memory
from longpack.training.metrics import check_installed, duration
from longpack.training.parallel import distributed
from longpack.training.setup import open_data
from longpack.training.step import prepare, train_step
from longpack.training.step_time import now, prefix, probe_shape

PROBE_STEPS = 2  # timed, after one warm-up
GPU_MEMORY = 80 * GIB  # --gpu-memory's default
MAX_WORLD = 2**20  # --world-size: a bound no cluster reaches, so a typo is one line


def plan(cfg: TrainConfig, say=print, world_size: int | None = None,
         gpu_memory: int = GPU_MEMORY) -> dict:
    """The plan (said as it is known) and its dict. `world_size`: plan for that many
    processes from this one, without a probe (module docstring)."""
    if world_size is not None:
        if distributed.launched().world > 1:
            raise SettingsError("--world-size plans for N processes from one: run the dry run "
                                "without torchrun (under it, the launch's processes are the "
                                "world)")
        if world_size < 1:
            raise SettingsError("--world-size must be at least 1")
        if world_size > MAX_WORLD:
            raise SettingsError(f"--world-size must be at most {MAX_WORLD:,} (got {world_size}): "
                                "far past any cluster")
        procs = distributed.launched()  # one process: nothing is started
        with probe_cache(cfg, procs) as cache:
            return _plan(cfg, cache, say, procs, world_size, gpu_memory)
    # Under torchrun the processes probe together, as they train (--fsdp: in a group even
    # when this one process is all of it, as training/loop.py starts it).
    with distributed.processes(group=cfg.fsdp) as procs, probe_cache(cfg, procs) as cache:
        return _plan(cfg, cache, say, procs, None, gpu_memory)


@contextlib.contextmanager
def probe_cache(cfg: TrainConfig, procs: distributed.Processes):
    """--cache, or else a temporary folder for the rows the probe reads, so that a dry run
    leaves nothing behind. Under torchrun it is one folder for all the launch's processes:
    a shard one of them has put in (whole, by a rename) serves the others."""
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


def _plan(cfg: TrainConfig, cache: Path, say, procs: distributed.Processes,
          world_size: int | None, gpu_memory: int) -> dict:
    world = procs.world if world_size is None else world_size
    check_installed(cfg.report_to)  # what the real run refuses, the plan refuses first
    data, cfg, order = open_data(cfg, cache, world, say)
    vocab = data.manifest["tokenizer"]["vocab_size"]
    seq = data.seq - 1
    if world_size is None:  # this launch: refused here if it cannot fit this device
        mem = check_memory(cfg, vocab, seq, procs.device, world)
    else:  # N processes elsewhere: the plan says whether --gpu-memory holds it
        mem = plan_memory(cfg, vocab, seq, world)
    counted = archs.build(cfg.model, device="meta", vocab_size=vocab,  # sizes, no memory
                          **cfg.model_overrides)
    rows_per_step = order.global_batch
    steps, cut_by = order.last_step(cfg.max_steps)
    drawn = order.rows_before(steps)
    sources = [{"name": n, "train_rows": int(order.sizes[k]), "rows": int(drawn[k]),
                "tokens": int(drawn[k]) * seq, "epochs": float(drawn[k] / order.sizes[k])}
               for k, n in enumerate(data.names)]
    params = counted.num_params()
    p = {"config": cfg.to_dict(), "device": str(procs.device), "vocab_size": vocab,
         "params": params,
         "active_params": counted.active_params() if hasattr(counted, "active_params") else params,
         "param_parts": param_parts(counted),
         "seq": seq, "world_size": world, "tokens_per_step": rows_per_step * seq, "steps": steps,
         "stopped_by_max_epochs": None if cut_by is None else data.names[cut_by],
         "tokens": rows_per_step * seq * steps,
         "epochs": steps * rows_per_step / len(data.train), "sources": sources,
         "no_val": [name for name, val in data.vals if val is None],
         "flops": counted.flops_per_token(seq) * rows_per_step * seq * steps,
         "sharding": mem.pop("sharding"),
         "memory_per_process": {k: mem[k] for k in MEMORY_KEYS},
         "memory_floor": mem["floor"], "gpu_memory": gpu_memory,
         "fits": mem["total"] <= gpu_memory}
    say(render(p))
    if world_size is not None:
        p.update({"probe_skipped": f"--world-size {world_size}: planned from one process",
                  "probe_step_seconds": None, "eta_seconds": None})
        say(render_time(p))
        return p
    rows, length = probe_shape(counted.flops_per_token, seq, cfg.batch_size, procs.device)
    p.update(probe(cfg, data, procs, vocab, rows, length, say, steps))
    say(render_time(p))
    return p


MEMORY_KEYS = ("params", "grads", "optimizer", "buffers", "activations", "total",
               "activations_checkpointed", "activations_full")


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
    model = archs.build(cfg.model, vocab_size=vocab, **cfg.model_overrides).to(device)
    state = prepare(model, cfg, procs)
    train = data.train
    samples = [train.get(i % len(train)) for i in range(rows)]
    batch = make_batch([prefix(s, length + 1) for s in samples], device, cfg.compile)
    micro, updates, losses = [], [], []
    for i in range(PROBE_STEPS + 1):
        out = train_step(state, [batch], i, cfg, procs, clock=lambda: now(device))
        micro.append(out.forward_backward_seconds)
        updates.append(out.update_seconds)
        step_loss = out.read()["loss"]
        losses.append(step_loss)
        loss = "-" if step_loss is None else f"{step_loss:.4f}"  # "-": padding only
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


def param_parts(model) -> dict:
    """Where a model's parameters are: {"embedding", "head" (0 when `tied`: the head is the
    embedding's weight), "tied", "layers" (each block's), "rest"}, so that a count can be set
    against one worked out by hand (a seed's "24 x 45.1M")."""
    def count(module) -> int:
        return sum(p.numel() for p in module.parameters())

    tied = model.head.weight is model.embed.weight  # one weight, counted once (as the embedding)
    parts = {"embedding": count(model.embed), "head": 0 if tied else count(model.head),
             "tied": tied, "layers": [count(block) for block in model.blocks]}
    parts["rest"] = count(model) - parts["embedding"] - parts["head"] - sum(parts["layers"])
    return parts


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
              f"  compute     {p['flops']:.3g} FLOPs"]
    model = archs.config(c["model"], **archs.parse_args(c["model"], list(c["model_args"])))
    parts = p["param_parts"]
    layers = sorted(set(parts["layers"]))
    head = "the head, tied to it" if parts.get("tied") else f"head {parts['head']:,}"
    lines.append(f"  sizes       embedding {parts['embedding']:,} + {head} + "
                 f"{len(parts['layers'])} layers "
                 + (f"of {layers[0]:,}" if len(layers) == 1 else
                    f"of {layers[0]:,} to {layers[-1]:,} ({sum(parts['layers']):,})")
                 + f" + the rest {parts['rest']:,} (final norm"
                 + (", multi-token heads)" if getattr(model, "n_pred_tokens", 1) > 1 else ")"))
    lines += [f"  sizes       {line}" for line in getattr(model, "derived", ())]
    if hasattr(model, "tie_embeddings") and not parts.get("tied"):  # a model of "tied weights"
        lines.append(f"  sizes       the head is a weight of its own ({parts['head']:,}): "
                     "--model-arg tie_embeddings=true makes it the embedding's, "
                     f"{p['params'] - parts['head']:,} parameters in all")
    scan = archs.mamba.scan_lines(model, p["device"])
    lines += scan
    if scan and c["compile"]:  # MambaMixer.forward skips LeanMix while torch.compile traces
        lines.append("  compile     Mamba layers run their plain path under --compile (autograd "
                     "keeps the mixer's tensors, not LeanMix's recompute): the memory plan "
                     "below does not model it")
    lines += render_memory(p)
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


def render_memory(p: dict) -> list[str]:
    """The memory lines: per process, each part, the total and whether --gpu-memory holds it."""
    c, m, size = p["config"], p["memory_per_process"], bytes_text
    world = p["world_size"]
    procs = f"1 of {world:,} processes, {p['sharding']}" if world > 1 else "1 process"
    adamw = "AdamW: exp_avg, exp_avg_sq, step"
    optimizer = adamw if c["optimizer"] == "adamw" else (
        "Muon: a momentum on the matrices and experts; " + adamw + " on the rest")
    buffers = ("FSDP: blocks' unsharded weights and gradients in flight, an estimate"
               if c["fsdp"] else "DDP's gradient buckets" if world > 1 else "none")
    on, off = m["activations_checkpointed"], m["activations_full"]
    other = (f"without it {size(off)}" if c["activation_checkpointing"]
             else f"{size(on)} with --activation-checkpointing")
    fits = "fits" if p["fits"] else "does NOT fit"
    rows = [("weights", m["params"], "fp32, with the module buffers"),
            ("gradients", m["grads"], "fp32"),
            ("optimizer", m["optimizer"], optimizer),
            ("buffers", m["buffers"], buffers),
            ("activations", m["activations"], f"{c['precision']}, "
             f"{'with' if c['activation_checkpointing'] else 'without'} activation "
             f"checkpointing ({other})")]
    return ([f"  memory      per process ({procs}), a micro-batch of {c['batch_size']:,} x "
             f"{p['seq']:,} tokens (archs/memory.py):"]
            + [f"    {name:<12}{size(n):>12}  {what}" for name, n, what in rows]
            + [f"    {'total':<12}{size(m['total']):>12}  {fits} --gpu-memory "
               f"{size(p['gpu_memory'])}"])


def render_time(p: dict) -> str:
    if p.get("probe_skipped"):
        return (f"  time        not probed ({p['probe_skipped']}): time it with --dry-run "
                "under torchrun on the machines themselves")
    how = (f"probed at {p['probe_rows']} x {p['probe_tokens']} tokens and scaled by FLOPs"
           if p["probe_scaled"] else "measured here")
    return (f"  time        {p['probe_step_seconds']:.3f} s/step ({how}) -> ETA "
            f"{duration(p['eta_seconds'])} for {p['steps']:,} steps")

