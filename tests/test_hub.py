"""The hub path, with a local stand-in for the Hugging Face hub (no network here or in CI)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_texts, write_parquet
from longpack.core.errors import SettingsError
from longpack.pipeline.build import build
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.read.catalog import DATASETS
from longpack.pipeline.read.hub import hub_prefix, select_hub_files

LISTING = [("README.md", 10), ("sample/10BT/001_00000.parquet", 300),
           ("sample/10BT/000_00000.parquet", 200), ("sample/100BT/000_00000.parquet", 900),
           ("data/CC-MAIN-2024-10/000_00000.parquet", 50), ("sample/10BT/notes.txt", 1)]


def test_subset_folders():
    assert hub_prefix("sample-10BT") == "sample/10BT/"
    assert hub_prefix("CC-MAIN-2024-10") == "data/CC-MAIN-2024-10/"
    assert hub_prefix("default") == "data/"


def test_selection_takes_the_subset_parquet_files_in_order():
    picked = select_hub_files(DATASETS["fineweb-edu"], "sample-10BT", LISTING)
    assert picked == [("sample/10BT/000_00000.parquet", 200),
                      ("sample/10BT/001_00000.parquet", 300)]
    with pytest.raises(SettingsError, match="no .*parquet files under sample/1BT/"):
        select_hub_files(DATASETS["fineweb-edu"], "sample-1BT", LISTING)


class LocalHub:
    """Serves a folder as if it were a hub repository, and records what was downloaded."""

    def __init__(self, root: Path):
        self.root, self.downloads = root, []

    def list_files(self, repo, revision):
        files = [(str(p.relative_to(self.root)), p.stat().st_size)
                 for p in self.root.rglob("*") if p.is_file()]
        return "0123abcd", files

    def download(self, repo, revision, path):
        self.downloads.append(path)
        return self.root / path


@pytest.fixture
def hub_repo(tmp_path) -> Path:
    root = tmp_path / "repo" / "sample" / "10BT"
    root.mkdir(parents=True)
    for i in range(4):
        write_parquet(root / f"00{i}_00000.parquet", make_texts(200, seed=i))
    return tmp_path / "repo"


def hub_build(tmp_path, client, **kw):
    cfg = BuildConfig(out=str(tmp_path / "out"), dataset="fineweb-edu",
                      tokenizer=str(tmp_path / "gpt2.tiktoken"), seq=64, **kw)
    return build(cfg, hub_client=client, show_progress=False)


def test_max_tokens_fetches_only_the_files_it_needs(tmp_path, hub_repo, byte_tokenizer):
    client = LocalHub(hub_repo)
    m = hub_build(tmp_path, client, max_tokens=1000)
    assert client.downloads == ["sample/10BT/000_00000.parquet"]
    assert m["inputs"][0]["path"] == (
        "hf://datasets/HuggingFaceFW/fineweb-edu@0123abcd/sample/10BT/000_00000.parquet")
    assert m["counts"]["tokens"] >= 1000


def test_full_hub_build_reads_every_file_in_order(tmp_path, hub_repo, byte_tokenizer):
    client = LocalHub(hub_repo)
    m = hub_build(tmp_path, client)
    assert client.downloads == [f"sample/10BT/00{i}_00000.parquet" for i in range(4)]
    assert m["counts"]["documents"] == 800


def test_no_network_is_one_line_that_says_to_pass_input(tmp_path, byte_tokenizer):
    pytest.importorskip("huggingface_hub")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    pack = shutil.which("pack") or str(Path(sys.executable).parent / "pack")
    r = subprocess.run([pack, "build", "--dataset", "fineweb-edu", "--out",
                        str(tmp_path / "out"), "--tokenizer", byte_tokenizer],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "Hugging Face hub" in r.stderr and "--input" in r.stderr


def test_dolma_has_no_hub_preset(tmp_path, byte_tokenizer):
    with pytest.raises(SettingsError, match="dolma has no hub location; pass --input"):
        build(BuildConfig(out=str(tmp_path / "o"), dataset="dolma", tokenizer=byte_tokenizer),
              show_progress=False)
