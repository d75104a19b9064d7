"""Learning-rate schedules: a pure function of the step."""

import math


def lr_at(step: int, cfg) -> float:
    """Learning rate for optimizer step `step` (0-based) under cfg.schedule."""
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(cfg.max_steps - cfg.warmup, 1)
    done = min(max(step - cfg.warmup, 0) / span, 1.0)
    if cfg.schedule == "cosine":
        return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * done))
    # wsd: warmup, stable at lr, then the last 20% of the steps decay linearly to min_lr
    decay_from = 0.8
    if done < decay_from:
        return cfg.lr
    return cfg.lr + (cfg.min_lr - cfg.lr) * (done - decay_from) / (1 - decay_from)
