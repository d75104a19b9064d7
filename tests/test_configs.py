"""The example runs in configs/ (issues 31 and 44): each file loads and plans as its own comment
says (`train --dry-run --world-size N --json`, the model sized on the meta device, nothing
probed), the resonance sizes as their table gives them, the 5B MoE's recipe needs more than one
80 GB GPU, the YAML's table of another trainer's names gives ours, and the test config trains."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import archs
from archs.zoo.cli import zoo
from training.cli import train as train_cli
from training.config import TrainConfig

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
FILES = sorted([*CONFIGS.glob("*.toml"), *CONFIGS.glob("*.yaml")])
GIB = 2**30


@pytest.fixture(scope="module")
def build_32k(tmp_path_factory):
    """A small build of 32k-token rows (the seeds' length) in GPT-2's vocabulary (the shipped
    ranks: the files' memory lines are at a real tokenizer's), memmap."""
    from conftest import make_texts, write_jsonl
    from pipeline.build import build
    from pipeline.config import BuildConfig

    tmp = tmp_path_factory.mktemp("b32k")
    write_jsonl(tmp / "d.jsonl", [{"text": t} for t in make_texts(2000)])
    build(BuildConfig(out=str(tmp / "out"), dataset="jsonl", inputs=(str(tmp / "d.jsonl"),),
                      tokenizer="gpt2", seq=32768, val_fraction=0.2, format="memmap"),
          show_progress=False)
    return tmp / "out"


def plan(path, build, out, *flags):
    """`train --config PATH --dry-run --json` on BUILD: the plan, and what it printed."""
    r = CliRunner().invoke(train_cli, ["--config", str(path), "--shards", str(build),
                                       "--out", str(out), "--dry-run", "--json", *flags])
    assert r.exit_code == 0, r.output
    assert not Path(out).exists()  # a dry run makes nothing
    return json.loads(r.stdout), r.stderr


def per_process_gib(p):
    return p["memory_per_process"]["total"] / GIB


def test_configs_ship_the_seeds_runs():
    assert [p.name for p in FILES] == [
        "hybrid-5b-dolma.toml",      # the 5B MoE on Dolma: Mamba layers, MoD, MTP, Muon
        "moe-1b-fineweb.yaml",       # an MoE on FineWeb-Edu, as YAML
        "moe-5b-32k.toml",           # the 5B MoE's own recipe: more than one 80 GB GPU
        "neox-1.2b-32k-test.toml",   # the headline run, shrunk to a smoke test
        "neox-1.2b-32k.toml",        # the headline: GPT-NeoX 1.2B at 32k
        "neox-350m-2k-1gpu.toml",    # one GPU, its loader and precision settings spelled out
        "resonance-large-32k.toml",  # resonance at 32k, and its sizes
    ]


def stated_memory(path):
    """The `# Memory (train --dry-run --world-size N): ~G GiB` line of a file: (N, G)."""
    m = re.search(r"^# Memory \(train --dry-run --world-size (\d+)\): ~(\d+) GiB",
                  path.read_text(), re.M)
    assert m, f"{path.name}: no Memory line"
    return int(m[1]), int(m[2])


@pytest.mark.parametrize("path", [  # the hybrid's FLOPs are measured at 32k: slow on a CPU
    pytest.param(p, marks=pytest.mark.slow) if p.name.startswith("hybrid") else p
    for p in FILES], ids=lambda p: p.name)
def test_each_config_plans_as_its_comment_says(path, build_32k, tmp_path):
    world, gib = stated_memory(path)
    p, said = plan(path, build_32k, tmp_path / "r", "--world-size", str(world))
    assert p["fits"] is True and p["world_size"] == world
    assert abs(per_process_gib(p) - gib) < 1, (per_process_gib(p), gib)
    assert f"not probed (--world-size {world}" in said  # no probe step of a 5B on a CPU


SIZE_LINE = re.compile(r"^#\s+(resonance-[a-z]+)\s+[\d.]+[MB]\s+(.+?)\s+~(\d+) GiB$", re.M)


def test_the_resonance_sizes_plan_as_their_table_says(build_32k, tmp_path):
    path = CONFIGS / "resonance-large-32k.toml"
    sizes = SIZE_LINE.findall(path.read_text())
    presets = sorted(n for n, family in archs.PRESETS.items() if family == "resonance")
    assert sorted(name for name, _, _ in sizes) == [n for n in presets if n != "resonance-tiny"]
    for name, flags, gib in sizes:
        p, _ = plan(path, build_32k, tmp_path / name, "--world-size", "8",
                    *([] if flags == "(this file)" else flags.split()))
        assert p["config"]["model"] == name and p["fits"] is True
        assert abs(per_process_gib(p) - int(gib)) < 1, (name, per_process_gib(p), gib)


def test_the_5b_moe_recipe_needs_more_than_one_80gb_gpu(build_32k, tmp_path):
    path = CONFIGS / "moe-5b-32k.toml"
    assert "It needs more than one 80 GB GPU" in path.read_text()
    one, _ = plan(path, build_32k, tmp_path / "r", "--world-size", "1")
    assert one["fits"] is False and 80 < per_process_gib(one) < 90  # the comment's ~84 GiB


def test_the_yaml_names_another_trainers_settings_by_ours():
    from longpack.errors import SettingsError
    from longpack.settings import refuse_unknown

    text = (CONFIGS / "moe-1b-fineweb.yaml").read_text()
    pairs = re.findall(r"(\w+(?: / \w+)?) -> (\w+)", text)
    assert len(pairs) >= 18
    ours = [f.name for f in dataclasses.fields(TrainConfig)]
    assert [name for _, name in pairs if name not in ours] == []
    theirs = [t for names, name in pairs for t in names.split(" / ") if t != name]
    with pytest.raises(SettingsError) as e:  # each of theirs is refused, all in one line
        refuse_unknown(theirs, ours, "run.yaml")
    assert all(t in str(e.value) for t in theirs) and "\n" not in str(e.value)


@pytest.mark.slow
def test_the_test_config_trains_and_zoo_eval_gives_its_val_loss(build_32k, tmp_path):
    run = tmp_path / "r"
    r = CliRunner().invoke(train_cli, ["--config", str(CONFIGS / "neox-1.2b-32k-test.toml"),
                                       "--shards", str(build_32k), "--out", str(run),
                                       "--max-steps", "2", "--eval-every", "2", "--workers", "0"])
    assert r.exit_code == 0, r.output
    final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    got = json.loads(CliRunner().invoke(zoo, ["eval", str(run), "--shards", str(build_32k),
                                              "--batch-size", "2", "--limit", "4",
                                              "--json"]).output)
    assert got["seq"] == 2048 and got["loss"] == pytest.approx(final["val_loss"], abs=1e-5)
