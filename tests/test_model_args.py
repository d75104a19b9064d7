"""Every field of a model's config from `train` (--model-arg, a [model] table, the nested config
layout), saved in the checkpoint and used by resume and export; MoE with multi-token heads and
Mixture-of-Depths, and resonance, trained end to end."""

import json

import pytest
import torch
from click.testing import CliRunner

from longpack import archs
from longpack.training.checkpoints import checkpoint
from longpack.training.cli import train as train_cli
from longpack.zoo.cli import zoo


def args(shards, out, model, *extra):
    return ["--shards", str(shards), "--out", str(out), "--model", model, "--batch-size", "4",
            "--max-steps", "2", "--warmup", "1", "--workers", "0", "--report-to", "jsonl",
            *extra]


def losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_moe_with_multi_token_heads_and_mixture_of_depths_trains_and_exports(tmp_path, shards):
    run = tmp_path / "moe"
    result = CliRunner().invoke(train_cli, args(shards, run, "moe-tiny", "--model-arg",
                                                "n_pred_tokens=4", "--model-arg",
                                                "mod_capacity=0.5"))
    assert result.exit_code == 0, result.output
    assert all(torch.isfinite(torch.tensor(losses(run))))
    state, _ = checkpoint.load_latest(run)
    assert state["model_config"]["n_pred_tokens"] == 4
    assert state["model_config"]["mod_capacity"] == 0.5
    out = tmp_path / "st"
    assert CliRunner().invoke(zoo, ["export", str(run), "--to", "safetensors", "--out",
                                    str(out)]).exit_code == 0
    model = archs.load(out)
    assert model.cfg.n_pred_tokens == 4 and model.cfg.mod_capacity == 0.5
    # resuming with other model settings is refused in one line, before the data is opened
    more = CliRunner().invoke(train_cli, [*args(shards, run, "moe-tiny", "--model-arg",
                                                 "n_pred_tokens=2"), "--max-steps", "3"])
    assert more.exit_code == 1
    assert "holds the model with other settings (mod_capacity 0.5 -> None; n_pred_tokens 4 " \
           "-> 2)" in more.output


@pytest.mark.parametrize("model", ["resonance-tiny", "mamba-tiny",
                                   pytest.param("hybrid-tiny", marks=pytest.mark.slow)])
def test_the_other_families_train_end_to_end(tmp_path, shards, model):
    run = tmp_path / "res"
    result = CliRunner().invoke(train_cli, args(shards, run, model))
    assert result.exit_code == 0, result.output
    assert len(losses(run)) == 2


def test_unknown_and_mistyped_model_args_are_one_line(tmp_path, shards):
    result = CliRunner().invoke(train_cli, args(shards, tmp_path / "x", "neox-tiny",
                                                "--model-arg", "n_pred_tokens=4"))
    assert result.exit_code == 1
    assert "--model-arg: neox-tiny: unknown setting n_pred_tokens (its settings: " \
           "vocab_size, d_model, n_layers" in result.output
    result = CliRunner().invoke(train_cli, args(shards, tmp_path / "x", "neox-tiny",
                                                "--model-arg", "n_layers=two"))
    assert result.exit_code == 1 and "n_layers: 'two' is not a int" in result.output
    assert not (tmp_path / "x").exists()


def test_a_model_table_and_the_nested_layout_are_the_flags(tmp_path, shards):
    toml = tmp_path / "run.toml"
    toml.write_text(f'shards = "{shards}"\nmax_steps = 2\nwarmup = 1\nworkers = 0\n'
                    'batch_size = 4\n[model]\nname = "neox-tiny"\nn_layers = 3\n')
    result = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert checkpoint.load_latest(tmp_path / "a")[0]["model_config"]["n_layers"] == 3
    yaml = tmp_path / "run.yaml"
    yaml.write_text(f"model:\n  name: neox-tiny\n  n_layers: 3\ndata:\n  shards: {shards}\n"
                    "training:\n  max_steps: 2\n  warmup: 1\n  batch_size: 4\n  workers: 0\n")
    result = CliRunner().invoke(train_cli, ["--config", str(yaml), "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    yaml.write_text(f"data:\n  shards: {shards}\ntraining:\n  learning_rate: 0.1\n")
    result = CliRunner().invoke(train_cli, ["--config", str(yaml), "--out", str(tmp_path / "c")])
    assert result.exit_code == 2 and "training.learning_rate: 0.1 -> training.lr: 0.1" \
        in result.output


@pytest.mark.parametrize("name", ["neox-tiny", "moe-tiny"])
def test_parse_args_reads_json_values_by_the_fields_types(name):
    got = archs.parse_args(name, ["n_layers=3", "init_std=1"])
    assert got == {"n_layers": 3, "init_std": 1.0} and isinstance(got["init_std"], float)


def test_a_model_table_without_its_name_is_refused_not_the_default_model(tmp_path):
    """It trained neox-tiny with the table's fields, silently."""
    toml = tmp_path / "run.toml"
    toml.write_text('shards = "x"\n[model]\nn_layers = 2\n')
    r = CliRunner().invoke(train_cli, ["--config", str(toml), "--dry-run"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1] == (
        f"Error: {toml}: model.name: missing (a preset from `zoo list` or a family: gpt-neox, moe, "
        "resonance, mamba, or the fields alone in model_args to keep --model's model)")
