"""The runs in configs/ (issues 31, 44 and 54): one for each seed's recipe (../shared/seeds/)
and the 5B MoE's own. Each file plans as its Memory line says (`train --dry-run --world-size N
[--gpu-memory G] --json`, the model sized on the meta device, nothing probed), each run of its
table as the table says (the flags, the parameters, the memory a GPU), the 5B MoE's recipe needs
more than one 80 GB GPU, the YAML's table of Hugging Face's names is training/names.py's, and
each file trains two steps at a tiny scale: its own settings on a tiny model and build."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from longpack.training import names
from longpack.training.cli import train as train_cli
from longpack.zoo.cli import zoo

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
FILES = sorted([*CONFIGS.glob("*.toml"), *CONFIGS.glob("*.yaml")])
GIB = 2**30
# The report backends' packages are the run's, not these tests': the plans report to these.
REPORTS = ("--report-to", "console,jsonl")


def plan(path, build, out, *flags):
    """`train --config PATH --dry-run --json` on BUILD: the plan, and what it printed."""
    r = CliRunner().invoke(train_cli, ["--config", str(path), "--shards", str(build),
                                       "--out", str(out), "--dry-run", "--json", *REPORTS,
                                       *flags])
    assert r.exit_code == 0, r.output
    assert not Path(out).exists()  # a dry run makes nothing
    return json.loads(r.stdout), r.stderr


def per_process_gib(p):
    return p["memory_per_process"]["total"] / GIB


def test_configs_ship_the_seeds_runs():
    assert [p.name for p in FILES] == [
        "hybrid-5b-dolma.toml",     # seed 003: the 5B MoE on Dolma, Mamba layers, MoD, MTP, Muon
        "moe-5b-32k.toml",          # the 5B MoE's own recipe: more than one 80 GB GPU
        "moe-fineweb.yaml",         # seed 002: an MoE on FineWeb, as nested YAML
        "neox-1.2b.toml",           # seed 001: GPT-NeoX 1.2B on 2 GPUs, and at 32k on 8
        "resonance-32k-1gpu.toml",  # seed 004: one GPU at 32k, the training optimizations
        "resonance-32k.toml",       # seed 000: resonance at 32k on 4 GPUs, and its sizes
    ]


MEMORY = re.compile(r"^# Memory \(train --dry-run --world-size (\d+)(?: --gpu-memory (\d+))?\): "
                    r"~(\d+) GiB", re.M)


def stated_memory(path):
    """The `# Memory (train --dry-run --world-size N [--gpu-memory G]): ~M GiB a GPU` line of a
    file: (the flags, M)."""
    m = MEMORY.search(path.read_text())
    assert m, f"{path.name}: no Memory line"
    return ["--world-size", m[1], *(["--gpu-memory", m[2]] if m[2] else [])], int(m[3])


def slow_if_hybrid(params, path=lambda p: p[0]):
    """The hybrid's FLOPs are measured (its Mamba layers run on the meta device): seconds on a
    CPU, a slow test."""
    return [pytest.param(*(p if isinstance(p, tuple) else (p,)), marks=pytest.mark.slow)
            if "hybrid" in path(p).name else p for p in params]


@pytest.mark.parametrize("path", slow_if_hybrid(FILES, lambda p: p), ids=lambda p: p.name)
def test_each_config_plans_as_its_comment_says(path, build_32k_once, tmp_path):
    flags, gib = stated_memory(path)
    p, said = plan(path, build_32k_once, tmp_path / "r", *flags)
    assert p["fits"] is True and p["world_size"] == int(flags[1])
    assert p["gpu_memory"] == int(flags[3] if len(flags) > 2 else 80) * GIB
    assert abs(per_process_gib(p) - gib) < 1, (per_process_gib(p), gib)
    assert f"not probed (--world-size {flags[1]}" in said  # no probe step of a 5B on a CPU


RUN = re.compile(r"^#   (\S+)\s+(--.+?|\(this file\))\s+([\d.]+)([MB])\s+~(\d+) GiB$", re.M)
RUNS = [(path, run) for path in FILES for run in RUN.findall(path.read_text())]


def test_the_seeds_other_runs_are_in_tables():
    assert sorted({(path.name, run[0]) for path, run in RUNS}) == [
        ("hybrid-5b-dolma.toml", "test"),
        ("moe-fineweb.yaml", "1.5b"), ("moe-fineweb.yaml", "1b"),
        ("moe-fineweb.yaml", "medium"), ("moe-fineweb.yaml", "test"),
        ("neox-1.2b.toml", "32k"), ("neox-1.2b.toml", "8gpu"), ("neox-1.2b.toml", "test"),
        ("resonance-32k.toml", "large"), ("resonance-32k.toml", "medium"),
        ("resonance-32k.toml", "small"), ("resonance-32k.toml", "xlarge")]


@pytest.mark.parametrize("path, run", slow_if_hybrid(RUNS),
                         ids=lambda x: x.name if isinstance(x, Path) else x[0])
def test_each_run_of_a_configs_table_plans_as_it_says(path, run, build_32k_once, tmp_path):
    """`#   NAME  FLAGS  PARAMS  ~G GiB`: the file with FLAGS on the command line (the Memory
    line's --world-size and --gpu-memory unless FLAGS give theirs)."""
    _, flags, size, unit, gib = run
    flags = [] if flags == "(this file)" else flags.split()
    memory, _ = stated_memory(path)
    for i in range(0, len(memory), 2):
        if memory[i] not in flags:
            flags += memory[i:i + 2]
    p, _ = plan(path, build_32k_once, tmp_path / "r", *flags)
    scale = {"M": 1e6, "B": 1e9}[unit]
    decimals = len(size.partition(".")[2])  # the count, rounded to the digits it is given in
    assert abs(p["params"] - float(size) * scale) <= 0.5 * 10**-decimals * scale, p["params"]
    assert p["fits"] is True and abs(per_process_gib(p) - int(gib)) < 1, per_process_gib(p)


def test_the_5b_moe_recipe_needs_more_than_one_80gb_gpu(build_32k_once, tmp_path):
    path = CONFIGS / "moe-5b-32k.toml"
    assert "It needs more than one 80 GB GPU" in path.read_text()
    one, _ = plan(path, build_32k_once, tmp_path / "r", "--world-size", "1")
    assert one["fits"] is False and 80 < per_process_gib(one) < 90  # the comment's ~84 GiB


def test_the_yamls_table_of_hugging_faces_names_is_the_one_table():
    """The comment's `theirs -> ours` lines are training/names.py's, all of Hugging Face's."""
    text = (CONFIGS / "moe-fineweb.yaml").read_text()
    lines = [line for line in text.splitlines() if re.match(r"^#   \w+ -> [\w.]+$", line)]
    assert lines == names.comment_lines("hf")
    assert len(lines) >= 18


# Each file at a tiny scale: its own optimizer, schedule, precision, accumulation, clipping and
# model features on the family's tiny preset (a --model-arg replaces the file's model fields),
# two steps of the byte-level build's 65-token rows, on this machine's CPU.
TINY = {
    "hybrid-5b-dolma.toml": ["--model", "hybrid-tiny", "--model-arg", "mod_capacity=0.75",
                             "--model-arg", "n_pred_tokens=4"],
    "moe-5b-32k.toml": ["--model", "moe-tiny", "--no-fsdp"],
    "moe-fineweb.yaml": ["--model", "moe-tiny", "--model-arg", "top_k=2"],
    "neox-1.2b.toml": ["--model", "neox-tiny", "--no-fsdp", "--no-compile",  # zoo eval's
                       "--precision", "fp32"],  # val loss is fp32's: the run's, to compare
    "resonance-32k-1gpu.toml": ["--model", "resonance-tiny", "--model-arg", "d_model=64"],
    "resonance-32k.toml": ["--model", "resonance-tiny"],
}


def test_each_config_has_a_tiny_run():
    assert sorted(TINY) == [p.name for p in FILES]


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_config_trains_two_steps_at_a_tiny_scale(path, shards, tmp_path):
    run = tmp_path / "r"
    r = CliRunner().invoke(train_cli, [
        "--config", str(path), *TINY[path.name], "--shards", str(shards), "--out", str(run),
        "--seq", "65", "--batch-size", "2", "--grad-accum", "2", "--total-tokens", "512",
        "--warmup", "1", "--eval-every", "2", "--eval-batches", "1", "--workers", "0",
        *REPORTS])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in records if "loss" in m] == [0, 1]
    assert all(m["loss"] > 0 for m in records if m.get("loss") is not None)
    if path.name == "neox-1.2b.toml":  # zoo eval gives the run's val loss again
        final = [m for m in records if "val_loss" in m][-1]
        got = json.loads(CliRunner().invoke(zoo, ["eval", str(run), "--shards", str(shards),
                                                  "--batch-size", "2", "--limit", "2",
                                                  "--json"]).output)
        assert got["loss"] == pytest.approx(final["val_loss"], abs=1e-5)


