"""The trainer's settings: one frozen dataclass whose fields are also `train`'s flags, each
with its type, range and choices (longpack/core/settings.py); `broken` holds what ties them
together, which `rules` checks."""

import dataclasses
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cached_property

from longpack.core import DataError, LongpackError, SettingsError, check, flag_of, setting

SCHEDULES = ("cosine", "wsd", "constant", "onecycle", "cosine-restarts")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "muon")
REPORT_TO = ("console", "jsonl", "tensorboard", "wandb")
MUON_DEFAULTS = {"muon_lr": None, "muon_momentum": 0.95, "muon_ns_steps": 5}
# Upper bounds no real run reaches, so that a typo (--max-steps 10**30) is one line here rather
# than an OverflowError in numpy's int64 row arithmetic or a run of 4e17 days. Steps and tokens
# share one, 2**48 (2.8e14, past any training run's tokens, and steps of a millisecond each
# for thousands of years); since a step takes at least one token, the steps --total-tokens
# becomes are within --max-steps's bound too.
MAX_STEPS = 2**48
MAX_ROWS = 2**20  # a micro-batch's rows, micro-steps or val batches: far past any device's
MAX_PROCESSES = 1024  # loader processes, or batches each builds ahead (shared memory, semaphores)
# The row order counts a run's rows in int64 (training/data/mixture.py): the rows one process
# draws (steps x batch x micro-steps) times up to 2**20 processes (the dry run's --world-size
# bound) stay below 2**62, with room for the steps drawn ahead in a block.
MAX_RUN_ROWS = 2**42


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one training run; each field is also a `train` flag."""

    shards: tuple[str, ...] = setting(
        help="Output directory of `pack build` (OUT, with train/ and val/), or its URL "
        "(s3://, gs://, ...), its shards fetched into --cache as they are needed. Repeat it "
        "to train on a mixture, each as NAME=PATH (a bare path is named by its folder).",
        multiple=True, metavar="[NAME=]PATH", path=True)
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
        "(each row is cut into windows).", min=2)
    model: str = setting("neox-tiny", "archs/ preset or family name.")
    model_args: tuple[str, ...] = setting(
        (), "A field of the model's config, KEY=VALUE (repeatable), e.g. n_pred_tokens=4 or "
        "mod_capacity=0.5 (`zoo list` names the presets; an unknown key lists the fields).",
        flag="--model-arg", multiple=True, metavar="KEY=VALUE")
    init_from: str | None = setting(
        None, "Start from these weights: a longpack run or checkpoint folder, or a transformers "
        "model folder (GPTNeoXForCausalLM, Mamba2ForCausalLM, zoo export's). Weights only: the "
        "optimizer, schedule and data order start at step 0; a resume continues the run's own "
        "checkpoints and never reads it again (docs/TRAIN.md).", metavar="SOURCE",
        path=True)
    out: str = setting("runs/default", "Run directory: checkpoints, metrics.jsonl; or a bucket's "
                       "URL (s3://, gs://): the run is kept in a local folder and uploaded "
                       "there (as --upload).", path=True)
    upload: str | None = setting(None, "Also keep the run's checkpoints and metrics.jsonl at "
                                 "this URL (s3://BUCKET/RUN, gs://...), uploaded in the "
                                 "background; --resume auto finds them there on a fresh "
                                 "machine.", metavar="URL", path=True)
    staging: str | None = setting(None, "--out URL: the local folder the run is kept in while "
                                  "it is uploaded [~/.cache/longpack/staging].", metavar="DIR",
                                  path=True)
    batch_size: int = setting(
        8, "Samples per device per micro-step (the global batch is this x grad_accum x "
        "processes).", min=1, max=MAX_ROWS)
    grad_accum: int = setting(1, "Micro-steps per optimizer step.", min=1, max=MAX_ROWS)
    max_steps: int = setting(100, "Optimizer steps to train (ignored when --total-tokens is "
                             "given); 0 saves the starting weights (--init-from's) as step 0 "
                             "and trains none.", min=0, max=MAX_STEPS)
    total_tokens: int | None = setting(
        None, "Train for this many tokens: steps = ceil(total_tokens / tokens per step).", min=1,
        max=MAX_STEPS)
    lr: float = setting(3e-4, "Peak learning rate.", min=0, min_open=True)
    min_lr: float = setting(3e-5, "Learning rate at the end of the decay (at most --lr).",
                            min=0)
    warmup: int = setting(10, "Linear warmup steps.", min=0, max=MAX_STEPS)
    schedule: str = setting(
        "cosine", "cosine: warmup, cosine to min_lr; wsd: warmup, stable, last 20% linear to "
        "min_lr; constant: warmup, then lr; onecycle: from lr/25 up to lr over the warmup (30% "
        "of the steps without one), then down to min_lr, both cosine (torch's OneCycleLR); "
        "cosine-restarts: warmup, then cosine from lr to min_lr every --restart-every steps "
        "(SGDR).", choices=SCHEDULES)
    restart_every: int | None = setting(
        None, "cosine-restarts: steps of each cosine cycle after the warmup.", metavar="STEPS",
        min=1, max=MAX_STEPS)
    optimizer: str = setting(
        "adamw", "adamw, or muon (torch.optim.Muon on 2-D hidden weights, AdamW on the rest).",
        choices=OPTIMIZERS)
    weight_decay: float = setting(
        0.1, "AdamW decoupled weight decay (not on norms, biases, embeddings).", min=0)
    # named as Hugging Face Trainer names them, so its configs' keys are these settings
    adam_beta1: float = setting(0.9, "AdamW's first-moment decay (beta1).", min=0, max=1,
                                max_open=True, why="a moment that never decays never forgets")
    adam_beta2: float = setting(0.95, "AdamW's second-moment decay (beta2).", min=0, max=1,
                                max_open=True, why="a moment that never decays never forgets")
    adam_epsilon: float = setting(1e-8, "AdamW's epsilon, added to the second moment's root.",
                                  min=0, min_open=True)
    muon_lr: float | None = setting(
        None, "--optimizer muon: Muon's peak learning rate (its matrices'; AdamW's parameters "
        "keep --lr), on the same schedule (scaled by --muon-lr / --lr) [--lr].", min=0,
        min_open=True)
    muon_momentum: float = setting(0.95, "--optimizer muon: Muon's momentum (Nesterov).",
                                   min=0, max=1, max_open=True)
    muon_ns_steps: int = setting(
        5, "--optimizer muon: Newton-Schulz iterations that orthogonalize each update.",
        metavar="N", min=1, max=99, why="torch.optim.Muon's bound; 5 is usual")
    precision: str = setting(
        "fp32", "fp32; bf16 (autocast); fp16 (autocast + gradient scaler). TF32 is on for fp32 "
        "on GPUs.", choices=PRECISIONS)
    clip: float = setting(1.0, "Gradient-norm clipping (0 = off).", min=0,
                          why="0 turns clipping off; a negative norm would flip every gradient")
    max_skipped_steps: int = setting(
        3, "Stop the run after this many optimizer steps in a row whose loss or gradient norm "
        "is NaN or infinite (each such update is skipped on the device and counted).", min=1,
        max=MAX_STEPS, metavar="N")
    seed: int = setting(0, "Seed of the row order and of the model's initialization.", min=0,
                        max=2**63, max_open=True, why="torch and numpy take seeds of 64 bits")
    doc_mask: bool = setting(True, "Keep attention (or convolution) inside documents.")
    compile: bool = setting(False, "torch.compile the model (and its loss).")
    fsdp: bool = setting(
        False, "Shard parameters, gradients and optimizer state over the processes (FSDP2, "
        "each block and the root), instead of DDP's whole copy on each: for models that do "
        "not fit one GPU (docs/TRAIN.md).", switch=True, show_default=False)
    fsdp_replicas: int = setting(
        1, "--fsdp: hybrid sharding, shard within each of R groups of processes and replicate "
        "across them (R divides the processes; e.g. the nodes).", metavar="R", min=1)
    activation_checkpointing: bool = setting(
        False, "Recompute each block's activations in backward instead of keeping them: less "
        "memory, one more forward of each block.", switch=True, show_default=False)
    workers: int = setting(
        2, "Background processes that read and assemble batches (0 = in the training "
        "process).", min=0, max=MAX_PROCESSES)
    prefetch: int = setting(
        4, "Batches each --workers process builds ahead (its slots of shared memory).",
        metavar="N", min=1, max=MAX_PROCESSES)
    cache: str | None = setting(
        None, "Local directory for MDS shards, decompressed (and downloaded when --shards is "
        "a URL); default: shard-cache/ inside --out.", path=True)
    cache_limit: str = setting(
        "100gb", "Most disk the shard cache may use (e.g. 20gb); the coldest shards are evicted "
        "beyond it.")
    save_every: int = setting(50, "Steps between checkpoints (and one at the end).", min=1,
                              max=MAX_STEPS)
    keep_last: int = setting(3, "Checkpoints kept.", min=1, max=MAX_STEPS)
    eval_every: int = setting(
        50, "Steps between evaluations on the build's val split (and one at the end).", min=1,
        max=MAX_STEPS)
    eval_batches: int = setting(
        4, "Batches of --batch-size val rows per evaluation (the first rows of val, in "
        "order).", min=1, max=MAX_ROWS)
    report_to: tuple[str, ...] = setting(
        ("console", "jsonl"), "Where metrics go, comma-separated: console, jsonl (always "
        "written), tensorboard, wandb. (Not --log: torchrun reads that as an abbreviation of its "
        "own --log-dir.)", choices=REPORT_TO, comma=True)
    log_every: int = setting(10, "Steps between console lines (metrics.jsonl gets every step).",
                             min=1, max=MAX_STEPS)
    wandb_project: str = setting("longpack", "--report-to wandb: the W&B project.")
    wandb_run_name: str | None = setting(
        None, "--report-to wandb: the W&B run's name [the --out folder's name].", metavar="NAME")
    wandb_entity: str | None = setting(
        None, "--report-to wandb: the W&B team or user [your default entity].", metavar="ENTITY")
    wandb_group: str | None = setting(None, "--report-to wandb: the W&B group of runs.",
                                      metavar="GROUP")
    wandb_tags: tuple[str, ...] = setting(
        (), "--report-to wandb: the W&B run's tags, comma-separated (or the flag repeated).",
        multiple=True, metavar="TAGS", comma=True)

    def __post_init__(self):
        check(self)  # each field's type, range and choices, as declared above
        rules(self)

    def mixture(self) -> tuple[list[tuple[str, str]], dict | None, list, dict]:
        """(sources [(name, path)], --mix shares or None, --mix-stage stages, --max-epochs
        per source name), validated."""
        from longpack.pipeline import parse_mixture

        return parse_mixture(self.shards, self.mix, self.mix_stages, self.max_epochs)

    @cached_property
    def model_overrides(self) -> dict:
        """--model-arg as the model config's fields, with --activation-checkpointing
        (`model_overrides`)."""
        return model_overrides(self.model, self.model_args, self.activation_checkpointing)

    def to_dict(self) -> dict:
        """The settings as a run records them (checkpoints, W&B): local --shards, --cache and
        --init-from made absolute, so that `zoo export` finds the build from any folder and a
        resume knows where the run began."""
        import os

        from longpack.core import is_url
        from longpack.pipeline import source_name

        def absolute(path: str) -> str:
            return path if is_url(path) else os.path.abspath(path)

        shards = []
        for name, path in self.mixture()[0]:
            path = absolute(path)
            shards.append(path if source_name(path) == name else f"{name}={path}")
        return {**asdict(self), "shards": tuple(shards),
                "cache": self.cache and absolute(self.cache),
                "init_from": self.init_from and absolute(self.init_from)}


def model_overrides(model: str, model_args, activation_checkpointing: bool) -> dict:
    """--model-arg as the model config's fields (archs.parse_args: unknown keys and types; the
    model's config checks the values), and --activation-checkpointing as every family's
    `checkpointing` field."""
    from longpack import archs

    overrides = archs.parse_args(model, list(model_args))
    if "checkpointing" in overrides:
        raise ValueError("checkpointing is the flag --activation-checkpointing "
                         "(activation_checkpointing = true in a config file)")
    return {**overrides, "checkpointing": True} if activation_checkpointing else overrides


def rules(cfg: TrainConfig) -> None:
    """What ties settings together (each one's own range and choices are declared on its
    field): the first that fails, naming the flags."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}

    def flag(name: str, bare: bool = False, fmt: str = "") -> str:
        said = flag_of(fields[name])
        return said if bare else f"{said} {format(getattr(cfg, name), fmt)}"

    for _, error in broken(cfg, flag):
        raise error


