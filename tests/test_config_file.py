"""A `train --config` file (training/config_file.py): every problem at every depth in one line,
other trainers' names answered with ours from the one table (training/names.py, which
docs/TRAIN.md's table is), YAML's numbers in exponent form read as numbers (issue 54)."""

import dataclasses
import json
import re
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from longpack import SettingsError, archs
from longpack.core import install_hint
from longpack.training import config_file, names
from longpack.training.cli import train
from longpack.training.config import TrainConfig

DOCS = Path(__file__).resolve().parent.parent / "docs" / "TRAIN.md"


def error(tmp_path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    r = CliRunner().invoke(train, ["--config", str(path), "--dry-run"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: {path}: "), r.output
    return last[len(f"Error: {path}: "):]


def test_every_problem_of_a_file_is_in_one_line_at_every_depth(tmp_path):
    """Inside a section only the first unknown key was said, and a value's problem after it."""
    said = error(tmp_path, """
batch_size: 2.5
nonsense: 1
seed: 1
training:
  grad_acum: 4
  max_steps: -1
  lr: 3e-4
optim:
  learning_rate: 0.1
  grad_clip: 1.0
logging:
  seed: 2
wandb:
  project: runs
  nonsense_too: 1
model:
  name: moe-tiny
  n_expert: 4
  moe_top_k: 2
  top_k: 7.5
""")
    assert said.startswith("9 things to change: ")
    said = said[len("9 things to change: "):]
    assert said.split("; ") == [
        "batch_size = 2.5 is not a whole number",
        "unknown settings nonsense, training.grad_acum (did you mean training.grad_accum?), "
        "wandb.nonsense_too, model.n_expert (did you mean model.n_experts?)",
        f"max_steps must be in 0..{2**48} (got -1)",
        # another trainer's name for a setting the file gives: the one to remove (3e-4 a number)
        "optim.learning_rate: 0.1 -> remove (lr is given as training.lr: 0.0003)",
        "optim.grad_clip: 1.0 -> optim.clip: 1.0 (0 turns clipping off)",
        "logging.seed is set twice (also as seed)",
        'wandb.project: "runs" -> wandb_project: "runs"',
        "model.moe_top_k: 2 -> remove (model.top_k is given as model.top_k: 7.5)",
        "model.top_k: 7.5 is not a int (a whole number: no point, no exponent)"]


def test_yaml_numbers_in_exponent_form_are_numbers(tmp_path):
    """PyYAML (YAML 1.1) read `lr: 3e-4` as the text '3e-4': "not a number"."""
    path = tmp_path / "run.yaml"
    path.write_text("lr: 3e-4\nmin_lr: 1E-5\ntotal_tokens: 1e9\nwarmup: 1.0e+2\n"
                    "model: moe-tiny\nmodel_args:\n  aux_loss_coef: 1e-2\n  d_model: 6.4e1\n")
    got = config_file.read(str(path))
    assert got["lr"] == 3e-4 and got["min_lr"] == 1e-5 and got["warmup"] == 100
    assert got["total_tokens"] == 10**9 and isinstance(got["total_tokens"], int)  # whole
    assert got["model_args"] == ["aux_loss_coef=0.01", "d_model=64"]
    ctx = train.make_context("train", ["--config", str(path), "--shards", "x"])
    assert ctx.params["lr"] == 3e-4 and ctx.params["total_tokens"] == 10**9
    path.write_text("lr: '3e-4'\nmax_steps: 2.5e0\n")  # quoted stays text; 2.5 is no step count
    with pytest.raises(SettingsError) as e:
        config_file.read(str(path))
    assert str(e.value) == (f"{path}: 2 things to change: lr = '3e-4' is not a number; "
                            "max_steps = 2.5 is not a whole number")


SAMPLES = {  # a value each converter takes (the others take any)
    "lr_scheduler_type": "cosine", "scheduler": "OneCycleLR", "lr_scheduler": "cosine",
    "optim": "adamw_torch", "optimizer.type": "muon", "optimizer.name": "adamw",
    "mixed_precision": "bf16", "dtype": "bfloat16", "betas": [0.9, 0.95], "decay_lr": False,
    "epochs": 3, "num_train_epochs": 3, "pct_start": 0.1, "warmup_ratio": 0.1,
    "anneal_strategy": "cos", "final_div_factor": 10_000,
}


def one_key_file(tmp_path, theirs: str, value) -> Path:
    import yaml

    *section, key = theirs.split(".")
    data = {key: value}
    for name in reversed(section):
        data = {name: data}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("entry", names.NAMES, ids=lambda n: f"{n.theirs}-{n.ours}")
def test_each_name_of_the_table_is_answered_with_ours_never_a_near_spelling(tmp_path, entry):
    """`mixed_precision` was "did you mean mix?", `min_lr_ratio` "did you mean min_lr?" (a
    ratio, not a rate): a name of the table gets its translation, and only that."""
    path = one_key_file(tmp_path, entry.theirs, SAMPLES.get(entry.theirs, True if (
        entry.convert is not None and entry.theirs not in SAMPLES) else 1))
    with pytest.raises(SettingsError) as e:
        config_file.read(str(path))
    said = str(e.value)
    assert "did you mean" not in said and "unknown" not in said, said
    body = re.sub(r"^\d+ things to change: ", "", said.split(": ", 1)[1])
    items = [i for i in body.split("; ") if i.startswith(f"{entry.theirs}: ")]
    assert items, said
    if entry.ours and not entry.implied:  # an implied one may have nothing to say alone
        target = entry.ours if "." not in entry.theirs or entry.ours.startswith("model.") \
            else f"{entry.theirs.split('.')[0]}.{entry.ours}"
        if entry.theirs.split(".")[0] not in config_file.SECTIONS:
            target = entry.ours
        assert any(f"-> {target}" in i or "-> remove" in i for i in items), (target, items)
    elif not entry.ours:
        assert all("-> remove (" in i for i in items), items


def test_the_misleading_hints_are_translations_now(tmp_path):
    path = one_key_file(tmp_path, "mixed_precision", "bf16")
    with pytest.raises(SettingsError, match=r'mixed_precision: "bf16" -> precision: "bf16"$'):
        config_file.read(str(path))
    path.write_text("max_lr: 0.002\nmin_lr_ratio: 0.1\n")
    with pytest.raises(SettingsError, match=r"min_lr_ratio: 0.1 -> min_lr: 0.0002 \(a learning "
                                            r"rate, not a ratio: 0.1 x lr 0.002\)"):
        config_file.read(str(path))
    path.write_text("min_lr_ratio: 0.1\n")  # no lr in the file: train's default, said so
    with pytest.raises(SettingsError, match=r"min_lr: 3e-05 \(a learning rate, not a ratio: 0.1 x "
                                            r"lr 0.0003, train's default\)"):
        config_file.read(str(path))


def test_every_name_of_ours_in_the_table_is_a_setting_or_a_models_field():
    settings = {f.name for f in dataclasses.fields(TrainConfig)}
    fields = {f.name for cls, _, _ in archs.FAMILIES.values() for f in dataclasses.fields(cls)}
    for n in names.NAMES:
        assert n.ours == "" or n.ours in settings or (
            n.ours.startswith("model.") and n.ours[len("model."):] in fields), n
        assert n.theirs.replace("-", "_").split(".")[-1] not in settings, n  # theirs, not ours
        assert set(n.who) <= set(names.WHO) and n.who, n
        # the error's grammar: items split at "; ", a note closes at the line's ")"
        assert not set(";()|") & set(n.note), n
    assert len({(n.theirs, n.ours) for n in names.NAMES}) == len(names.NAMES)


def test_docs_train_md_has_the_table_of_names_as_training_names_makes_it():
    text = DOCS.read_text()
    start = "<!-- names: `python -m longpack.training.names` writes this table -->\n"
    assert start in text
    assert text.split(start, 1)[1].startswith(names.markdown() + "\n\n")


def test_a_python_callers_keyword_of_another_trainer_is_answered_with_ours():
    """The Python API refuses other trainers' names as a file does, with ours: `mixed_precision`
    was "did you mean mix?"."""
    from longpack import api

    with pytest.raises(SettingsError) as e:
        api.train(shards="x", mixed_precision="bf16", min_lr_ratio=0.1, batchsize=3)
    assert str(e.value) == (
        "train: unknown settings batchsize (did you mean batch_size?), min_lr_ratio (it is "
        "min_lr: a learning rate, not a ratio: min_lr_ratio x lr), mixed_precision (it is "
        "precision)")


def items_of(said: str) -> list[str]:
    return re.sub(r"^\d+ things to change: ", "", said).split("; ")


def test_tables_inside_tables_are_read_at_every_depth(tmp_path):
    """`training: {optimizer: {...}}` was "optimizer = {...} is not text": the keys inside a
    table of a table were never looked at."""
    said = items_of(error(tmp_path, """
training:
  max_steps: 10
  optimizer:
    type: adamw
    lr: 3e-4
    betaz: 0.9
    eps: 1e-6
    adamw:
      weight_decay: 0.05
      warmup: 2.5
"""))
    assert said == [
        'training.optimizer.type: "adamw" -> training.optimizer.optimizer: "adamw"',
        "unknown setting training.optimizer.betaz",
        "training.optimizer.eps: 1e-06 -> training.optimizer.adam_epsilon: 1e-06 (AdamW's "
        "epsilon)",
        "training.optimizer.adamw.weight_decay: 0.05 -> training.optimizer.weight_decay: 0.05 "
        "(training.optimizer.adamw is not one of train's tables, which are training, optim, "
        "optimizer, data, run, checkpoint, logging)",
        "training.optimizer.adamw.warmup: 2.5 -> training.optimizer.warmup: 2.5 "
        "(training.optimizer.adamw is not one of train's tables, which are training, optim, "
        "optimizer, data, run, checkpoint, logging)",
        "warmup = 2.5 is not a whole number"]  # a value at depth 4 is checked too
    path = tmp_path / "fixed.yaml"  # the edit made: our names, at any depth, are read
    path.write_text("training:\n  max_steps: 10\n  optimizer:\n    optimizer: adamw\n"
                    "    lr: 3e-4\n    adam_epsilon: 1e-6\n    weight_decay: 0.05\n")
    got = config_file.read(str(path))
    assert got == {"max_steps": 10, "optimizer": "adamw", "lr": 3e-4, "adam_epsilon": 1e-6,
                   "weight_decay": 0.05}
    path.write_text("run:\n  a:\n    b:\n      c:\n        seed: 1\n")  # depth 4, not ours
    with pytest.raises(SettingsError, match=r": run\.a\.b\.c\.seed: 1 -> run\.seed: 1 "):
        config_file.read(str(path))


def test_a_wandb_table_inside_logging_is_translated_key_by_key(tmp_path, monkeypatch):
    """`logging: {wandb: {...}}` was `logging.wandb: {...} -> remove (it changes nothing
    here)`, where a top-level `wandb:` was translated key by key."""
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B installed or not, this one is usable:
    monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))  # said below
    said = items_of(error(tmp_path, """
logging:
  log_every: 5
  wandb:
    enabled: true
    project: seeds
    entity: lab
    tags: [a, b]
    mode: offline
"""))
    assert said == [
        'logging.wandb.enabled: true -> logging.report_to: ["console", "jsonl", "wandb"]',
        'logging.wandb.project: "seeds" -> logging.wandb_project: "seeds"',
        'logging.wandb.entity: "lab" -> logging.wandb_entity: "lab"',
        'logging.wandb.tags: ["a", "b"] -> logging.wandb_tags: ["a", "b"]',
        'logging.wandb.mode: "offline" -> remove (the environment\'s WANDB_MODE: offline keeps '
        "the records locally)"]


def test_rules_that_tie_settings_are_in_the_one_error_named_by_the_files_keys(tmp_path):
    """`min_lr` above `lr` was a second error after the first was fixed, naming flags the file
    does not have (`--min-lr 0.002 is above --lr 0.001`)."""
    said = items_of(error(tmp_path, """
training:
  max_lr: 0.001
  min_lr: 0.002
  fsdp_replicas: 2
  weight_decay: 2000
  nonsense: 1
"""))
    assert said == [
        "training.max_lr: 0.001 -> training.lr: 0.001 (the peak learning rate)",
        "training.min_lr: 0.002 is above training.max_lr (lr): 0.001",
        "training.weight_decay: 2000.0 at a learning rate of 0.001 would shrink every weight "
        "by 100% or more a step (lr x weight decay must be below 1, and 0.1 is usual)",
        "training.fsdp_replicas is hybrid sharding: it needs fsdp",  # at its first key's place
        "unknown setting training.nonsense"]
    # a rule broken by the file with train's default: said so
    said = error(tmp_path, "lr: 1e-5\nschedule: cosine-restarts\n")
    assert items_of(said) == ["min_lr: 3e-05 (train's default) is above lr: 1e-05",
                              "schedule cosine-restarts takes restart_every STEPS (and only it "
                              "does)"]
    # a value with a problem of its own is held to no rule; nor is a file's other setting
    said = error(tmp_path, "lr: -1\nmin_lr: 0.5\n")
    assert said == "lr must be positive and finite (got -1.0)"


def test_a_rule_a_flag_takes_part_in_is_the_flags_as_without_a_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0.001\nmin_lr: 0.002\n")
    r = CliRunner().invoke(train, ["--config", str(path), "--shards", "x", "--lr", "0.0015",
                                   "--dry-run"])
    assert r.exit_code == 1 and r.output == "Error: --min-lr 0.002 is above --lr 0.0015\n"
    ctx = train.make_context("train", ["--config", str(path), "--shards", "x", "--lr", "0.01"])
    assert ctx.params["min_lr"] == 0.002 and ctx.params["lr"] == 0.01  # the flag fixes it
    r = CliRunner().invoke(train, ["--shards", "x", "--min-lr", "0.002", "--lr", "0.001"])
    assert r.output == "Error: --min-lr 0.002 is above --lr 0.001\n"  # flags as they were


def test_a_report_backend_this_machine_lacks_is_an_item_of_the_one_error(tmp_path, monkeypatch):
    """`wandb: true` without the wandb package was accepted by the file's error and refused
    by the next run, a second error."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed: its import fails
    said = items_of(error(tmp_path, "wandb: true\nmax_iters: 10\n"))
    hint = install_hint("wandb")
    assert said == ['wandb: true -> report_to: ["console", "jsonl", "wandb"]',
                    f"wandb (report_to) asks for wandb, which needs the wandb package: {hint}",
                    "max_iters: 10 -> max_steps: 10"]
    said = error(tmp_path, "logging:\n  report_to: [console, wandb]\n")
    assert said == f"logging.report_to asks for wandb, which needs the wandb package: {hint}"
    path = tmp_path / "run.yaml"  # the command line's --report-to wins: nothing to say
    ctx = train.make_context("train", ["--config", str(path), "--shards", "x",
                                       "--report-to", "console"])
    assert ctx.params["report_to"] == "console"
    fake = types.ModuleType("wandb")  # installed, not logged in
    fake.login = lambda prompt, verify: False
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert error(tmp_path, "report_to: wandb\n") == (
        "report_to asks for wandb, which needs a W&B login this machine does not have: run "
        "`wandb login` or set WANDB_API_KEY (or WANDB_MODE=offline to keep the records "
        "locally)")


def test_onecycle_lr_keys_become_the_onecycle_schedule_with_its_values(tmp_path):
    """Seed 004's OneCycleLR(max_lr, total_steps, pct_start=0.1, anneal_strategy='cos'):
    `pct_start` asked for a second run (`give warmup in steps`), `anneal_strategy` was
    removed without saying that the schedule is onecycle."""
    said = items_of(error(tmp_path, "max_lr: 3e-4\npct_start: 0.1\nanneal_strategy: cos\n"))
    assert said == [
        "max_lr: 0.0003 -> lr: 0.0003 (the peak learning rate)",
        "pct_start: 0.1 -> warmup: 10 (steps, not a share: 0.1 x max_steps 100, train's "
        "default)",
        "pct_start: 0.1 -> min_lr: 1.2e-09 (OneCycleLR's end: lr 0.0003 / 25 / "
        "final_div_factor 10,000)",
        'anneal_strategy: "cos" -> schedule: "onecycle" (torch\'s OneCycleLR: from lr / 25 up '
        "to lr over the warmup, then down to min_lr, both by cosine)"]
    said = items_of(error(tmp_path, "training:\n  total_steps: 300\n  pct_start: 0.1\n"
                                    "  min_lr: 0\n  schedule: onecycle\n"))
    assert said == ["training.total_steps: 300 -> training.max_steps: 300",
                    "training.pct_start: 0.1 -> training.warmup: 30 (steps, not a share: 0.1 x "
                    "max_steps 300)"]  # the schedule and min_lr given are the file's
    said = items_of(error(tmp_path, "total_tokens: 1e9\nseq: 2048\nbatch_size: 4\n"
                                    "gradient_accumulation_steps: 8\nwarmup_ratio: 0.02\n"
                                    "scheduler: cosine\n"))
    assert said == ["gradient_accumulation_steps: 8 -> grad_accum: 8",
                    "warmup_ratio: 0.02 -> warmup: 305 (steps, not a share: 0.02 x 15,267 "
                    "steps, total_tokens 1,000,000,000 over seq 2048 - 1 x batch_size 4 x "
                    "grad_accum 8 tokens a step on one process)",
                    'scheduler: "cosine" -> schedule: "cosine"']


def test_epochs_become_total_tokens_where_the_files_build_says_how_many(tmp_path, shards):
    """Seed 000's `epochs: 3` said "give total_tokens too" with no value; a run after the edit
    trained max_steps' 100 steps whatever the epochs."""
    said = items_of(error(tmp_path, "epochs: 3\n"))  # no build: the run stays max_steps long
    assert said == ["epochs: 3 -> max_epochs: 3 (stops the run before a source is repeated "
                    "past 3 epochs, but the run's length stays max_steps, 100 by default: for "
                    "3 epochs give total_tokens too, 3 x the build's train rows x their "
                    "tokens, which `pack stats BUILD` prints)"]
    manifest = json.loads((shards / "manifest.json").read_text())
    rows, seq = manifest["splits"]["train"]["rows"], manifest["seq"]
    said = items_of(error(tmp_path, f"data_path: {shards}\nepochs: 3\nbatch_size: 4\n"))
    assert said == [f'data_path: "{shards}" -> shards: "{shards}" (the folder a `pack build` '
                    "or `pack import` wrote)",
                    "epochs: 3 -> max_epochs: 3 (stops the run before a source is repeated "
                    "past 3 epochs, and total_tokens makes the run 3 epochs long)",
                    f"epochs: 3 -> total_tokens: {3 * rows * (seq - 1)} (3 x the build's "
                    f"{rows:,} train rows of {seq - 1} predicted tokens, its manifest's)"]
    path = tmp_path / "fixed.yaml"  # the edit made: 3 epochs, the dry run says
    path.write_text(f"shards: {shards}\nmax_epochs: 3\ntotal_tokens: {3 * rows * (seq - 1)}\n"
                    "batch_size: 4\n")
    r = CliRunner().invoke(train, ["--config", str(path), "--dry-run", "--json",
                                   "--world-size", "1", "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["epochs"] == pytest.approx(3, abs=4 / rows)  # a last step
    said = error(tmp_path, "epochs: 3\nmax_steps: 50\n")  # the file's length is kept
    assert said == ("epochs: 3 -> max_epochs: 3 (stops the run before a source is repeated "
                    "past 3 epochs, while the run's length is the file's max_steps)")


def test_eps_in_a_model_table_is_the_norms_not_adamws(tmp_path):
    """The bare eps and epsilon are AdamW's (torch, Keras); a model's table's was taken for
    AdamW's too."""
    said = error(tmp_path, "[model]\nname = \"resonance-small\"\neps = 1e-5\n\n[optim]\neps = 1e-6\n",
                 "run.toml")
    assert "model.eps: 1e-05 -> model.norm_eps: 1e-05" in said, said
    assert "optim.eps: 1e-06 -> optim.adam_epsilon: 1e-06" in said, said
