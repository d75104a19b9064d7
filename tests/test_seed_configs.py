"""Each seed's config written as the seed shows it (../shared/seeds/: its nested YAML with its
own names, or its flags and dicts as a file) runs through `train --config` after one edit: the
one error names every key to change, each with longpack's name and value, and the file with
those changes made (here from the error's text alone, as a user would) is accepted and planned.
The seeds' sizes give the parameter counts they state, or the dry run says why not: an MoE's
d_expert follows d_model when not given (issue 54)."""

import json
import re

import pytest
import yaml
from click.testing import CliRunner

from longpack import archs
from longpack.core.settings import read_settings_file
from longpack.training.cli import train

# The seeds' configs as their users have them. 000 and 004 show flags and a Python dict: here
# as the file a user writes from them. Values a seed leaves open are marked.
SEEDS = {
    "000": ("run.toml", """
data-path = "/path/to/train"
output-dir = "checkpoints/my_model"
model-dim = 1024
num-frequencies = 128
num-layers = 12
batch-size = 4
gradient-accumulation = 8
epochs = 3
wandb = true
val-ratio = 0.01
"""),
    "001": ("run.yaml", """
model:                      # GPTNeoXConfig(...)
  hidden_size: 2048
  num_hidden_layers: 24
  num_attention_heads: 16
  intermediate_size: 8192
  vocab_size: 50257
  max_position_embeddings: 2048
  rotary_pct: 0.25
  use_parallel_residual: true
  hidden_act: gelu
  layer_norm_eps: 1e-5
  use_cache: false
  tie_word_embeddings: false
  attention_dropout: 0.0
  hidden_dropout: 0.0
training:                   # ProductionConfig
  max_files: -1
  max_steps: 25000
  per_device_train_batch_size: 4
  gradient_accumulation_steps: 4
  save_steps: 1250
  logging_steps: 250
  warmup_steps: 500
  learning_rate: 2e-4
  weight_decay: 0.1
  dataloader_num_workers: 4
  compile_model: true
  mixed_precision: bf16
  max_grad_norm: 1.0        # the value is left open
  output_dir: ./checkpoints
"""),
    "002": ("run.yaml", """
training:
  total_tokens: 10_000_000_000
  batch_size: 1
  gradient_accumulation_steps: 8
  checkpoint_dir: "./checkpoints_production"
  save_interval: 1000
  save_total_limit: 3
  max_lr: 0.001
  min_lr_ratio: 0.1
  warmup_steps: 1000
model:
  d_model: 768
  n_layers: 12
  n_experts: 8
data:
  dataset_name: "HuggingFaceFW/fineweb"
  dataset_config: "sample-10BT"
  max_examples: null
  tokenize_on_fly: false
  use_streaming: false
  num_workers: 4
  max_seq_len: 512
wandb:
  enabled: true
  project: "moe-production"
  run_name: "moe-500m-10b-tokens"
  entity: "your-wandb-username"
evaluation:
  enabled: true
  eval_steps: 100
  eval_interval: 1000       # the interval's value is left open
mixed_precision:
  bf16: true
"""),
    "003": ("run.yaml", """
model:
  d_model: 2048
  n_layers: 32
  n_experts: 16
  moe_top_k: 2
  mod_capacity_factor: 0.75
  n_pred_tokens: 4
training:
  total_tokens: 100_000_000_000
  batch_size: 1
  gradient_accumulation_steps: 8
  max_lr: 0.001
  min_lr: 1e-4
  warmup_steps: 2000
  checkpoint_dir: ./checkpoints
  log_interval: 10
  eval_interval: 1000
  save_interval: 5000
  use_wandb: true
optimizer:
  type: "muon"
  momentum: 0.95
  weight_decay: 0.01
data:
  seq_len: 2048
"""),
    "004": ("run.yaml", """
d_model: 1024
n_layers: 8
num_eigenstates: 128
batch_size: 4
max_seq_len: 32768
chunk_size: 256
use_gradient_checkpointing: true
gradient_accumulation: 4
num_workers: 4
pin_memory: true
persistent_workers: true
prefetch_factor: 4
multiprocessing_context: spawn
max_lr: 3e-4                # the value is left open
pct_start: 0.1
anneal_strategy: cos
max_norm: 1.0
fp16: true
allow_tf32: true
save_steps: 100             # the value is left open
checkpoint_dir: ./checkpoints
"""),
}
# What each seed's file already says in longpack's names: every other key is in the error.
OURS = {
    "000": {"batch-size"},
    "001": {"model.rotary_pct", "training.max_steps", "training.weight_decay"},
    "002": {"training.total_tokens", "training.batch_size", "model.d_model", "model.n_layers",
            "model.n_experts"},
    "003": {"model.d_model", "model.n_layers", "model.n_experts", "model.n_pred_tokens",
            "training.total_tokens", "training.batch_size", "training.min_lr",
            "optimizer.weight_decay"},
    "004": {"batch_size"},
}
# Each seed's model: the family, its parameters as the seed states them, and whether longpack's
# are within 10% of them (else the dry run says where they are: embedding, head, each layer,
# and the widths it chose).
SIZES = {"000": ("resonance", 200e6, False), "001": ("gpt-neox", 1.2e9, False),
         "002": ("moe", 500e6, False), "003": ("moe", 5e9, True),
         "004": ("resonance", 123e6, False)}


def leaves(data: dict, prefix: str = "") -> list[str]:
    """Every key path of a file's settings: `training.max_lr`."""
    out = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        out += leaves(value, path + ".") if isinstance(value, dict) else [path]
    return out


