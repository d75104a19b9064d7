"""Model settings that cannot work are refused in one line before anything is allocated: every
field of every family's config has a checked type and range (archs/limits.py), a model that
does not fit the device is refused by archs.build and by the trainer (train, --dry-run) from
its size counted on the meta device, and vocab_size is the build's, never a --model-arg."""

import math
import re
import time
from dataclasses import fields

import pytest
from click.testing import CliRunner

from longpack import archs
from longpack.training.cli import train as train_cli
from longpack.training.config import TrainConfig

FAMILIES = list(archs.FAMILIES)


def refused(name: str, **overrides) -> str:
    with pytest.raises(ValueError) as e:
        archs.config(name, **overrides)
    return str(e.value)


@pytest.mark.parametrize("name, overrides, says", [
    ("gpt-neox", {"d_model": -64}, "d_model must be at least 1 (got -64)"),
    ("gpt-neox", {"rotary_pct": 2.0}, "rotary_pct must be in [0, 1] (got 2.0)"),
    ("gpt-neox", {"norm_eps": 0.0}, "norm_eps must be in (0, 1] (got 0.0)"),
    ("gpt-neox", {"init_std": -1.0}, "init_std must be > 0 (got -1.0)"),
    ("gpt-neox", {"rotary_base": math.nan}, "rotary_base must be > 1 (got nan)"),
    ("gpt-neox", {"n_layers": 0}, "n_layers must be at least 1 (got 0)"),
    ("gpt-neox", {"vocab_size": 2**31}, "vocab_size must be in 1..2147483647 (got 2147483648)"),
    ("mamba", {"d_state": -1}, "d_state must be at least 1 (got -1)"),
    ("mamba", {"chunk": 4096}, "chunk must be in 1..1024 (got 4096): the scan's"),
    ("mamba", {"dt_min": 0.0}, "dt_min must be > 0 (got 0.0)"),
    ("mamba", {"dt_min": 0.5, "dt_max": 0.1}, "dt_min 0.5 is above dt_max 0.1"),
    ("mamba", {"conv_width": 0}, "conv_width must be at least 1 (got 0)"),
    ("resonance", {"d_ff": 0}, "d_ff must be at least 1 or None (got 0)"),
    ("resonance", {"short_conv": 0}, "short_conv must be at least 1 (got 0)"),
    ("resonance", {"num_frequencies": -3}, "num_frequencies must be at least 1 (got -3)"),
    ("moe", {"n_experts": 0, "top_k": 0}, "n_experts must be at least 1 (got 0)"),
    ("moe", {"aux_loss_coef": -0.1}, "aux_loss_coef must be at least 0 (got -0.1)"),
    ("moe", {"n_pred_tokens": 0}, "n_pred_tokens must be at least 1 (got 0)"),
    ("moe", {"ssm_chunk": 2048, "attention_every": 2}, "ssm_chunk must be in 1..1024"),
    ("moe", {"capacity_factor": math.inf}, "capacity_factor must be > 0 or None (got inf)"),
    ("moe", {"d_model": 12, "n_heads": 4, "n_kv_heads": 2},
     "the attention heads' width d_model / n_heads (3) must be even"),
])
def test_a_value_out_of_its_range_is_one_line_naming_field_value_and_range(name, overrides,
                                                                             says):
    assert says in refused(name, **overrides)
    with pytest.raises(ValueError, match=re.escape(says)):  # build too, before allocating
        archs.build(name, device="meta", **overrides)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_field_of_every_family_has_a_type_and_a_range(name):
    """A list is no field's type; every int field is a size or count (>= 1), every float
    field is finite: so each field is checked, whatever it is."""
    cfg = archs.config(name)
    for f in fields(cfg):
        assert f.name in refused(name, **{f.name: []})
        kinds = str(f.type)
        if "int" in kinds and f.name != "checkpointing":
            assert f"{f.name} must be" in refused(name, **{f.name: -1})
        if "float" in kinds:
            assert f"{f.name} must be" in refused(name, **{f.name: math.nan})


