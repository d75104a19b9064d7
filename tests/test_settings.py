"""Each setting is declared once, on its config dataclass; both command lines come from there."""

import dataclasses

import pytest
from click.testing import CliRunner

from longpack.core.errors import SettingsError
from longpack.core.settings import to_flags
from longpack.pipeline.cli import pack
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.distribute.launch import LaunchConfig
from longpack.training.cli import train
from longpack.training.config import TrainConfig


@pytest.mark.parametrize("config_classes,command", [
    ((BuildConfig, LaunchConfig), pack.commands["build"]), ((TrainConfig,), train)])
def test_every_field_is_a_flag_with_its_help_and_default(config_classes, command):
    options = {p.name: p for p in command.params}
    for f in [f for c in config_classes for f in dataclasses.fields(c)]:
        option = options.pop(f.name)  # KeyError: a field without its flag
        assert option.help and option.help == f.metadata["help"], f.name
        if f.default is not dataclasses.MISSING:
            default = ",".join(f.default) if isinstance(f.default, tuple) and f.default else (
                f.default)
            assert option.default == default or option.multiple and option.default == (), f.name
        else:
            assert option.required or f.default_factory is not dataclasses.MISSING, f.name
    # what is left are the command's own flags, not settings
    assert set(options) <= {"quiet", "list_models", "config_file", "dry_run", "resume", "log",
                            "version", "world_size", "gpu_memory", "as_json"}


def test_to_flags_gives_back_the_same_settings_through_the_command_line(tmp_path):
    """What a launcher (Slurm's batch script) writes must parse back to the very same build."""
    cfg = BuildConfig(out=str(tmp_path / "out"), dataset="jsonl", inputs=("a b.jsonl", "c"),
                      seq=4096, val_fraction=0.015625, bos=True, compression="zstd:7",
                      last_row="drop", packing="concat", tasks=3, max_tokens=None)
    command = pack.commands["build"]
    ctx = command.make_context("build", to_flags(cfg), resilient_parsing=True)
    parsed = {f.name: ctx.params[f.name] for f in dataclasses.fields(BuildConfig)}
    assert BuildConfig(**parsed) == cfg
    assert "--task-index" not in to_flags(cfg, skip=("task_index",))


@pytest.mark.parametrize("flags,message", [
    (["--seq", "1"], "--seq must be at least 2"),
    (["--workers", "0"], f"--workers must be in 1..{2**16}"),
    (["--compression", "zstd:99"], "--compression zstd:99: use zstd, zstd:LEVEL"),
])
def test_a_python_caller_and_the_command_line_get_the_same_one_line_error(tmp_path, flags,
                                                                           message):
    settings = {"out": str(tmp_path / "out"), flags[0][2:].replace("-", "_"): flags[1]}
    for key in ("seq", "workers"):
        if key in settings:
            settings[key] = int(settings[key])
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        BuildConfig(**settings)
    r = CliRunner().invoke(pack, ["build", "--out", str(tmp_path / "out"), *flags])
    assert r.exit_code == 1 and r.output.startswith("Error: ") and message in r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_is_refused_before_anything_is_read(tmp_path):
    (tmp_path / "taken").write_text("a user's file")
    with pytest.raises(SettingsError, match="is a file; choose a directory"):
        BuildConfig(out=str(tmp_path / "taken"))
    assert (tmp_path / "taken").read_text() == "a user's file"


