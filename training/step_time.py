"""How long a step takes, said before the first (a step of an hour on a CPU would otherwise be
an hour of silence) and when Ctrl+C asks how long the step in hand has left.

    floor = step_floor(model, seq, cfg, device)      # FLOPs at the device's best matmul rate
    about = probe_step(state, model, rows, cfg, device)  # a small micro-batch timed, scaled
    lines = long_steps(floor, about, steps, model, seq, cfg, device)

The floor is a bound, no estimate (a step does more than its matmuls at their best rate). So
where the floor says a step takes PROBE_FROM seconds or more, the run times one micro-batch cut
to about CPU_PROBE_FLOPS (the dry run's probe shape; on a GPU the run's own micro-batch),
forward and backward after a warm-up, its gradients dropped (no weight moves, no RNG is
drawn), and scales it to a step by FLOPs and --grad-accum: a few seconds spent before a step
of minutes. The dry run's probe (training/dry_run.py) times whole steps of the same shape.
"""

import dataclasses
import time

import torch

from longpack.training.config import TrainConfig
from longpack.training.data.loader import documents, make_batch
from longpack.training.metrics import duration, matmul_rate
from longpack.training.step import autocast

PROBE_FROM = 10.0  # seconds of a step's floor from which the run times a probe before step 0
CPU_PROBE_FLOPS = 3e10  # per probe micro-batch on a CPU: about a second or a few
MIN_PROBE_TOKENS = 16
SMALL_SEQ = 2048  # a first try's sample length on a CPU


def step_floor(model, seq: int, cfg: TrainConfig, device) -> float | None:
    """A floor on one optimizer step's time on this process: its FLOPs (flops_per_token, a
    micro-step's rows x grad_accum) at the device's best matmul rate (metrics.matmul_rate);
    None where the rate is not known."""
    rate = matmul_rate(device)
    if not rate:
        return None
    tokens = cfg.batch_size * cfg.grad_accum * (seq - 1)
    return model.flops_per_token(seq - 1) * tokens / rate


def probe_shape(flops_per_token, seq: int, batch_size: int, device) -> tuple[int, int]:
    """(rows, predicted tokens per row) of a probe micro-batch: the real one on a GPU; on a CPU
    cut to about CPU_PROBE_FLOPS, first in rows, then in length."""
    if device.type != "cpu":
        return batch_size, seq
    tokens = max(MIN_PROBE_TOKENS, int(CPU_PROBE_FLOPS / flops_per_token(seq)))
    if tokens >= seq:
        return min(batch_size, tokens // seq), seq
    return 1, min(tokens, seq)


def prefix(sample, n: int):
    """The first n tokens of a sample, with the segments that start in them."""
    tokens, starts, hashes = sample
    keep = int((starts < n).sum())
    return tokens[:n], starts[:keep], None if hashes is None else hashes[:keep]


def now(device) -> float:
    """The clock, after the device's queued work (a GPU's kernels run behind the host)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def probe_step(state, model, rows, cfg: TrainConfig, device) -> float:
    """An estimate of one optimizer step's seconds on this process (module docstring): `rows`,
    the split's Rows; `model` (not wrapped) and `state` (training/step.py's TrainState), whose
    weights and optimizers are left as they were."""
    seq = len(rows.get(0)[0]) - 1
    n, length = probe_shape(model.flops_per_token, seq, cfg.batch_size, device)
    batch = make_batch([prefix(rows.get(i % len(rows)), length + 1) for i in range(n)], device)
    seconds = []
    for _ in range(2):  # a warm-up, then the one timed
        t0 = now(device)
        with autocast(cfg, device):
            out = state.loss(batch["input_ids"], batch["targets"],
                             documents(batch) if cfg.doc_mask else None)
        out["loss"].backward()
        seconds.append(now(device) - t0)
        model.zero_grad(set_to_none=True)
    flops = model.flops_per_token
    scale = (flops(seq) * cfg.batch_size * seq) / (flops(length) * n * length)
    return seconds[-1] * scale * cfg.grad_accum


def long_steps(floor: float | None, about: float | None, steps: int, model, seq: int,
               cfg: TrainConfig, device) -> list[str]:
    """What a run of long steps says before its first: the estimate (`about`, probe_step's) or
    else the floor, per step and in all, from a second a step; and from a minute on a CPU, a
    first try with a smaller --seq and --batch-size (scaled from the same estimate)."""
    if floor is None or max(floor, about or 0) < 1:
        return []
    if about is None:
        lines = [f"a step takes at least {duration(floor)} here (its FLOPs at this "
                 f"{device.type}'s best matmul rate): the {steps:,} steps at least "
                 f"{duration(floor * steps)}"]
    else:
        lines = [f"a step takes about {duration(about)} here (a small micro-batch timed and "
                 f"scaled by FLOPs; at least {duration(floor)} at this {device.type}'s best "
                 f"matmul rate): the {steps:,} steps about {duration(about * steps)}"]
    per_step = about or floor
    cfg_seq = cfg.seq or seq
    if device.type == "cpu" and per_step >= 60 and (cfg_seq > SMALL_SEQ or cfg.batch_size > 1):
        small = SMALL_SEQ if cfg_seq > SMALL_SEQ and seq % SMALL_SEQ == 0 else cfg_seq
        smaller = step_floor(model, small, dataclasses.replace(cfg, batch_size=1), device)
        smaller *= per_step / floor  # the same share of the device's rate
        lines.append(f"for a first try on a CPU, --seq {small} --batch-size 1 takes "
                     f"{'about' if about else 'at least'} {_seconds(smaller)} a step")
    return lines


def _seconds(seconds: float) -> str:
    return "under a second" if seconds < 1 else duration(seconds)


class StepTimes:
    """How long a step takes, for a Ctrl+C to say how long the step in hand has left: the steps'
    measured time once there is one (the last read's), else the probe's estimate, else the
    floor, which bounds the time from below only."""

    def __init__(self, floor: float | None, about: float | None = None):
        self.floor, self.about, self.measured, self.t_step = floor, about, None, None

    def started(self) -> float:
        self.t_step = time.perf_counter()
        return self.t_step

    def took(self, seconds: float) -> None:
        self.measured = seconds

    def left(self) -> str:
        """' (about 2m 05s more)', or what is known of it; '' before any step."""
        if self.t_step is None:
            return ""
        spent = time.perf_counter() - self.t_step
        per_step = self.measured or self.about
        if per_step is not None:
            left = per_step - spent
            return " (under a second more)" if left < 1 else f" (about {duration(left)} more)"
        if self.floor is not None and spent < self.floor:
            return f" (at least {_seconds(self.floor - spent)} more)"
        return f" ({duration(spent)} into it; no step has been timed yet)"