def test_types_follow_the_annotation_not_the_default():
    """Fields whose default is None (capacity_factor, layers, d_ff, ...) are typed too; a
    float where an int goes (1e9 from TOML) and a bool where a number goes are refused."""
    with pytest.raises(ValueError, match=r"capacity_factor: 'abc' is not a float or None"):
        archs.parse_args("moe", ["capacity_factor=abc"])
    with pytest.raises(ValueError, match=r"layers: 5 is not a str or None"):
        archs.parse_args("hybrid-tiny", ["layers=5"])
    with pytest.raises(ValueError, match=r"d_ff: 1.5 is not a int or None"):
        archs.parse_args("resonance-tiny", ["d_ff=1.5"])
    with pytest.raises(ValueError, match=r"d_model: 1000000000.0 is not a int \(a whole"):
        archs.parse_args("neox-tiny", ["d_model=1e9"])
    with pytest.raises(ValueError, match="checkpointing: 1 is not a bool"):
        archs.config("gpt-neox", checkpointing=1)
    with pytest.raises(ValueError, match="n_layers: True is not a int"):
        archs.config("gpt-neox", n_layers=True)
    assert archs.parse_args("moe-tiny", ["mod_capacity=null", "capacity_factor=2"]) == {
        "mod_capacity": None, "capacity_factor": 2.0}
    assert archs.config("gpt-neox", rotary_pct=1).rotary_pct == 1.0  # stored as the float
    assert isinstance(archs.config("gpt-neox", rotary_pct=1).rotary_pct, float)


@pytest.mark.parametrize("name", list(archs.PRESETS))
@pytest.mark.slow
def test_presets_are_valid_and_footprint_counts_what_build_makes(name):
    model = archs.build(name, device="meta")  # the 5B presets too: meta allocates nothing
    tensors = [*model.parameters(), *model.buffers()]
    assert archs.footprint(name) == {"params": model.num_params(), "bytes": sum(
        t.numel() * t.element_size() for t in tensors)}


@pytest.mark.parametrize("name, overrides", [
    ("neox-tiny", {"n_layers": 23}),
    ("mamba-tiny", {"n_layers": 17}),
    ("resonance-tiny", {"n_layers": 10, "d_ff": 96}),
    ("moe-tiny", {"n_layers": 13, "n_pred_tokens": 7, "mod_capacity": 0.5}),
    ("hybrid-tiny", {"n_layers": 14, "layers": "MAMMAMA"}),
    ("hybrid-tiny", {"n_layers": 23, "layers": None, "attention_every": 3, "mod_capacity": 0.3}),
    ("hybrid-tiny", {"n_layers": 5, "layers": None, "attention_every": 9}),
])
def test_footprint_extrapolated_along_the_layers_is_exact(name, overrides):
    model = archs.build(name, device="meta", **overrides)
    assert archs.footprint(name, **overrides)["params"] == model.num_params()
    cfg = model.cfg
    if hasattr(cfg, "uses"):  # MoE: the mixers a layer list would show, without listing
        assert [cfg.uses(m) for m in "AM"] == [m in cfg.mixers for m in "AM"]


def test_a_model_past_the_machines_memory_is_refused_at_once_before_allocating():
    start = time.perf_counter()
    with pytest.raises(archs.TooLarge, match=r"gpt-neox d_model=65536 n_layers=4096: "
                       r"74,775,827,578,880 parameters; its weights need [\d,.]+ GiB and cpu "
                       r"has [\d,.]+ GiB of memory"):
        archs.build("gpt-neox", d_model=65536, n_layers=4096)
    with pytest.raises(archs.TooLarge, match="more elements than a tensor can hold"):
        archs.build("moe", n_experts=2**24, d_expert=2**24, d_model=2**24, n_heads=2**20)
    # a depth that listing the layers would make slow: counted without listing them
    with pytest.raises(archs.TooLarge, match="parameters"):
        archs.build("moe", n_layers=10**12, attention_every=4)
    with pytest.raises(archs.TooLarge, match="parameters"):
        archs.build("moe-tiny", n_pred_tokens=10**9)
    assert time.perf_counter() - start < 2
    assert archs.build("gpt-neox", device="meta", d_model=65536, n_layers=16).num_params() > 0


