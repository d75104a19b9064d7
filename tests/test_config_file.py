"""A `train --config` file (training/config_file.py): every problem at every depth in one line,
other trainers' names answered with ours from the one table (training/names.py, which
docs/TRAIN.md's table is), YAML's numbers in exponent form read as numbers (issue 54)."""

import dataclasses
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from longpack import SettingsError, archs
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
    if entry.ours:
        target = entry.ours if "." not in entry.theirs or entry.ours.startswith("model.") \
            else f"{entry.theirs.split('.')[0]}.{entry.ours}"
        if entry.theirs.split(".")[0] not in config_file.SECTIONS:
            target = entry.ours
        assert any(f"-> {target}" in i or "-> remove" in i for i in items), (target, items)
    else:
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