def broken(cfg, say) -> Iterator[tuple[tuple[str, ...], LongpackError]]:
    """Each rule that `cfg`'s settings break, as (the settings it ties, the error), every one
    of them: `rules` says the first, a config file all it breaks by itself
    (training/config_file.py). `say(name, bare=False, fmt="")` names a setting, with its value
    unless bare (`fmt` formats it): the flag on the command line (`--min-lr 0.002`), the key
    where a file gives it (`training.min_lr: 0.002`). `cfg` is a TrainConfig, or the file's
    values over the defaults, each checked on its own."""
    from longpack.pipeline import parse_mixture

    try:  # names, shares, stages and epochs: one line each
        parse_mixture(cfg.shards, cfg.mix, cfg.mix_stages, cfg.max_epochs)
    except LongpackError as e:
        yield ("shards", "mix", "mix_stages", "max_epochs"), e
    rows = cfg.max_steps * cfg.batch_size * cfg.grad_accum
    if cfg.total_tokens is None and rows > MAX_RUN_ROWS:
        yield ("max_steps", "total_tokens", "batch_size", "grad_accum"), SettingsError(
            f"{cfg.max_steps:,} steps ({say('max_steps', True)}, or {say('total_tokens', True)} "
            f"over a step's tokens) x {say('batch_size', fmt=',')} x "
            f"{say('grad_accum', fmt=',')} is {rows:,} rows a process, past the "
            f"{MAX_RUN_ROWS:,} (2**42) a run counts, far past any real run: lower one of them")
    if (cfg.schedule == "cosine-restarts") != (cfg.restart_every is not None):
        yield ("schedule", "restart_every"), SettingsError(
            f"{say('schedule', True)} cosine-restarts takes {say('restart_every', True)} STEPS "
            "(and only it does)")
    if cfg.fsdp_replicas > 1 and not cfg.fsdp:
        yield ("fsdp_replicas", "fsdp"), SettingsError(
            f"{say('fsdp_replicas', True)} is hybrid sharding: it needs {say('fsdp', True)}")
    if cfg.fsdp and cfg.precision == "fp16":
        yield ("fsdp", "precision"), SettingsError(
            f"{say('fsdp', True)} trains in fp32 or bf16 (bf16 parameters for compute, fp32 "
            "master weights and reductions): fp16's loss scaling over sharded gradients is not "
            f"supported, use {say('precision', True)} bf16")
    if cfg.min_lr > cfg.lr:
        yield ("min_lr", "lr"), SettingsError(f"{say('min_lr')} is above {say('lr')}")
    peak = max(cfg.lr, cfg.muon_lr or 0)
    if peak * cfg.weight_decay >= 1:  # decoupled decay scales weights by 1 - lr x wd a step
        yield ("weight_decay", "lr", "muon_lr"), SettingsError(
            f"{say('weight_decay')} at a learning rate of {peak} would shrink every weight by "
            "100% or more a step (lr x weight decay must be below 1, and 0.1 is usual)")
    muon = [say(f, True) for f, default in MUON_DEFAULTS.items() if getattr(cfg, f) != default]
    if muon and cfg.optimizer != "muon":
        yield ("optimizer", *MUON_DEFAULTS), SettingsError(
            f"{', '.join(muon)}: Muon's settings, for {say('optimizer', True)} muon (this run's "
            f"optimizer is {cfg.optimizer})")
    from longpack.core import is_url, refuse_unwritable  # light: pipeline loads on first use

    out, upload = say("out", True), say("upload", True)
    if cfg.upload is not None and is_url(cfg.out):
        yield ("upload", "out"), SettingsError(f"{upload} is for a local {out}: an {out} URL "
                                               "already uploads the run there")
    if cfg.upload is not None and not is_url(cfg.upload):
        yield ("upload",), SettingsError(f"{say('upload')}: give a bucket's URL "
                                         f"(s3://BUCKET/RUN, gs://...), a local copy is {out}'s "
                                         "job")
    if cfg.staging is not None and not is_url(cfg.out):
        yield ("staging", "out"), SettingsError(f"{say('staging', True)} is for an {out} URL "
                                                f"(s3://...): a local {out} is the run's folder "
                                                "itself")
    for name in ("out", "upload"):
        url = getattr(cfg, name)
        if url is not None and is_url(url):
            try:
                refuse_unwritable(url, "train")
            except LongpackError as e:
                yield (name,), e
    from longpack.pipeline import cache_bytes

    try:
        limit = cache_bytes(cfg.cache_limit)
    except DataError:
        limit = 0
    if limit <= 0:
        yield ("cache_limit",), SettingsError(
            f"{say('cache_limit', True)} {cfg.cache_limit!r}: give a positive size such as "
            "20gb, 500mb or a number of bytes")
    from longpack import archs  # here, not at the top: torch loads only once a run is being set up

    model = ("model", "model_args", "activation_checkpointing")
    try:
        archs.config(cfg.model)
    except KeyError as e:  # the registry's message lists the choices
        yield model, SettingsError(f"{say('model', True)}: {e.args[0]}")
        return
    try:  # a config file's [model] table is --model-arg too (training/cli.py); the model's
        # own config checks each field's type and range
        overrides = model_overrides(cfg.model, cfg.model_args, cfg.activation_checkpointing)
        if "vocab_size" in overrides:
            raise ValueError("vocab_size is not set here: the model takes the vocabulary of the "
                             "build's tokenizer (its manifest's tokenizer.vocab_size), which the "
                             "shards' token ids are numbered in")
        archs.config(cfg.model, **overrides)
    except (ValueError, TypeError) as e:  # an unknown key, a value the config refuses
        yield model, SettingsError(f"{say('model_args', True)}: {e}")