def test_build_holds_the_weights_against_the_devices_memory(monkeypatch):
    weights = archs.footprint("neox-tiny")["bytes"]
    monkeypatch.setattr(archs, "device_memory", lambda device: weights - 1)
    with pytest.raises(archs.TooLarge, match=f"neox-tiny: {archs.footprint('neox-tiny')['params']:,}"
                       " parameters"):
        archs.build("neox-tiny")
    monkeypatch.setattr(archs, "device_memory", lambda device: weights)
    assert archs.build("neox-tiny").num_params() == archs.footprint("neox-tiny")["params"]


def test_python_m_archs_refuses_a_vocabulary_no_tensor_holds(capsys):
    from longpack.archs.__main__ import main

    with pytest.raises(SystemExit):
        main(["--vocab", str(10**17)])
    assert "--vocab: 100000000000000000 is not a vocabulary size (in 1..2147483647)" in \
        capsys.readouterr().err


def test_device_memory_is_the_machines():
    from longpack.archs.limits import device_memory

    ram = device_memory("cpu")
    assert ram is not None and 2**28 < ram < 2**50
    assert device_memory("meta") is None


# -- the trainer: one line, exit 1, no traceback, nothing made -----------------------------

def run_train(tmp_path, shards, *extra):
    out = tmp_path / "run"
    result = CliRunner().invoke(train_cli, [
        "--shards", str(shards), "--out", str(out), "--batch-size", "4", "--max-steps", "2",
        "--warmup", "1", "--workers", "0", "--report-to", "jsonl", *extra])
    return result, out


def one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # click's error, not an exception's trace
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("args, says", [
    (["--model-arg", "d_model=-64"], "--model-arg: d_model must be at least 1 (got -64)"),
    (["--model", "mamba-tiny", "--model-arg", "d_state=-1"],
     "--model-arg: d_state must be at least 1 (got -1)"),
    (["--model-arg", "rotary_pct=2.0"], "--model-arg: rotary_pct must be in [0, 1] (got 2.0)"),
    (["--model-arg", "vocab_size=10"],
     "--model-arg: vocab_size is not set here: the model takes the vocabulary of the build's "
     "tokenizer (its manifest's tokenizer.vocab_size)"),
    (["--model", "moe-tiny", "--model-arg", "capacity_factor=abc"],
     "--model-arg: capacity_factor: 'abc' is not a float or None"),
    (["--model", "moe-tiny", "--model-arg", "d_model=12", "--model-arg", "n_heads=4",
      "--model-arg", "n_kv_heads=2"], "must be even"),
])
def test_train_refuses_bad_model_args_in_one_line(tmp_path, args, says, dry):
    # refused with the settings, before the build is opened: it need not exist
    result, out = run_train(tmp_path, tmp_path / "no-build", *args, *(["--dry-run"] * dry))
    assert says in one_line_error(result)
    assert not out.exists()


def file_error(result) -> str:
    """A config file's problem: a usage error (exit 2), its last line."""
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result.output.strip().splitlines()[-1]


@pytest.mark.parametrize("table, says", [  # a file's problems are the file's (exit 2)
    ("d_model = 64.5", "model.d_model: 64.5 is not a int"),
    ("vocab_size = 10", "model.vocab_size: 10 -> remove (the model takes the vocabulary of the "
                        "build's tokenizer"),
    ("rotary_pct = 2.0", "model: rotary_pct must be in [0, 1] (got 2.0)"),
])
def test_a_model_table_in_a_config_file_is_refused_the_same_way(tmp_path, table, says):
    toml = tmp_path / "run.toml"
    toml.write_text(f'shards = "{tmp_path / "no-build"}"\n[model]\nname = "neox-tiny"\n{table}\n')
    result = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "r")])
    assert says in file_error(result)


def test_a_model_args_table_is_the_model_tables_fields(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(f'shards = "{tmp_path / "no-build"}"\nmodel = "neox-tiny"\n'
                    "[model_args]\nd_model = 64.5\n")
    result = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "r")])
    assert "model_args.d_model: 64.5 is not a int" in file_error(result)


