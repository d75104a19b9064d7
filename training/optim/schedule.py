"""Learning-rate schedules: a pure function of the step."""

import math

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
