"""longpack's layers (issue 55): pyproject.toml's import-linter contract holds, and breaks when a
lower layer imports a higher one; each part is entered through its package's names, every one
of which resolves; no code imports a bare `pipeline`, `training` or `archs`."""

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
# each part of longpack, by the package a caller enters it through (longpack itself: the API)
PARTS = ["longpack.zoo", "longpack.training", "longpack.pipeline", "longpack.archs",
         "longpack.core"]


def lint(root: Path, env_path: Path | None = None) -> subprocess.CompletedProcess:
    """lint-imports over the `longpack` importable from `env_path` (the installed one by
    default), with `root`'s pyproject.toml contract."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(env_path or "")}
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True,
                          env=env, timeout=120)


def test_the_layers_contract_is_kept():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "longpack's layers KEPT" in r.stdout
    contract = (ROOT / "pyproject.toml").read_text().split("[tool.importlinter]")[1]
    for part in [*PARTS, "longpack.api"]:  # every part named in it
        assert f'"{part}' in contract or f"| {part}" in contract, part


@pytest.mark.parametrize("lower, higher", [("pipeline/manifest.py", "longpack.training"),
                                           ("archs/layers.py", "longpack.pipeline"),
                                           ("longpack/core/errors.py", "longpack.archs"),
                                           ("training/step.py", "longpack.zoo")])
def test_a_lower_layer_importing_a_higher_one_breaks_it(tmp_path, lower, higher):
    """The package copied (its links followed), one import added where the layers forbid it."""
    copy = tmp_path / "longpack"
    shutil.copytree(ROOT / "longpack", copy, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.parquet", "*.gz", "*.tiktoken"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert lint(tmp_path, tmp_path).returncode == 0  # the copy as it is: kept
    target = copy / lower.removeprefix("longpack/")  # pipeline/: the link's, copied
    target.write_text(target.read_text() + f"\nimport {higher}  # upward\n")
    r = lint(tmp_path, tmp_path)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "longpack's layers BROKEN" in r.stdout and f"import {higher}" in r.stdout


def part(module: str) -> str:
    return next((p for p in PARTS if module == p or module.startswith(p + ".")), "longpack")


def test_each_part_is_entered_through_its_package_names():
    graph = grimp.build_graph("longpack", cache_dir=None)
    entered_past = sorted(f"{m} -> {i}" for m in graph.modules
                          for i in graph.find_modules_directly_imported_by(m)
                          if part(m) != part(i) and i != part(i))
    assert not entered_past, "import these through their package's names:\n" + "\n".join(
        entered_past)


@pytest.mark.parametrize("package", ["longpack", *PARTS])
def test_every_public_name_resolves(package):
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None) or [*getattr(module, "_ELSEWHERE", {})]
    assert names
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{package} lists names it cannot give: {missing}"


def test_no_code_imports_a_bare_stage_name():
    bare = re.compile(r"^\s*(from|import)\s+(pipeline|training|archs)\b", re.M)
    found = [f"{path.relative_to(ROOT)}: {m.group(0).strip()}"
             for folder in ("pipeline", "training", "archs", "longpack", "tests", "tools")
             for path in (ROOT / folder).rglob("*.py") if not path.is_symlink()
             for m in bare.finditer(path.read_text())]
    assert not found, found
