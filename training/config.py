"""The trainer's settings: one frozen dataclass whose fields are also `train`'s flags
(longpack/settings.py), validated once, here."""

import math
import re
from dataclasses import asdict, dataclass, fields

from longpack import SettingsError, setting
from longpack.settings import suggest

SCHEDULES = ("cosine", "wsd", "constant", "onecycle", "cosine-restarts")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "muon")
REPORT_TO = ("console", "jsonl", "tensorboard", "wandb")
MUON_DEFAULTS = {"muon_lr": None, "muon_momentum": 0.95, "muon_ns_steps": 5}
# --cache-limit as mosaicml-streaming reads it (bytes_to_int in streaming/base/util.py): a
# number with a unit kb..yb (powers of 1024), or whole bytes with or without "b"
SIZE = re.compile(r"(?P<number>\d+(\.\d*)?|\.\d+)\s*(?P<unit>[kmgtpezy]b)|(?P<bytes>\d+)b?")


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one training run; each field is also a `train` flag."""

    shards: tuple[str, ...] = setting(
        help="Output directory of `pack build` (OUT, with train/ and val/), or its URL "
        "(s3://, gs://, ...), its shards fetched into --cache as they are needed. Repeat it "
        "to train on a mixture, each as NAME=PATH (a bare path is named by its folder).",
        multiple=True, metavar="[NAME=]PATH")
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
    muon_lr: float | None = setting(
        None, "--optimizer muon: Muon's peak learning rate (its matrices'; AdamW's parameters "
        "keep --lr), on the same schedule (scaled by --muon-lr / --lr) [--lr].")
    muon_momentum: float = setting(0.95, "--optimizer muon: Muon's momentum (Nesterov).")
    muon_ns_steps: int = setting(
        5, "--optimizer muon: Newton-Schulz iterations that orthogonalize each update.",
        metavar="N")
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
        "memory, one more forward of each block.", switch=True, show_default=False)
    workers: int = setting(
        2, "Background processes that read and assemble batches (0 = in the training "
        "process).")
    prefetch: int = setting(
        4, "Batches each --workers process builds ahead (its slots of shared memory).",
        metavar="N")
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
    wandb_project: str = setting("longpack", "--report-to wandb: the W&B project.")
    wandb_run_name: str | None = setting(
        None, "--report-to wandb: the W&B run's name [the --out folder's name].", metavar="NAME")
    wandb_entity: str | None = setting(
        None, "--report-to wandb: the W&B team or user [your default entity].", metavar="ENTITY")
    wandb_group: str | None = setting(None, "--report-to wandb: the W&B group of runs.",
                                      metavar="GROUP")
    wandb_tags: tuple[str, ...] = setting(
        (), "--report-to wandb: the W&B run's tags, comma-separated (or the flag repeated).",
        multiple=True, metavar="TAGS")

    def __post_init__(self):
        if isinstance(self.shards, str):  # one build, from Python or a config file
            object.__setattr__(self, "shards", (self.shards,))
        for name in ("shards", "mix_stages", "max_epochs"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self.mixture()  # names, shares, stages and epochs checked now, one line each
        # "console,jsonl" from the command line or a config file; a list from a config file
        for name in ("report_to", "wandb_tags"):
            value = getattr(self, name)
            items = [value] if isinstance(value, str) else value
            object.__setattr__(self, name, tuple(n.strip() for item in items
                                                 for n in str(item).split(",") if n.strip()))
        unknown = [n for n in self.report_to if n not in REPORT_TO]
        if unknown:
            raise SettingsError(f"--report-to: unknown {', '.join(unknown)}; choose from "
                                f"{', '.join(REPORT_TO)} (comma-separated)")
        positive = ("batch_size", "grad_accum", "max_steps", "save_every", "keep_last", "log_every",
                    "eval_every", "eval_batches", "prefetch", "muon_ns_steps")
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
        if not self.lr > 0:  # NaN too
            raise SettingsError(f"--lr must be positive (got {self.lr})")
        if self.lr == math.inf:
            raise SettingsError("--lr must be finite (got inf)")
        if not 0 <= self.clip < math.inf:  # a negative norm would flip every gradient
            raise SettingsError(f"--clip must be 0 (off) or a positive gradient norm (got "
                                f"{self.clip})")
        if not 0 <= self.weight_decay < math.inf:
            raise SettingsError(f"--weight-decay must be 0 or positive and finite (got "
                                f"{self.weight_decay})")
        if not 0 <= self.seed < 2**63:  # torch and numpy take seeds of 64 bits
            raise SettingsError(f"--seed must be in [0, 2**63) (got {self.seed})")
        if not 0 <= self.min_lr <= self.lr:
            raise SettingsError("--min-lr must be between 0 and --lr")
        if self.muon_lr is not None and not self.muon_lr > 0:
            raise SettingsError(f"--muon-lr must be positive (got {self.muon_lr})")
        if self.muon_lr == math.inf:
            raise SettingsError("--muon-lr must be finite (got inf)")
        peak = max(self.lr, self.muon_lr or 0)
        if peak * self.weight_decay >= 1:  # decoupled decay scales weights by 1 - lr x wd a step
            raise SettingsError(f"--weight-decay {self.weight_decay} at a learning rate of {peak} "
                                "would shrink every weight by 100% or more a step (lr x "
                                "weight decay must be below 1; 0.1 is usual)")
        if self.muon_ns_steps >= 100:  # torch.optim.Muon's bound, met at the first step
            raise SettingsError(f"--muon-ns-steps must be below 100 (got {self.muon_ns_steps}; "
                                "5 is usual)")
        if not 0 <= self.muon_momentum < 1:
            raise SettingsError(f"--muon-momentum must be in [0, 1) (got {self.muon_momentum})")
        muon = [f"--{f.replace('_', '-')}" for f, default in MUON_DEFAULTS.items()
                if getattr(self, f) != default]
        if muon and self.optimizer != "muon":
            raise SettingsError(f"{', '.join(muon)}: Muon's settings, for --optimizer muon "
                                f"(this run's optimizer is {self.optimizer})")
        if self.workers < 0:
            raise SettingsError("--workers must not be negative")
        if self.seq is not None and self.seq < 2:
            raise SettingsError("--seq must be at least 2")
        if self.warmup < 0:
            raise SettingsError("--warmup must not be negative")
        from longpack import is_url, refuse_unwritable  # light: pipeline loads on first use

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

        known = [f.name for f in fields(archs.config(self.model))]
        for pair in self.model_args:
            key = pair.partition("=")[0].strip().replace("-", "_")
            near = suggest(key, known, _MODEL_SYNONYM_OF) if key not in known else None
            if near:
                raise ValueError(f"{key!r} is not a setting of {self.model}; did you mean "
                                 f"{near}? (its settings: {', '.join(known)})")
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
        """Refuse settings that are no field of this class (a config file's keys), each with the
        nearest field when there is one (`suggest`)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(names) - known)
        if unknown:
            named = [name + (f" (did you mean {near}?)"
                             if (near := suggest(name, known, SYNONYM_OF)) else "")
                     for name in unknown]
            raise SettingsError(f"{where}: unknown settings {', '.join(named)}")


