"""Other trainers' names for `train`'s settings: the one table that a config file's error
(training/config_file.py), docs/TRAIN.md's table (`markdown`, checked by a test) and the
comments of configs/ (`comment_lines`) are made from.

Such a name is refused, never taken as ours: the error names each one with longpack's name, the
value in longpack's unit and any difference of meaning, all in one line, so a file written for
another trainer runs after one edit and then says what the run records. Accepting them would
give one setting two names, and some have two meanings (Hugging Face's `eval_steps` is the
steps between evaluations, a FineWeb MoE trainer's `evaluation.eval_steps` the batches one
reads), which a silent translation would have to guess between.

An entry's `theirs` is a key as a file writes it, or `section.key` where only that section
gives it this meaning (a section's own entry is looked up before the bare key's). `ours` is
train's setting, `model.FIELD` for a field of the model's config, or "" when there is none
(the note then says what is closest). `convert(value, settings)` gives our value from theirs
and the file's other settings in our names; DROP: the key says nothing train needs. An
`implied` entry is what a key means besides its own setting (OneCycleLR's `pct_start` is a
warmup, and a onecycle schedule ending at lr / 25 / 10,000): said only where the file does not
give that setting otherwise, and not at all when its convert gives SILENT (what it depends on is
not in the file)."""

import json
from collections.abc import Callable
from dataclasses import dataclass

from longpack.training import conversions as to

WHO = {
    "hf": "Hugging Face Trainer (TrainingArguments)",
    "hf-model": "transformers' model configs (GPTNeoXConfig, ...)",
    "accelerate": "Accelerate",
    "nanogpt": "nanoGPT",
    "torch": "PyTorch (AdamW, OneCycleLR, DataLoader, clip_grad_norm_)",
    "megatron": "Megatron-LM (its flags, with _)",
    "keras": "Keras (its optimizers' arguments)",
    "seeds": "the seeds' trainers (configs/ holds their runs)",
    "longpack": "longpack's own earlier name",
}


@dataclass(frozen=True)
class Name:
    theirs: str
    ours: str
    who: tuple[str, ...]
    note: str = ""
    convert: Callable | None = None  # (their value, the file's settings in our names) -> ours
    implied: bool = False  # besides the key's own setting: said where the file gives it not

    def target(self, section: str | None) -> str:
        """Where our name goes in the file: the same one of train's tables, or the top level
        (a model field: the model table)."""
        if self.ours.startswith("model.") or section is None:
            return self.ours
        return f"{section}.{self.ours}"