@pytest.mark.parametrize("settings,message", [
    ({"model": "no-such-model"}, "--model"),
    ({"cache_limit": "lots"}, "--cache-limit 'lots'"),
    ({"cache_limit": "0gb"}, "--cache-limit '0gb'"),
    ({"cache_limit": "1.5b"}, "--cache-limit '1.5b'"),  # streaming's reader refuses it too
    ({"cache_limit": "9" * 400 + "kb"}, "--cache-limit '999"),  # past a float: no OverflowError
    ({"report_to": "console,email"},
     "--report-to 'email': choose from console, jsonl, tensorboard, wandb"),
    ({"precision": "fp8"}, "--precision 'fp8': choose one of fp32, bf16, fp16"),
    ({"min_lr": 1.0, "lr": 0.1}, "--min-lr 1.0 is above --lr 0.1"),
    ({"lr": -1.0}, r"--lr must be positive and finite \(got -1.0\)"),
    ({"lr": 0.0}, r"--lr must be positive and finite \(got 0.0\)"),
    ({"lr": float("nan")}, r"--lr must be positive and finite \(got nan\)"),
    ({"lr": float("inf")}, r"--lr must be positive and finite \(got inf\)"),
    # a negative clip norm trained the model the wrong way (gradient ascent), silently
    ({"clip": -1.0}, r"--clip must be at least 0 and finite \(got -1.0\): 0 turns clipping off"),
    ({"clip": float("nan")}, r"--clip must be at least 0 and finite \(got nan\)"),
    ({"weight_decay": float("nan")}, r"--weight-decay must be at least 0 and finite"),
    ({"seed": 2**64}, r"--seed must be in \[0, 9223372036854775808\) \(got 18446744073709551616\): "
     "torch and numpy take seeds of 64 bits"),  # was a ValueError from torch
    ({"seed": -1}, r"--seed must be in \[0, 9223372036854775808\)"),
    ({"batch_size": 0}, r"--batch-size must be in 1..1048576 \(got 0\)"),
    ({"batch_size": 2.0}, r"--batch-size = 2.0 is not a whole number"),
    ({"compile": 1}, r"--compile = 1 is not true or false"),
    ({"muon_ns_steps": 100, "optimizer": "muon"}, r"--muon-ns-steps must be in 1..99"),
    # past a float: was an OverflowError from float()
    ({"lr": 10**400}, r"--lr = 1.000e\+400 is past the largest number a float holds"),
    # each within its bound, together past the rows the row order counts in int64
    ({"max_steps": 2**40, "batch_size": 1024},
     r"1,099,511,627,776 steps \(--max-steps, or --total-tokens over a step's tokens\) x "
     r"--batch-size 1,024 x --grad-accum 1 is 1,125,899,906,842,624 rows a process, past the "
     r"4,398,046,511,104 \(2\*\*42\)"),
])
def test_train_settings_are_validated_in_the_dataclass(settings, message):
    with pytest.raises(SettingsError, match=message):
        TrainConfig(shards="anywhere", **settings)


def test_train_accepts_the_cache_limits_streaming_reads():
    for size in ("100gb", "20GB", "1.5tb", "500", "500b", "10 mb"):
        assert TrainConfig(shards="anywhere", cache_limit=size).cache_limit == size


@pytest.mark.parametrize("name, data, says", [
    ("run.toml", b"\x00\xff\xfe", "not valid TOML (not UTF-8 text: byte 1 is 0xff)"),
    ("run.toml", b"[1,2", "not valid TOML (Expected ']'"),
    ("run.yaml", b"\x00\xff\xfe", "not valid YAML (unacceptable character"),
    ("run.yaml", b"a: [1, 2\nb: }\n", "not valid YAML (while parsing a flow sequence"),
    ("run.yaml", b"- a\n- b\n", "expected a table of settings"),
])
def test_a_config_file_that_is_not_toml_or_yaml_is_one_line(tmp_path, name, data, says):
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    config = tmp_path / name
    config.write_bytes(data)
    r = CliRunner().invoke(train, ["--config", str(config)])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert lines[-1].startswith(f"Error: {config}: {says}"), lines[-1]