# Other trainers' names for train's settings (HF Trainer's TrainingArguments, nanoGPT's
# train.py, llm-foundry's YAML, torchtitan, Lightning), where spelling alone does not lead to
# ours; `suggest` tries this table, then difflib.
SYNONYMS = {
    "grad_accum": ("gradient_accumulation_steps", "gradient_accumulation", "accumulate_grad_batches",
                   "grad_accum_steps", "accumulation_steps"),
    "lr": ("learning_rate", "max_lr", "peak_lr", "lr_max", "base_lr"),
    "min_lr": ("min_learning_rate", "lr_min", "final_lr", "end_lr", "alpha_f"),
    "warmup": ("warmup_steps", "warmup_iters", "num_warmup_steps", "t_warmup", "warmup_ratio"),
    "max_steps": ("max_iters", "num_train_steps", "total_steps", "train_steps", "steps",
                  "max_duration", "training_steps", "num_steps", "iterations"),
    "total_tokens": ("max_tokens", "train_tokens", "num_tokens", "token_budget"),
    "batch_size": ("per_device_train_batch_size", "micro_batch_size", "train_micro_batch_size",
                   "device_train_microbatch_size", "micro_batch", "local_batch_size"),
    "schedule": ("lr_scheduler_type", "lr_scheduler", "scheduler", "lr_schedule"),
    "clip": ("max_grad_norm", "grad_clip", "gradient_clipping", "clip_grad_norm", "clip_grad"),
    "out": ("output_dir", "out_dir", "save_folder", "save_dir", "run_dir", "dump_folder",
            "checkpoint_dir", "default_root_dir"),
    "save_every": ("save_steps", "save_interval", "checkpoint_interval", "save_interval_steps",
                   "checkpoint_every"),
    "keep_last": ("save_total_limit", "save_num_checkpoints_to_keep", "keep_latest_k",
                  "keep_checkpoints"),
    "eval_every": ("eval_steps", "eval_interval", "eval_freq", "val_check_interval"),
    "eval_batches": ("eval_iters", "eval_subset_num_batches", "eval_max_steps", "limit_val_batches"),
    "log_every": ("logging_steps", "log_interval", "log_freq", "console_log_interval"),
    "workers": ("dataloader_num_workers", "num_workers"),
    "prefetch": ("prefetch_factor", "dataloader_prefetch_factor"),
    "seq": ("block_size", "max_seq_len", "seq_len", "sequence_length", "max_seq_length",
            "context_length", "seq_length", "max_length"),
    "precision": ("mixed_precision", "dtype", "bf16", "fp16", "amp"),
    "optimizer": ("optim", "optimizer_name"),
    "compile": ("torch_compile",),
    "activation_checkpointing": ("gradient_checkpointing", "activation_checkpoint"),
    "shards": ("data_dir", "data_path", "dataset", "train_data", "data_local", "dataset_path"),
    "model": ("model_name", "model_name_or_path", "model_type", "arch"),
    "report_to": ("log", "loggers", "logger", "report"),
    "weight_decay": ("wd",),
    "wandb_project": ("project",),
    "wandb_run_name": ("run_name", "wandb_name"),
    "wandb_entity": ("entity",),
    "wandb_tags": ("tags",),
    "wandb_group": ("group",),
}
SYNONYM_OF = {other: name for name, others in SYNONYMS.items() for other in others}