_N = Name
NAMES: tuple[Name, ...] = (
    # -- batch and length
    _N("per_device_train_batch_size", "batch_size", ("hf",),
       "rows per process per micro-step, as theirs"),
    _N("gradient_accumulation_steps", "grad_accum", ("hf", "nanogpt", "seeds")),
    _N("gradient_accumulation", "grad_accum", ("seeds",)),
    _N("max_seq_len", "seq", ("seeds",),
       "tokens per sample: the build's --seq, or a divisor of it that cuts each row into windows"),
    _N("seq_len", "seq", ("seeds",),
       "tokens per sample: the build's --seq, or a divisor of it that cuts each row into windows"),
    _N("max_seq_length", "seq", ("hf",),
       "tokens per sample: the build's --seq, or a divisor of it that cuts each row into windows"),
    _N("sequence_length", "seq", ("seeds",),
       "tokens per sample: the build's --seq, or a divisor of it that cuts each row into windows"),
    _N("block_size", "seq", ("nanogpt",),
       "tokens per sample: the build's --seq, or a divisor of it that cuts each row into windows"),
    _N("per_device_eval_batch_size", "", ("hf",),
       "evaluation reads eval_batches batches of batch_size rows"),
    # -- how long
    _N("max_iters", "max_steps", ("nanogpt",)),
    _N("total_steps", "max_steps", ("torch",)),
    _N("num_train_epochs", "max_epochs", ("hf",),
       "stops the run before a source is repeated past N epochs, while the run's length is "
       "max_steps or total_tokens", to.epochs),
    _N("num_train_epochs", "total_tokens", ("hf",),
       "N epochs of the file's build: its train rows x their tokens, from its manifest",
       to.epochs_tokens, implied=True),
    _N("epochs", "max_epochs", ("seeds",),
       "stops the run before a source is repeated past N epochs, while the run's length is "
       "max_steps or total_tokens", to.epochs),
    _N("epochs", "total_tokens", ("seeds",),
       "N epochs of the file's build: its train rows x their tokens, from its manifest",
       to.epochs_tokens, implied=True),
    # -- learning rate and schedule
    _N("learning_rate", "lr", ("hf", "nanogpt"), "the peak learning rate"),
    _N("max_lr", "lr", ("seeds", "torch"), "the peak learning rate"),
    _N("min_lr_ratio", "min_lr", ("seeds",),
       "a learning rate, not a ratio: min_lr_ratio x lr", to.times_lr),
    _N("warmup_steps", "warmup", ("hf", "seeds")),
    _N("warmup_iters", "warmup", ("nanogpt",)),
    _N("warmup_ratio", "warmup", ("hf",),
       "steps, not a share: warmup_ratio x the file's max_steps, or train's default",
       to.steps_of_share),
    _N("pct_start", "warmup", ("torch",),
       "steps, not a share: pct_start x the file's max_steps, or train's default",
       to.steps_of_share),
    _N("pct_start", "schedule", ("torch",), "OneCycleLR's: schedule onecycle",
       lambda _share, settings: to.onecycle(True, settings), implied=True),
    _N("pct_start", "min_lr", ("torch",), "OneCycleLR's end, lr / 25 / 10,000",
       to.onecycle_end(), implied=True),
    _N("lr_scheduler_type", "schedule", ("hf",),
       "cosine decays to min_lr, theirs to 0: min_lr 0 for that",
       to.one_of(to.SCHEDULES, "schedule")),
    _N("scheduler", "schedule", ("seeds", "torch"), "", to.one_of(to.SCHEDULES, "schedule")),
    _N("scheduler", "min_lr", ("seeds", "torch"), "OneCycleLR's end, lr / 25 / 10,000",
       to.onecycle_end_if_named, implied=True),
    _N("lr_scheduler", "schedule", ("seeds", "torch"), "", to.one_of(to.SCHEDULES, "schedule")),
    _N("lr_scheduler", "min_lr", ("seeds", "torch"), "OneCycleLR's end, lr / 25 / 10,000",
       to.onecycle_end_if_named, implied=True),
    _N("anneal_strategy", "schedule", ("torch",),
       "OneCycleLR's: schedule onecycle, which anneals by cosine", to.onecycle),
    _N("anneal_strategy", "min_lr", ("torch",), "OneCycleLR's end, lr / 25 / 10,000",
       to.onecycle_end(), implied=True),
    _N("final_div_factor", "min_lr", ("torch",),
       "a learning rate: lr / 25 / final_div_factor, OneCycleLR's end",
       to.onecycle_end(None)),
    _N("div_factor", "", ("torch",),
       "schedule onecycle rises from lr / 25, OneCycleLR's default"),
    _N("three_phase", "", ("torch",), "schedule onecycle has two phases, up and down"),
    _N("lr_decay_iters", "", ("nanogpt",), "the decay spans the run's steps, max_steps"),
    _N("decay_lr", "schedule", ("nanogpt",), "false: schedule constant",
       lambda on, _s: to.DROP if on is True else "constant"),
    # -- optimizer
    _N("optim", "optimizer", ("hf",), "", to.one_of(to.OPTIMIZERS, "optimizer")),
    _N("optimizer.type", "optimizer", ("seeds",), "", to.one_of(to.OPTIMIZERS, "optimizer")),
    _N("optimizer.name", "optimizer", ("seeds",), "", to.one_of(to.OPTIMIZERS, "optimizer")),
    _N("optimizer.momentum", "muon_momentum", ("seeds",),
       "Muon's Nesterov momentum, with optimizer muon"),
    _N("momentum", "muon_momentum", ("seeds",),
       "Muon's Nesterov momentum, with optimizer muon"),
    _N("beta1", "adam_beta1", ("nanogpt",)),
    _N("beta2", "adam_beta2", ("nanogpt",)),
    _N("betas", "adam_beta1", ("torch", "seeds"), "the first of AdamW's betas", to.betas(0)),
    _N("betas", "adam_beta2", ("torch", "seeds"), "the second of AdamW's betas", to.betas(1)),
    _N("beta_1", "adam_beta1", ("keras",)),
    _N("beta_2", "adam_beta2", ("keras",)),
    _N("eps", "adam_epsilon", ("torch",), "AdamW's epsilon"),
    _N("epsilon", "adam_epsilon", ("keras",), "AdamW's epsilon"),
    _N("adam_eps", "adam_epsilon", ("megatron",)),
    _N("max_grad_norm", "clip", ("hf",), "0 turns clipping off"),
    _N("grad_clip", "clip", ("nanogpt",), "0 turns clipping off"),
    _N("max_norm", "clip", ("torch", "seeds"), "0 turns clipping off"),
    _N("clip_grad", "clip", ("megatron",), "0 turns clipping off"),
    # -- precision and compute
    _N("bf16", "precision", ("hf",), "", to.switch("bf16")),
    _N("fp16", "precision", ("hf",), "fp16 autocast with a gradient scaler", to.switch("fp16")),
    _N("mixed_precision", "precision", ("accelerate",), "",
       to.one_of(to.PRECISION, "precision")),
    _N("dtype", "precision", ("nanogpt",), "", to.one_of(to.PRECISION, "precision")),
    _N("tf32", "", ("hf",), "TF32 matmuls are on for fp32 on GPUs"),
    _N("allow_tf32", "", ("torch",), "TF32 matmuls are on for fp32 on GPUs"),
    _N("torch_compile", "compile", ("hf",)),
    _N("compile_model", "compile", ("seeds",)),
    _N("gradient_checkpointing", "activation_checkpointing", ("hf",)),
    _N("use_gradient_checkpointing", "activation_checkpointing", ("seeds",)),
    _N("device", "", ("seeds", "nanogpt"),
       "a run uses the GPU its process is given by torchrun or CUDA_VISIBLE_DEVICES, else the CPU"),
    _N("backend", "", ("nanogpt",), "torchrun's processes use NCCL on GPUs, gloo on CPUs"),
    _N("gpus", "", ("seeds",), "torchrun --nproc-per-node N starts one process a GPU"),
    _N("num_gpus", "", ("seeds",), "torchrun --nproc-per-node N starts one process a GPU"),
    _N("nproc_per_node", "", ("torch",), "torchrun's own flag, --nproc-per-node N"),
    # -- data and loader
    _N("dataloader_num_workers", "workers", ("hf",)),
    _N("num_workers", "workers", ("torch", "seeds")),
    _N("dataloader_prefetch_factor", "prefetch", ("hf",), "batches each worker builds ahead"),
    _N("prefetch_factor", "prefetch", ("torch",), "batches each worker builds ahead"),
    _N("pin_memory", "", ("torch",), "the workers hand batches over in shared memory"),
    _N("persistent_workers", "", ("torch",), "the workers live as long as the run"),
    _N("multiprocessing_context", "", ("torch",), "the workers are started by spawn"),
    _N("shuffle", "", ("torch",), "rows are drawn in a seeded random order, resumable"),
    _N("data_path", "shards", ("seeds",), "the folder a `pack build` or `pack import` wrote"),
    _N("dataset_name", "", ("seeds",),
       "what a build reads: `pack build --dataset fineweb`, fineweb-edu or dolma, makes the "
       "build that shards names"),
    _N("dataset_config", "", ("seeds",),
       "a hub subset is the build's: `pack build --subset sample-10BT`"),
    _N("max_examples", "", ("seeds",),
       "the build's documents: `pack build --limit-docs N` or --max-tokens"),
    _N("max_files", "", ("seeds",),
       "a build of fewer files: `pack build` given those files, or --max-tokens"),
    _N("tokenize_on_fly", "", ("seeds",),
       "`pack build` tokenizes once, before training, and train reads its tokens"),
    _N("use_streaming", "", ("seeds",),
       "a build at a URL streams its shards into --cache as they are needed"),
    _N("val_ratio", "", ("seeds",), "the build's: `pack build --val-fraction`"),
    _N("cache_size", "", ("seeds",),
       "shards are cached on disk in --cache, up to cache_limit bytes, e.g. 20gb"),
    # -- checkpoints
    _N("output_dir", "out", ("hf", "seeds")),
    _N("out_dir", "out", ("nanogpt",)),
    _N("checkpoint_dir", "out", ("seeds",), "checkpoints and metrics.jsonl go in the run's folder"),
    _N("save_steps", "save_every", ("hf", "seeds")),
    _N("save_interval", "save_every", ("seeds",)),
    _N("save_total_limit", "keep_last", ("hf", "seeds")),
    _N("save_strategy", "", ("hf",), "a checkpoint every save_every steps and one at the end"),
    _N("always_save_checkpoint", "", ("nanogpt",),
       "a checkpoint every save_every steps and one at the end"),
    _N("resume_from_checkpoint", "", ("hf",),
       "the flag --resume: auto, never, or a checkpoint"),
    _N("resume", "", ("seeds",), "the flag --resume: auto, never, or a checkpoint"),
    _N("gcs_credentials", "", ("seeds",),
       "credentials come from the environment: GOOGLE_APPLICATION_CREDENTIALS for gs://"),
    _N("gcp_project", "", ("seeds",), "the bucket's URL is enough: out or upload gs://..."),
    # -- evaluation and logging
    _N("eval_steps", "eval_every", ("hf",),
       "Hugging Face's is the steps between evaluations, the batches one reads are eval_batches"),
    _N("evaluation.eval_steps", "eval_batches", ("seeds",),
       "the batches an evaluation reads, its interval is eval_every"),
    _N("eval_interval", "eval_every", ("nanogpt", "seeds")),
    _N("eval_iters", "eval_batches", ("nanogpt",)),
    _N("evaluation.enabled", "", ("seeds",),
       "evaluation runs every eval_every steps and at the end, on the build's val split"),
    _N("eval_strategy", "", ("hf",),
       "evaluation runs every eval_every steps and at the end, on the build's val split"),
    _N("evaluation_strategy", "", ("hf",),
       "evaluation runs every eval_every steps and at the end, on the build's val split"),
    _N("eval_only", "", ("nanogpt",), "`zoo eval RUN` evaluates a checkpoint"),
    _N("logging_steps", "log_every", ("hf",), "metrics.jsonl gets every step"),
    _N("log_interval", "log_every", ("nanogpt", "seeds"), "metrics.jsonl gets every step"),
    _N("logging_strategy", "", ("hf",), "a console line every log_every steps"),
    _N("wandb", "report_to", ("seeds",), "", to.reports_with("wandb")),
    _N("use_wandb", "report_to", ("seeds",), "", to.reports_with("wandb")),
    _N("wandb_log", "report_to", ("nanogpt",), "", to.reports_with("wandb")),
    _N("wandb.enabled", "report_to", ("seeds",), "", to.reports_with("wandb")),
    _N("wandb.project", "wandb_project", ("seeds",)),
    _N("wandb.run_name", "wandb_run_name", ("seeds",)),
    _N("wandb.name", "wandb_run_name", ("seeds",)),
    _N("wandb.entity", "wandb_entity", ("seeds",)),
    _N("wandb.group", "wandb_group", ("seeds",)),
    _N("wandb.tags", "wandb_tags", ("seeds",)),
    _N("wandb.mode", "", ("seeds",),
       "the environment's WANDB_MODE: offline keeps the records locally"),
    _N("wandb.api_key", "", ("seeds",),
       "credentials come from `wandb login` or the environment's WANDB_API_KEY"),
    _N("wandb.notes", "", ("seeds",), "a run's notes are written on its W&B page"),
    _N("wandb.log_model", "", ("seeds",),
       "checkpoints stay in out, `zoo export` makes a model folder of one"),
    _N("run_name", "wandb_run_name", ("hf",), "the W&B run's name, the run's folder is out"),
    _N("log", "report_to", ("longpack",), "renamed: torchrun reads --log as its --log-dir"),
    # -- the model's config (a [model] table, or model: in YAML, with its name)
    _N("model_dim", "model.d_model", ("seeds",)),
    _N("hidden_size", "model.d_model", ("hf-model",)),
    _N("n_embd", "model.d_model", ("nanogpt",)),
    _N("num_layers", "model.n_layers", ("seeds",)),
    _N("num_hidden_layers", "model.n_layers", ("hf-model",)),
    _N("n_layer", "model.n_layers", ("nanogpt",)),
    _N("num_attention_heads", "model.n_heads", ("hf-model",)),
    _N("n_head", "model.n_heads", ("nanogpt",)),
    _N("num_key_value_heads", "model.n_kv_heads", ("hf-model",)),
    _N("intermediate_size", "model.d_ff", ("hf-model",),
       "the MLP's width, an MoE's experts' is d_expert"),
    _N("max_position_embeddings", "model.max_seq", ("hf-model",),
       "the context the model is meant for"),
    _N("rotary_emb_base", "model.rotary_base", ("hf-model",)),
    _N("rope_theta", "model.rotary_base", ("hf-model",)),
    _N("layer_norm_eps", "model.norm_eps", ("hf-model",)),
    _N("rms_norm_eps", "model.norm_eps", ("hf-model",)),
    # in a model's table eps is its norms' (the bare eps and epsilon are AdamW's)
    _N("model.eps", "model.norm_eps", ("seeds",), "the norms' epsilon"),
    _N("model.epsilon", "model.norm_eps", ("seeds",), "the norms' epsilon"),
    _N("initializer_range", "model.init_std", ("hf-model",)),
    _N("num_local_experts", "model.n_experts", ("hf-model",)),
    _N("num_experts", "model.n_experts", ("hf-model",)),
    _N("num_experts_per_tok", "model.top_k", ("hf-model",)),
    _N("moe_top_k", "model.top_k", ("seeds",)),
    _N("moe_intermediate_size", "model.d_expert", ("hf-model",)),
    _N("mod_capacity_factor", "model.mod_capacity", ("seeds",),
       "the share of each document's tokens that goes through a depth-routed block, every "
       "second block is one"),
    _N("num_eigenstates", "model.num_frequencies", ("seeds",),
       "the closest: resonance's damped sinusoids per channel"),
    _N("chunk_size", "", ("seeds",), "the kernel of a resonance layer spans the whole row"),
    _N("use_parallel_residual", "", ("hf-model",), "gpt-neox's residual is parallel"),
    _N("hidden_act", "", ("hf-model",), "gpt-neox's MLP is GELU, moe's experts SwiGLU"),
    _N("tie_word_embeddings", "", ("hf-model",),
       "GPT-NeoX's and MoE's heads are untied, resonance's and Mamba's follow "
       "model.tie_embeddings: resonance's false, Mamba's true unless given"),
    _N("attention_dropout", "", ("hf-model",), "no dropout"),
    _N("hidden_dropout", "", ("hf-model",), "no dropout"),
    _N("dropout", "", ("nanogpt",), "no dropout"),
    _N("bias", "", ("nanogpt",), "gpt-neox's linear layers have biases, moe's none"),
    _N("use_cache", "", ("hf-model",), "`zoo generate` keeps its own cache"),
    _N("vocab_size", "", ("hf-model", "nanogpt", "seeds"),
       "the model takes the vocabulary of the build's tokenizer, its manifest's"),
)