def items(error: str) -> list[str]:
    """The error's items: `FILE: N things to change: A; B; ...`."""
    body = error.strip().splitlines()[-1].split("Error: ", 1)[1].split(": ", 1)[1]
    return re.sub(r"^\d+ things to change: ", "", body).split("; ")


def apply(data: dict, error: str) -> dict:
    """The edit the error asks for, made from its text alone: `A: V -> B: W (why)` puts W at B
    and takes A away, `A: V -> remove (why)` takes A away (a table left empty goes too)."""
    def delete(path):
        *tables, key = path.split(".")
        table = data
        for name in tables:
            table = table.get(name, {})
        table.pop(key, None)
        if tables and not table:
            delete(".".join(tables))

    def put(path, value):
        *tables, key = path.split(".")
        table = data
        for name in tables:
            table = table.setdefault(name, {})
        table[key] = value

    for item in items(error):
        left, right = item.split(" -> ", 1)
        old = left.split(": ", 1)[0]
        if right.startswith("remove ("):
            delete(old)
            continue
        new, said = right.split(": ", 1)
        value, end = json.JSONDecoder().raw_decode(said)
        assert said[end:] == "" or said[end:].startswith(" ("), item
        if old != new:
            delete(old)
        put(new, value)
    return data


def dry_run(config, build, tmp_path):
    return CliRunner().invoke(train, ["--config", str(config), "--shards", str(build), "--out",
                                      str(tmp_path / "run"), "--dry-run", "--world-size", "1",
                                      "--json", "--report-to", "console,jsonl"])


@pytest.mark.parametrize("seed", [pytest.param(seed, marks=pytest.mark.slow) if seed == "003"
                                  else seed for seed in sorted(SEEDS)])  # 003: the hybrid's FLOPs
def test_a_seeds_own_config_runs_after_the_one_edit_its_error_asks_for(seed, build_32k_once,
                                                                        tmp_path):
    name, text = SEEDS[seed]
    config = tmp_path / name
    config.write_text(text)
    r = dry_run(config, build_32k_once, tmp_path)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    said = items(r.output)
    theirs = [path for path in leaves(read_settings_file(str(config))) if path not in OURS[seed]]
    for path in theirs:  # each of the seed's names, once, with what to write instead
        assert sum(item.startswith(f"{path}: ") for item in said) >= 1, (path, said)
    assert not [i for i in said if "did you mean" in i or i.startswith("unknown")], said
    for path in OURS[seed]:
        assert not any(item.startswith(f"{path}: ") for item in said), path

    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(yaml.safe_dump(apply(read_settings_file(str(config)), r.output)))
    r = dry_run(fixed, build_32k_once, tmp_path)
    assert r.exit_code == 0, (fixed.read_text(), r.output)
    plan = json.loads(r.stdout)
    family, stated, close = SIZES[seed]
    assert archs.PRESETS.get(plan["config"]["model"], plan["config"]["model"]) == family
    assert (abs(plan["params"] / stated - 1) < 0.1) is close, plan["params"]
    assert "  sizes       embedding " in r.stderr  # where the parameters are, said either way
    if family == "resonance":  # 000's "LM head with tied weights": how to have it, and its size
        assert "--model-arg tie_embeddings=true makes it the embedding's" in r.stderr


def test_the_5b_moe_seeds_sizes_give_its_5b_because_d_expert_follows_d_model():
    """Seed 003's d_model 2048, 32 layers, 16 experts planned 9.41B: d_expert stayed 2816."""
    sizes = dict(d_model=2048, n_layers=32, n_experts=16, top_k=2, mod_capacity=0.75,
                 n_pred_tokens=4)
    model = archs.build("moe", device="meta", **sizes)
    assert model.cfg.d_expert is None and model.cfg.expert_width == 1408  # 11 x 2048 / 16
    assert abs(model.num_params() / 5e9 - 1) < 0.1
    hybrid = archs.build("moe", device="meta", attention_every=4, **sizes)  # with Mamba layers
    assert abs(hybrid.num_params() / 5e9 - 1) < 0.1
    # a width given is kept; more experts are finer ones; the presets keep their own widths
    assert archs.config("moe", d_expert=2816, **sizes).expert_width == 2816
    assert archs.config("moe", d_model=1024, n_experts=8).expert_width == 1408
    assert archs.config("moe", d_model=768, n_experts=8).expert_width == 1088  # up to 64
    assert [archs.config(name).expert_width for name in archs.moe.PRESETS] == [
        archs.moe.PRESETS[name]["d_expert"] for name in archs.moe.PRESETS]


def test_the_dry_run_says_which_widths_it_chose(build_32k_once, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  name: moe\n  d_model: 768\n  n_layers: 12\n  n_experts: 8\n")
    r = dry_run(config, build_32k_once, tmp_path)
    assert r.exit_code == 0, r.output
    assert ("sizes       d_expert 1,088: not given, so 11 x d_model 768 / n_experts 8, rounded "
            "up to a multiple of 64 (give d_expert to size the experts)") in r.stderr
    config.write_text("model:\n  name: moe\n  d_model: 768\n  n_layers: 12\n  d_expert: 1856\n")
    r = dry_run(config, build_32k_once, tmp_path)
    assert r.exit_code == 0 and "not given" not in r.stderr, r.output
    plan = json.loads(r.stdout)
    parts = plan["param_parts"]
    assert len(parts["layers"]) == 12 and len(set(parts["layers"])) == 1
    assert parts["embedding"] == parts["head"] == 50257 * 768
    assert parts["embedding"] + parts["head"] + sum(parts["layers"]) + parts["rest"] == \
        plan["params"]