# The models' fields by other libraries' names (transformers' configs, nanoGPT), where the
# family has the field.
MODEL_SYNONYMS = {
    "d_model": ("hidden_size", "n_embd", "d_embed", "dim", "model_dim"),
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers", "depth"),
    "n_heads": ("num_attention_heads", "n_head", "num_heads"),
    "n_kv_heads": ("num_key_value_heads", "n_kv_head", "num_kv_heads"),
    "n_experts": ("num_experts", "num_local_experts", "moe_num_experts"),
    "top_k": ("num_experts_per_tok", "moe_top_k", "experts_per_token"),
    "max_seq": ("max_position_embeddings", "block_size", "max_seq_len", "n_positions"),
    "rotary_base": ("rope_theta", "rotary_emb_base", "rope_base"),
    "d_ff": ("intermediate_size", "ffn_hidden_size", "d_mlp"),
    "d_expert": ("moe_intermediate_size", "expert_hidden_size"),
    "n_pred_tokens": ("num_nextn_predict_layers", "mtp", "num_predict_tokens"),
    "init_std": ("initializer_range",),
    "norm_eps": ("layer_norm_eps", "rms_norm_eps", "layer_norm_epsilon"),
    "ssm_state": ("state_size", "d_state"),
}
_MODEL_SYNONYM_OF = {other: name for name, others in MODEL_SYNONYMS.items() for other in others}