def lookup(section: str | None, key: str) -> list[Name]:
    """The entries for `key` (in `section`, None at the top level): the section's own first,
    else the key's anywhere. Most keys have one; a key that becomes two settings has two."""
    if section is not None:
        own = [n for n in NAMES if n.theirs == f"{section}.{key}"]
        if own:
            return own
    return [n for n in NAMES if n.theirs == key]


def answers() -> dict[str, str]:
    """{their name: what it is here} for names that need no section: what a Python caller's
    keyword is told (refuse_unknown), where a file gets the full translation."""
    out = {}
    for n in NAMES:
        if "." in n.theirs or n.implied:  # what a key implies is a file's, beside its others
            continue
        said_ = f"it is {n.ours}" if n.ours else "none here"
        out[n.theirs] = "; ".join(filter(None, [out.get(n.theirs), said_ + (
            f": {n.note}" if n.note else "")]))
    return out


def said(value) -> str:
    """A value as the error shows it: JSON, which YAML and (for these values) TOML also read."""
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def markdown() -> str:
    """docs/TRAIN.md's table of other trainers' names (a test keeps the two equal)."""
    whose = "; ".join(f"`{key}` {who}" for key, who in WHO.items())
    rows = [f"Whose names: {whose}.", "",
            "| their name | train's | difference | whose |", "|---|---|---|---|"]
    for n in NAMES:
        ours = (f"also `{n.ours}`" if n.implied else f"`{n.ours}`") if n.ours else "none"
        rows.append(f"| `{n.theirs}` | {ours} | {n.note} | {', '.join(n.who)} |")
    return "\n".join(rows)


def comment_lines(who: str) -> list[str]:
    """`# theirs -> ours` lines for a config file's comment: `who`'s names with an equivalent
    (not what one implies besides)."""
    return [f"#   {n.theirs} -> {n.ours}" for n in NAMES
            if who in n.who and n.ours and not n.implied]


if __name__ == "__main__":  # python -m longpack.training.names: the table for docs/TRAIN.md
    print(markdown())
