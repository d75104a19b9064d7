"""One installed name (issue 55): longpack installs `longpack` alone, so a user's own folders
named like longpack's stages (pipeline/, training/, archs/: common names in ML repositories) do
not shadow it, in an editable install (this venv's) and in a wheel."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from conftest import make_texts, write_byte_tokenizer_json, write_jsonl

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent
STAGES = ("pipeline", "training", "archs")


def users_folder(tmp: Path) -> Path:
    """A project of a user's own: packages named like longpack's stages, each raising on import,
    beside a corpus and a tokenizer."""
    folder = tmp / "project"
    for name in STAGES:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('the user\\'s own {name} package was imported')\n")
    write_jsonl(folder / "docs.jsonl", [{"text": t} for t in make_texts(60)])
    write_byte_tokenizer_json(folder / "tokenizer.json")
    return folder


def run(args: list, folder: Path, env_path: str | None = None) -> subprocess.CompletedProcess:
    """`args` run in `folder`, with it first on the import path, as `python` there would."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), env_path]))}
    return subprocess.run([str(a) for a in args], cwd=folder, capture_output=True, text=True,
                          env=env, timeout=300)


API = textwrap.dedent("""
    import importlib.util, json, longpack
    assert all(importlib.util.find_spec(n).origin.startswith(OWN) for n in STAGES)
    manifest = longpack.build(out="built", dataset="jsonl", inputs=["docs.jsonl"],
                              tokenizer="tokenizer.json", seq=64, val_fraction=0.1)
    report = longpack.stats("built", verify=True)
    plan = longpack.plan(shards="built", model="neox-tiny", batch_size=2, max_steps=3,
                         log=lambda line: None)
    print(json.dumps({"rows": manifest["splits"]["train"]["rows"], "ok": report["checks"]["ok"],
                      "steps": plan["steps"], "file": longpack.__file__}))
""")


def test_a_users_own_stage_folders_shadow_nothing(tmp_path):
    folder = users_folder(tmp_path)
    code = f"OWN = {str(folder)!r}; STAGES = {STAGES!r}\n" + API
    r = run([sys.executable, "-c", code], folder)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rows"] > 0 and out["ok"] is True and out["steps"] == 3
    assert out["file"] == str(ROOT / "longpack" / "__init__.py")
    # the console scripts, from the same folder (its packages on PYTHONPATH too)
    r = run([BIN / "pack", "stats", "built", "--verify"], folder)
    assert r.returncode == 0 and r.stdout.startswith("pack stats built"), r.stdout + r.stderr
    r = run([BIN / "zoo", "list"], folder)
    assert r.returncode == 0 and "neox-tiny" in r.stdout, r.stderr
    r = run([BIN / "train", "--list-models", "--shards", "built"], folder)
    assert r.returncode == 0 and "neox-tiny" in r.stdout, r.stderr
    for module in ("longpack.pipeline", "longpack.archs"):  # `python -m` entry points
        r = run([sys.executable, "-m", module, "--help"], folder)
        assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr


def test_only_longpack_is_importable_from_another_folder(tmp_path):
    code = ("import importlib.util as u, json; "
            f"print(json.dumps([u.find_spec(n) is None for n in {STAGES!r}]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, check=True, env={k: v for k, v in os.environ.items()
                                                   if k != "PYTHONPATH"})
    assert json.loads(r.stdout) == [True, True, True]


@pytest.mark.slow
def test_the_wheel_installs_longpack_alone_and_runs(tmp_path):
    """The wheel built from the clone: one top-level package whose stages are files (the links
    followed), its data files and entry points; installed into a folder of its own, it builds
    and plans from a user's project."""
    source = tmp_path / "source"  # a copy: setuptools writes build/ beside pyproject.toml
    for folder in ("longpack", *STAGES, "configs"):  # longpack/'s links stay links
        shutil.copytree(ROOT / folder, source / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for file in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(ROOT / file, source / file)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(source)], check=True, capture_output=True,
                   timeout=600)
    wheel = next(wheels.glob("longpack-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"longpack"}
    for needed in ("longpack/pipeline/build.py", "longpack/training/loop.py",
                   "longpack/archs/presets.json", "longpack/archs/hf/modeling_longpack.py",
                   "longpack/pipeline/samples/gpt2.tiktoken", "longpack/core/errors.py",
                   "longpack/zoo/cli.py"):
        assert needed in names, needed
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    for line in ("pack = longpack.pipeline.cli:pack", "train = longpack.training.cli:train",
                 "zoo = longpack.zoo.cli:zoo"):
        assert line in scripts
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=600)
    folder = users_folder(tmp_path)
    code = f"OWN = {str(folder)!r}; STAGES = {STAGES!r}\n" + API
    r = run([sys.executable, "-c", code], folder, env_path=str(site))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["file"] == str(site / "longpack" / "__init__.py")  # the wheel's, not the clone's
    assert out["rows"] > 0 and out["ok"] is True and out["steps"] == 3