@pytest.mark.parametrize("layout", [
    'model_args = ["d_model=64"]\n[model]\nname = "neox-tiny"\nn_layers = 2\n',
    '[model]\nname = "neox-tiny"\nn_layers = 2\n[model_args]\nd_model = 64\n',
])
def test_the_models_fields_set_twice_in_a_config_file_are_refused_not_replaced(tmp_path, layout):
    toml = tmp_path / "run.toml"
    toml.write_text(f'shards = "{tmp_path / "no-build"}"\n{layout}')
    result = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "r")])
    # a config file's mistake is a usage error, as each of its other mistakes
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "the model's fields are set twice" in result.output.strip().splitlines()[-1]


@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("args, says", [
    (["--model-arg", "d_model=65536", "--model-arg", "n_layers=4096"],
     r"--model neox-tiny --model-arg d_model=65536 --model-arg n_layers=4096: "
     r"70,515,187,515,392 parameters at the build's vocabulary of 50,257; training needs at "
     r"least [\d,.]+ GiB \(16 bytes a parameter .*\) and cpu has [\d,.]+ GiB of memory"),
    (["--batch-size", "1000000"],
     r"micro-batch of 1,000,000 x 64 tokens\) and cpu has [\d,.]+ GiB of memory: choose a "
     r"smaller model, --batch-size or --seq"),
    # laid out block by block, this ran for ever (and 10**6 layers for 22 s)
    (["--model-arg", "n_layers=100000000000000000000"],
     r"n_layers=100,000,000,000,000,000,000: 100,000,000,000,000,000,000 blocks, past the "
     r"100,000 the memory plan lays out"),
    # a size past int64: a TypeError with a C++ stack from torch
    (["--model-arg", "d_model=100000000000000000000"],
     r"a weight has more elements than a tensor can hold \(.*Overflow when unpacking long "
     r"long\)$"),
])
@pytest.mark.slow
def test_train_refuses_a_run_past_the_devices_memory_before_allocating(
        tmp_path, gpt2_vocab_shards_once, args, says, dry):
    start = time.perf_counter()
    result, out = run_train(tmp_path, gpt2_vocab_shards_once, *args, *(["--dry-run"] * dry))
    assert time.perf_counter() - start < 5
    assert re.search(says, one_line_error(result)), result.output
    assert not out.exists()  # a refused run leaves nothing


def test_the_trainer_counts_gradients_and_optimizer_state_not_only_weights(
        tmp_path, gpt2_vocab_shards_once, monkeypatch):
    """Room for the weights (archs.build's check) is not room to train: 16 bytes a
    parameter, the loss's logits and the blocks' inputs must fit."""
    weights = archs.footprint("neox-tiny", vocab_size=50257)["bytes"]
    monkeypatch.setattr(archs, "device_memory", lambda device: 3 * weights)
    assert archs.build("neox-tiny", vocab_size=50257) is not None
    shards = gpt2_vocab_shards_once  # read only: the runs are refused before they write
    result, out = run_train(tmp_path, shards, "--dry-run")
    assert "6,532,992 parameters at the build's vocabulary of 50,257; training needs at least " \
        in one_line_error(result)
    result, out = run_train(tmp_path, shards)
    assert "training needs at least" in one_line_error(result)
    assert not out.exists()


def test_a_run_whose_estimate_passes_the_memory_while_its_floor_fits_is_warned(
        tmp_path, gpt2_vocab_shards_once, monkeypatch):
    """Refused only past the floor (a run that fits is never refused), a run between the floor
    and the plan's estimate used to start without a word, then the kernel killed it (gpt-neox
    at batch 2 on this 23.5 GiB machine: signal 9 after 69 s)."""
    from longpack.training.fits import plan_memory

    cfg = TrainConfig(shards=str(gpt2_vocab_shards_once), model="neox-tiny", batch_size=4)
    mem = plan_memory(cfg, 50257, 64, 1)
    monkeypatch.setattr(archs, "device_memory", lambda device: (mem["floor"] + mem["total"]) // 2)
    result, out = run_train(tmp_path, gpt2_vocab_shards_once, "--dry-run")
    assert result.exit_code == 0, result.output
    assert ("train: warning: the memory plan's estimate is " in result.output
            and "the run may run out of memory (train --dry-run shows the plan" in result.output)
    monkeypatch.setattr(archs, "device_memory", lambda device: mem["total"] * 2)
    result, out = run_train(tmp_path, gpt2_vocab_shards_once, "--dry-run")
    assert result.exit_code == 0 and "warning" not in result.output, result.output
