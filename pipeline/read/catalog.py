"""Named datasets: their text field, file patterns and hub location (or shipped sample).

Which files of a folder, a bucket prefix or a hub repository a build reads is decided by the
dataset's `names` (its patterns, compiled once); read/inputs.py expands --input, read/hub.py
selects a subset of a repository. The `-sample` datasets are small real corpora installed with
the package (pipeline/samples/, its README gives their origins and licences): without --input a
build reads them, offline.
"""

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from longpack.core import SettingsError

JSONL_PATTERNS = ("*.jsonl", "*.json", "*.jsonl.gz", "*.json.gz", "*.jsonl.zst", "*.json.zst",
                  "*.jsonl.zstd", "*.json.zstd")
PARQUET_PATTERNS = ("*.parquet",)
SAMPLES = Path(__file__).resolve().parents[1] / "samples"  # package data (pyproject.toml)


@dataclass(frozen=True)
class Dataset:
    name: str
    text_field: str
    patterns: tuple[str, ...]  # which files in a directory are documents
    hub_repo: str | None = None  # Hugging Face dataset repository, for builds without --input
    hub_subset: str | None = None  # its default subset
    sample: str | None = None  # a folder of SAMPLES, read for builds without --input
    # a file's base name matches one of `patterns` (fnmatch's syntax, case-sensitive)
    names: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        either = "|".join(f"(?:{fnmatch.translate(p)})" for p in self.patterns)
        object.__setattr__(self, "names", re.compile(either))

    @property
    def sample_folder(self) -> Path | None:
        return SAMPLES / self.sample if self.sample else None


DATASETS = {
    "fineweb-edu": Dataset("fineweb-edu", "text", PARQUET_PATTERNS,
                           "HuggingFaceFW/fineweb-edu", "sample-10BT"),
    "fineweb": Dataset("fineweb", "text", PARQUET_PATTERNS, "HuggingFaceFW/fineweb", "sample-10BT"),
    "dolma": Dataset("dolma", "text", JSONL_PATTERNS),
    # shipped with the package: 400 documents, 306,716 GPT-2 tokens; 180 records (5 of them
    # empty), 292,243 tokens
    "fineweb-edu-sample": Dataset("fineweb-edu-sample", "text", PARQUET_PATTERNS,
                                  sample="fineweb-edu-sample"),
    "dolma-sample": Dataset("dolma-sample", "text", JSONL_PATTERNS, sample="dolma-sample"),
    "parquet": Dataset("parquet", "text", PARQUET_PATTERNS),
    "jsonl": Dataset("jsonl", "text", JSONL_PATTERNS),
}


def get_dataset(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        raise SettingsError(f"unknown --dataset {name!r}; choose one of {', '.join(DATASETS)}") from None


def file_format(path: str) -> str:
    """'parquet' or 'jsonl', from the file name."""
    name = os.path.basename(path)
    if fnmatch.fnmatch(name, "*.parquet"):
        return "parquet"
    return "jsonl"
