"""The data stage offers the trainer a small explicit API (pipeline/__init__.py), and the trainer
uses nothing else of it."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline

ROOT = Path(__file__).resolve().parent.parent


def test_every_name_of_the_api_resolves_and_nothing_else_does():
    for name in pipeline.__all__:
        assert getattr(pipeline, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'RowPacker'"):
        pipeline.RowPacker  # noqa: B018  (internal: not offered)


@pytest.mark.parametrize("package", ["training", "archs"])
def test_the_other_packages_import_only_the_api_of_pipeline(package):
    for path in sorted((ROOT / package).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("pipeline."), f"{path.name}: {node.module}"
                if node.module == "pipeline":
                    assert {a.name for a in node.names} <= set(pipeline.__all__), path.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("pipeline.") for a in node.names), path.name


def test_importing_pipeline_and_its_errors_loads_no_heavy_library():
    code = ("import sys, pipeline; from pipeline import DataError, SettingsError, setting; "
            "print(sorted(m for m in ('numpy', 'torch', 'streaming', 'pyarrow') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