def test_the_onecycle_run_ends_where_onecycle_lr_does(tmp_path):
    """Seed 004's OneCycleLR(max_lr=lr, total_steps, pct_start=0.1, anneal_strategy='cos')
    ends at lr / 25 / 10,000 (its div_factor 25, final_div_factor 1e4): the file said so in
    its comment and set 1.2e-8, ten times that. The file's values are those the seed's own
    keys translate to (training/names.py)."""
    import tomllib

    from longpack import SettingsError
    from longpack.training import config_file

    run = tomllib.loads((CONFIGS / "resonance-32k-1gpu.toml").read_text())
    optim, steps = run["optim"], run["training"]["max_steps"]
    assert optim["schedule"] == "onecycle"
    assert optim["min_lr"] == pytest.approx(optim["lr"] / 25 / 10_000, rel=1e-9)
    seed = tmp_path / "seed.yaml"
    seed.write_text(f"max_lr: {optim['lr']}\ntotal_steps: {steps}\npct_start: 0.1\n"
                    "anneal_strategy: cos\n")
    with pytest.raises(SettingsError) as e:
        config_file.read(str(seed))
    said = str(e.value)
    assert float(re.search(r"-> min_lr: (\S+) \(", said)[1]) == optim["min_lr"]
    assert f"-> warmup: {optim['warmup']} (" in said and '-> schedule: "onecycle"' in said
