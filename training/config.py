"""The trainer's settings: one frozen dataclass whose fields are also `train`'s flags
(pipeline/settings.py), validated once, here."""

import re
from dataclasses import asdict, dataclass, fields

from pipeline import SettingsError, setting

SCHEDULES = ("cosine", "wsd", "constant", "onecycle", "cosine-restarts")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "muon")
REPORT_TO = ("console", "jsonl", "tensorboard", "wandb")
# --cache-limit as mosaicml-streaming reads it (bytes_to_int in streaming/base/util.py): a
# number with a unit kb..yb (powers of 1024), or whole bytes with or without "b"
SIZE = re.compile(r"(?P<number>\d+(\.\d*)?|\.\d+)\s*(?P<unit>[kmgtpezy]b)|(?P<bytes>\d+)b?")


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one training run; each field is also a `train` flag."""

    shards: tuple[str, ...] = setting(
        help="Output directory of `pack build` (OUT, with train/ and val/), or its URL "
        "(s3://, gs://, ...) for MDS builds, streamed through mosaicml-streaming into "
        "--cache. Repeat it to train on a mixture, each as NAME=PATH (a bare path is named "
        "by its folder).", multiple=True, metavar="[NAME=]PATH")
    mix: str | None = setting(
        None, "Shares of a mixture's sources, NAME=WEIGHT,... (divided by their sum; an "
        "unnamed source gets 0) [each in proportion to its train rows].", metavar="SHARES")
    mix_stages: tuple[str, ...] = setting(
        (), "A new mixture from a point of the run on, START:NAME=WEIGHT,... with START a step "
        "(8000), tokens (2e9tok) or a share of the steps (90%) (repeatable).",
        flag="--mix-stage", multiple=True, metavar="START:SHARES")
    max_epochs: tuple[str, ...] = setting(
        (), "Stop the run before a source is repeated past N epochs: NAME=N, or N for every "
        "source (repeatable) [repeat without end].", multiple=True, metavar="[NAME=]N")
    seq: int | None = setting(
        None, "Tokens per training sample: the build's --seq (default), or a divisor of it "
        "(each row is cut into windows).")
    model: str = setting("neox-tiny", "archs/ preset or family name.")
    model_args: tuple[str, ...] = setting(
        (), "A field of the model's config, KEY=VALUE (repeatable), e.g. n_pred_tokens=4 or "
        "mod_capacity=0.5 (`zoo list` names the presets; an unknown key lists the fields).",
        flag="--model-arg", multiple=True, metavar="KEY=VALUE")
    out: str = setting("runs/default", "Run directory: checkpoints, metrics.jsonl; or a bucket's "
                       "URL (s3://, gs://): the run is kept in a local folder and uploaded "
                       "there (as --upload).")
    upload: str | None = setting(None, "Also keep the run's checkpoints and metrics.jsonl at "
                                 "this URL (s3://BUCKET/RUN, gs://...), uploaded in the "
                                 "background; --resume auto finds them there on a fresh "
                                 "machine.", metavar="URL")
    staging: str | None = setting(None, "--out URL: the local folder the run is kept in while "
                                  "it is uploaded [~/.cache/longpack/staging].", metavar="DIR")
    batch_size: int = setting(
        8, "Samples per device per micro-step (the global batch is this x grad_accum x "
        "processes).")
    grad_accum: int = setting(1, "Micro-steps per optimizer step.")
    max_steps: int = setting(100, "Optimizer steps to train (ignored when --total-tokens is "
                             "given).")
    total_tokens: int | None = setting(
        None, "Train for this many tokens: steps = ceil(total_tokens / tokens per step).")
    lr: float = setting(3e-4, "Peak learning rate.")
    min_lr: float = setting(3e-5, "Learning rate at the end of the decay.")
    warmup: int = setting(10, "Linear warmup steps.")
    schedule: str = setting(
        "cosine", "cosine: warmup, cosine to min_lr; wsd: warmup, stable, last 20% linear to "
        "min_lr; constant: warmup, then lr; onecycle: from lr/25 up to lr over the warmup (30% "
        "of the steps without one), then down to min_lr, both cosine (torch's OneCycleLR); "
        "cosine-restarts: warmup, then cosine from lr to min_lr every --restart-every steps "
        "(SGDR).", choices=SCHEDULES)
    restart_every: int | None = setting(
        None, "cosine-restarts: steps of each cosine cycle after the warmup.", metavar="STEPS")
    optimizer: str = setting(
        "adamw", "adamw, or muon (torch.optim.Muon on 2-D hidden weights, AdamW on the rest).",
        choices=OPTIMIZERS)
    weight_decay: float = setting(
        0.1, "AdamW decoupled weight decay (not on norms, biases, embeddings).")
    precision: str = setting(
        "fp32", "fp32; bf16 (autocast); fp16 (autocast + gradient scaler). TF32 is on for fp32 "
        "on GPUs.", choices=PRECISIONS)
    clip: float = setting(1.0, "Gradient-norm clipping (0 = off).")
    seed: int = setting(0, "Seed of the row order and of the model's initialization.")
    doc_mask: bool = setting(True, "Keep attention (or convolution) inside documents.")
    compile: bool = setting(False, "torch.compile the model (and its loss).")
    fsdp: bool = setting(
        False, "Shard parameters, gradients and optimizer state over the processes (FSDP2, "
        "each block and the root), instead of DDP's whole copy on each: for models that do "
        "not fit one GPU (docs/TRAIN.md).", switch=True, show_default=False)
    fsdp_replicas: int = setting(
        1, "--fsdp: hybrid sharding, shard within each of R groups of processes and replicate "
        "across them (R divides the processes; e.g. the nodes).", metavar="R")
    activation_checkpointing: bool = setting(
        False, "Recompute each block's activations in backward instead of keeping them: less "
        "memory, about a third more compute.", switch=True, show_default=False)
    workers: int = setting(
        2, "Background processes that read and assemble batches (0 = in the training "
        "process).")
    cache: str | None = setting(
        None, "Local directory for MDS shards, decompressed (and downloaded when --shards is "
        "a URL); default: shard-cache/ inside --out.")
    cache_limit: str = setting(
        "100gb", "Most disk the shard cache may use (e.g. 20gb); the coldest shards are evicted "
        "beyond it.")
    save_every: int = setting(50, "Steps between checkpoints (and one at the end).")
    keep_last: int = setting(3, "Checkpoints kept.")
    eval_every: int = setting(
        50, "Steps between evaluations on the build's val split (and one at the end).")
    eval_batches: int = setting(
        4, "Batches of --batch-size val rows per evaluation (the first rows of val, in "
        "order).")
    report_to: tuple[str, ...] = setting(
        ("console", "jsonl"), "Where metrics go, comma-separated: console, jsonl (always "
        "written), tensorboard, wandb. (Not --log: torchrun reads that as an abbreviation of its "
        "own --log-dir.)")
    log_every: int = setting(10, "Steps between console lines (metrics.jsonl gets every step).")

    def __post_init__(self):
        if isinstance(self.shards, str):  # one build, from Python or a config file
            object.__setattr__(self, "shards", (self.shards,))
        for name in ("shards", "mix_stages", "max_epochs"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self.mixture()  # names, shares, stages and epochs checked now, one line each
        # "console,jsonl" from the command line or a config file; a list from a config file
        names = self.report_to.split(",") if isinstance(self.report_to, str) else self.report_to
        object.__setattr__(self, "report_to", tuple(n.strip() for n in names if n.strip()))
        unknown = [n for n in self.report_to if n not in REPORT_TO]
        if unknown:
            raise SettingsError(f"--report-to: unknown {', '.join(unknown)}; choose from "
                                f"{', '.join(REPORT_TO)} (comma-separated)")
        positive = ("batch_size", "grad_accum", "max_steps", "save_every", "keep_last", "log_every",
                    "eval_every", "eval_batches")
        for name in positive:
            if getattr(self, name) < 1:
                raise SettingsError(f"--{name.replace('_', '-')} must be at least 1")
        if self.precision not in PRECISIONS:
            raise SettingsError(f"--precision must be one of {', '.join(PRECISIONS)}")
        if self.total_tokens is not None and self.total_tokens < 1:
            raise SettingsError("--total-tokens must be positive")
        if self.schedule not in SCHEDULES:
            raise SettingsError(f"--schedule must be one of {', '.join(SCHEDULES)}")
        if (self.schedule == "cosine-restarts") != (self.restart_every is not None):
            raise SettingsError("--schedule cosine-restarts takes --restart-every STEPS (and only "
                                "it does)")
        if self.restart_every is not None and self.restart_every < 1:
            raise SettingsError("--restart-every must be at least 1")
        if self.fsdp_replicas < 1:
            raise SettingsError("--fsdp-replicas must be at least 1")
        if self.fsdp_replicas > 1 and not self.fsdp:
            raise SettingsError("--fsdp-replicas is hybrid sharding: it needs --fsdp")
        if self.fsdp and self.precision == "fp16":
            raise SettingsError("--fsdp trains in fp32 or bf16 (bf16 parameters for compute, "
                                "fp32 master weights and reductions); fp16's loss scaling over "
                                "sharded gradients is not supported: use --precision bf16")
        if self.optimizer not in OPTIMIZERS:
            raise SettingsError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}")
        if not 0 <= self.min_lr <= self.lr:
            raise SettingsError("--min-lr must be between 0 and --lr")
        if self.workers < 0:
            raise SettingsError("--workers must not be negative")
        if self.seq is not None and self.seq < 2:
            raise SettingsError("--seq must be at least 2")
        if self.warmup < 0:
            raise SettingsError("--warmup must not be negative")
        from pipeline import is_url, refuse_unwritable  # light: pipeline loads on first use

        if self.upload is not None:
            if is_url(self.out):
                raise SettingsError("--upload is for a local --out; --out URL already uploads "
                                    "the run there")
            if not is_url(self.upload):
                raise SettingsError(f"--upload {self.upload}: give a bucket's URL "
                                    "(s3://BUCKET/RUN, gs://...); a local copy is --out's job")
        if self.staging is not None and not is_url(self.out):
            raise SettingsError("--staging is for an --out URL (s3://...): a local --out is "
                                "the run's folder itself")
        for url in (self.out, self.upload):
            if url is not None and is_url(url):
                refuse_unwritable(url, "train")
        size = SIZE.fullmatch(str(self.cache_limit).strip().lower())
        if not size or not float(size["number"] or size["bytes"]):
            raise SettingsError(f"--cache-limit {self.cache_limit!r}: give a positive size such "
                                "as 20gb, 500mb or a number of bytes")
        import archs  # here, not at the top: torch loads only once a run is being set up

        try:
            archs.config(self.model)
        except KeyError as e:  # the registry's message lists the choices
            raise SettingsError(f"--model: {e.args[0]}") from None
        try:  # a config file's [model] table is --model-arg too (training/cli.py)
            overrides = self.model_overrides()
            if "vocab_size" in overrides:
                raise ValueError("vocab_size is not set here: the model takes the vocabulary "
                                 "of the build's tokenizer (its manifest's tokenizer.vocab_size), "
                                 "which the shards' token ids are numbered in")
            archs.config(self.model, **overrides)
        except (ValueError, TypeError) as e:  # an unknown key, a value the config refuses
            raise SettingsError(f"--model-arg: {e}") from None

    def mixture(self) -> tuple[list[tuple[str, str]], dict | None, list, dict]:
        """(sources [(name, path)], --mix shares or None, --mix-stage stages, --max-epochs
        per source name), validated."""
        from pipeline import parse_mixture

        return parse_mixture(self.shards, self.mix, self.mix_stages, self.max_epochs)

    def model_overrides(self) -> dict:
        """--model-arg as the model config's fields (validated in __post_init__), and
        --activation-checkpointing as every family's `checkpointing` field."""
        import archs

        overrides = archs.parse_args(self.model, list(self.model_args))
        if "checkpointing" in overrides:
            raise ValueError("checkpointing is the flag --activation-checkpointing "
                             "(activation_checkpointing = true in a config file)")
        return {**overrides, "checkpointing": True} if self.activation_checkpointing \
            else overrides

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def check_names(cls, names, where: str) -> None:
        """Refuse settings that are no field of this class (a config file's keys)."""
        unknown = set(names) - {f.name for f in fields(cls)}
        if unknown:
            renamed = " (log is now report_to)" if "log" in unknown else ""
            raise SettingsError(f"{where}: unknown settings {', '.join(sorted(unknown))}{renamed}")
