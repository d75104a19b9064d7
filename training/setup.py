"""What a run and its dry run set up alike, in one place so that the plan is of the run that
would start: the builds opened (their rows cached under `cache`), the run's length resolved,
the rows' order for `world` processes."""

import dataclasses
import math
from pathlib import Path

from longpack.training.config import TrainConfig
from longpack.training.data.mixture import MixedOrder, Sources, make_order, open_sources


def open_data(cfg: TrainConfig, cache: Path, world: int, log=print
              ) -> tuple[Sources, TrainConfig, MixedOrder]:
    """The sources, the config with its steps resolved (resolve_steps), and the order of the
    rows every step of `world` processes draws."""
    data = open_sources(cfg, cache)
    cfg = resolve_steps(cfg, data.seq, world, log)
    return data, cfg, make_order(data, cfg, cfg.batch_size * cfg.grad_accum * world)


def resolve_steps(cfg: TrainConfig, seq: int, world: int = 1, log=print) -> TrainConfig:
    """--total-tokens -> max_steps (tokens per step = global batch x (seq - 1) predictions), and
    a --warmup longer than the run cut to the run (a smoke test of 5 steps with the default 10),
    which `log` says."""
    if cfg.total_tokens is not None:
        per_step = cfg.batch_size * cfg.grad_accum * world * (seq - 1)
        cfg = dataclasses.replace(cfg, max_steps=math.ceil(cfg.total_tokens / per_step),
                                  total_tokens=None)
    if cfg.warmup > cfg.max_steps > 0:  # (0 steps: no schedule is run)
        log(f"--warmup {cfg.warmup} is longer than the run's {cfg.max_steps} steps: the "
            f"learning rate warms up over all {cfg.max_steps}")
        cfg = dataclasses.replace(cfg, warmup=cfg.max_steps)
    return cfg