def test_a_config_file_with_an_unknown_or_renamed_setting_is_one_line(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('shards = "x"\nlog = "console"\nsteps = 3\n')
    r = CliRunner().invoke(train, ["--config", str(config)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert ('2 things to change: log: "console" -> report_to: "console" (renamed: torchrun reads '
            "--log as its --log-dir); unknown setting steps" in " ".join(r.output.split()))


@pytest.mark.parametrize("text, says", [
    ("max_steps = 2.5", "max_steps = 2.5 is not a whole number"),  # was 2 steps, silently
    ("batch_size = true", "batch_size = True is not a whole number"),  # was 1
    ("clip = true", "clip = True is not a number"),  # was 1.0
    ("batch_size = [1, 2]", "batch_size = [1, 2] is not a whole number"),  # was a traceback
    ("seq = {a = 1}", "seq = {'a': 1} is not a whole number"),
    ("compile = 1", "compile = 1 is not true or false"),
    ("lr = " + "9" * 400, "lr = 1.000e+400 is past the largest number a float holds (1.8e+308)"),
    ("max_steps = 1" + "0" * 30, f"max_steps must be in 0..{2**48} (got 1{'0' * 30})"),
    # was an OverflowError from numpy's int64
    ('shards = ["a", 2.5]\nmax_steps = 3', None),  # text: a path may look like a number
])
def test_a_config_file_value_of_the_wrong_type_is_one_line_not_cast(tmp_path, text, says):
    config = tmp_path / "run.toml"
    config.write_text(text + "\n")
    r = CliRunner().invoke(train, ["--config", str(config), "--dry-run"])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    if says is None:  # no complaint about the values' types: the missing build is what stops it
        assert "is not" not in r.output.splitlines()[-1], r.output
        return
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == f"Error: {config}: {says}", r.output


def test_the_models_copy_of_the_checker_agrees_with_the_settings_one():
    """archs/limits.py ships inside exported model folders, where longpack is not installed, so
    it keeps its own Range and typed: held here to the same answers as longpack/core/settings.py's."""
    import math

    from longpack.archs import limits
    from longpack.core import settings

    ranges = [dict(low=1), dict(low=0, low_open=True), dict(low=0, high=1),
              dict(low=0, high=1, high_open=True), dict(low=1, high=1024)]
    values = [-1, 0, 0.5, 1, 2, 1024, 1025, math.nan, math.inf, -math.inf]
    for bounds in ranges:
        ours, theirs = settings.Range(**bounds), limits.Range(**bounds)
        assert [ours.holds(v) for v in values] == [theirs.holds(v) for v in values], bounds
    def outcome(typed, value, annotation):
        try:
            got = typed("x", value, annotation)
            return type(got), got
        except ValueError:
            return ValueError

    for annotation in (int, float, bool, int | None, float | None):
        for value in (1, 1.5, 2.0, True, None, "1", [1], 10**400):  # past a float: refused
            assert outcome(settings.typed, value, annotation) == outcome(
                limits.typed, value, annotation), (annotation, value)


def test_every_boolean_setting_can_be_turned_off_on_the_command_line(tmp_path):
    """A config file's `fsdp = true` could not be undone: the switches had no --no-X."""
    for command, classes in ((train, (TrainConfig,)),
                             (pack.commands["build"], (BuildConfig, LaunchConfig))):
        flags = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        for f in (f for c in classes for f in dataclasses.fields(c) if f.type is bool):
            flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
            assert {flag, f"--no-{flag[2:]}"} <= flags, f.name
    config = tmp_path / "run.toml"
    config.write_text('shards = "x"\nfsdp = true\nfsdp_replicas = 1\n')
    ctx = train.make_context("train", ["--config", str(config), "--no-fsdp"])
    assert ctx.params["fsdp"] is False
    ctx = train.make_context("train", ["--config", str(config)])
    assert ctx.params["fsdp"] is True


BIG = str(10**30)  # past a C long
STEPS, ROWS = 2**48, 2**20  # training/config.py's MAX_STEPS, MAX_ROWS


@pytest.mark.parametrize("flags, says", [
    (["--max-steps", BIG], f"--max-steps must be in 0..{STEPS}"),  # was an OverflowError
    (["--total-tokens", BIG], f"--total-tokens must be in 1..{STEPS}"),
    (["--warmup", BIG], f"--warmup must be in 0..{STEPS}"),
    (["--schedule", "cosine-restarts", "--restart-every", BIG],
     f"--restart-every must be in 1..{STEPS}"),
    (["--save-every", BIG], f"--save-every must be in 1..{STEPS}"),
    (["--keep-last", BIG], f"--keep-last must be in 1..{STEPS}"),
    (["--eval-every", BIG], f"--eval-every must be in 1..{STEPS}"),
    (["--log-every", BIG], f"--log-every must be in 1..{STEPS}"),
    (["--batch-size", BIG], f"--batch-size must be in 1..{ROWS}"),
    (["--grad-accum", BIG], f"--grad-accum must be in 1..{ROWS}"),
    (["--eval-batches", BIG], f"--eval-batches must be in 1..{ROWS}"),
    (["--workers", BIG], "--workers must be in 0..1024"),
    (["--prefetch", BIG], "--prefetch must be in 1..1024"),  # was an OverflowError from mmap
])
def test_a_train_count_past_any_real_run_is_one_line_naming_its_flag(tmp_path, flags, says):
    r = CliRunner().invoke(train, ["--shards", str(tmp_path), "--out", str(tmp_path / "run"),
                                   "--dry-run", *flags])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.output == f"Error: {says} (got {BIG})\n", r.output


@pytest.mark.parametrize("flags, says", [
    (["--tasks", BIG], f"--tasks must be in 1..{2**20}"),  # was an OverflowError
    (["--max-tokens", BIG], f"--max-tokens must be in 1..{2**62}"),
    (["--limit-docs", BIG], f"--limit-docs must be in 1..{2**62}"),
    (["--format", "memmap", "--shard-bytes", BIG], f"--shard-bytes must be in 1..{2**40}"),
    (["--workers", BIG], f"--workers must be in 1..{2**16}"),
])
def test_a_build_count_past_any_real_build_is_one_line_naming_its_flag(tmp_path, flags, says):
    r = CliRunner().invoke(pack, ["build", "--out", str(tmp_path / "out"), "--dataset", "jsonl",
                                  "--input", str(tmp_path / "none.jsonl"), *flags])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.output == f"Error: {says} (got {BIG})\n", r.output
    assert not (tmp_path / "out").exists()
