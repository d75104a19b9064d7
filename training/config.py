"""The trainer's settings: one frozen dataclass, a docstring per field, validated once."""

from dataclasses import asdict, dataclass

SCHEDULES = ("cosine", "wsd", "constant")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class TrainConfig:
    shards: str
    """Output directory of `pack build` (OUT, with train/ and val/)."""
    model: str = "neox-tiny"
    """archs/ preset or family name."""
    out: str = "runs/default"
    """Run directory: checkpoints, metrics.jsonl."""
    batch_size: int = 8
    """Rows per device per micro-step."""
    grad_accum: int = 1
    """Micro-steps per optimizer step."""
    max_steps: int = 100
    """Optimizer steps to train (ignored when --total-tokens is given)."""
    total_tokens: int | None = None
    """Train for this many tokens: steps = ceil(total_tokens / tokens per step)."""
    lr: float = 3e-4
    """Peak learning rate."""
    min_lr: float = 3e-5
    """Learning rate at the end of the decay."""
    warmup: int = 10
    """Linear warmup steps."""
    schedule: str = "cosine"
    """cosine: warmup, cosine to min_lr; wsd: warmup, stable, last 20% linear to min_lr;
    constant: warmup, then lr."""
    optimizer: str = "adamw"
    """adamw, or muon (torch.optim.Muon on 2-D hidden weights, AdamW on the rest)."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (not on norms, biases, embeddings)."""
    precision: str = "fp32"
    """fp32; bf16 (autocast); fp16 (autocast + gradient scaler). TF32 is on for fp32 on GPUs."""
    clip: float = 1.0
    """Gradient-norm clipping (0 = off)."""
    seed: int = 0
    """Seed of the row order and of the model's initialization."""
    doc_mask: bool = True
    """Keep attention (or convolution) inside documents."""
    save_every: int = 50
    """Steps between checkpoints (and one at the end)."""
    keep_last: int = 3
    """Checkpoints kept."""
    eval_every: int = 50
    """Steps between evaluations on the build's val split (and one at the end)."""
    eval_batches: int = 4
    """Batches of --batch-size val rows per evaluation (the first rows of val, in order)."""
    log: tuple[str, ...] = ("console", "jsonl")
    """Where metrics go: console, jsonl (always written), tensorboard, wandb."""
    log_every: int = 10
    """Steps between console lines (metrics.jsonl gets every step)."""

    def __post_init__(self):
        positive = ("batch_size", "grad_accum", "max_steps", "save_every", "keep_last", "log_every",
                    "eval_every", "eval_batches")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}")
        if self.total_tokens is not None and self.total_tokens < 1:
            raise ValueError("--total-tokens must be positive")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError("--min-lr must be between 0 and --lr")
        if self.warmup < 0:
            raise ValueError("--warmup must not be negative")

    def to_dict(self) -> dict:
        return asdict(self)
