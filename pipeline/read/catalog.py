"""Named datasets: their text field, file patterns and hub location; and --input expansion.

Document order, which the round trip and resumption rely on, is: input files sorted by path
(the full path string, after expanding directories and globs), then records in file order.
"""

import fnmatch
import glob
import os
from dataclasses import dataclass
from pathlib import Path

from longpack.errors import SettingsError

JSONL_PATTERNS = ("*.jsonl", "*.json", "*.jsonl.gz", "*.json.gz", "*.jsonl.zst", "*.json.zst",
                  "*.jsonl.zstd", "*.json.zstd")
PARQUET_PATTERNS = ("*.parquet",)


@dataclass(frozen=True)
class Dataset:
    name: str
    text_field: str
    patterns: tuple[str, ...]  # which files in a directory are documents
    hub_repo: str | None = None  # Hugging Face dataset repository, for builds without --input
    hub_subset: str | None = None  # its default subset


DATASETS = {
    "fineweb-edu": Dataset("fineweb-edu", "text", PARQUET_PATTERNS,
                           "HuggingFaceFW/fineweb-edu", "sample-10BT"),
    "fineweb": Dataset("fineweb", "text", PARQUET_PATTERNS, "HuggingFaceFW/fineweb", "sample-10BT"),
    "dolma": Dataset("dolma", "text", JSONL_PATTERNS),
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


def matches(dataset: Dataset, path: str) -> bool:
    name = os.path.basename(path)
    return any(fnmatch.fnmatch(name, p) for p in dataset.patterns)


def expand_inputs(dataset: Dataset, inputs: list[str]) -> list:
    """Files named directly are taken whatever their name; directories and globs contribute the
    files matching the dataset's patterns. The result is sorted and free of duplicates: local
    Paths, and RemoteInputs for inputs at a URL (remote_inputs.py: a prefix is a directory).

    A broken symlink matching the patterns inside a directory or glob is kept in the list: the
    build reads it as one BROKEN_LINK skip (inputs.py), so it is counted and logged, not lost
    without a word. A broken link named directly is an error, like any missing file."""
    from longpack.store import is_url

    found: set[str] = set()
    remote = {}
    for spec in inputs:
        if is_url(spec):
            from pipeline.read.remote_inputs import expand_remote

            remote.update({f.url: f for f in expand_remote(dataset, spec)})
            continue
        spec = os.path.expanduser(spec)
        if os.path.isfile(spec):
            found.add(os.path.abspath(spec))
            continue
        if os.path.isdir(spec):
            candidates = [os.path.join(root, f) for root, _, files in os.walk(spec) for f in files]
        elif glob.has_magic(spec):
            candidates = glob.glob(spec, recursive=True)
        else:
            raise SettingsError(f"--input {spec}: no such file or directory")
        picked = [os.path.abspath(c) for c in candidates
                  if (os.path.isfile(c) or is_broken_link(c)) and matches(dataset, c)]
        if not picked:
            raise SettingsError(
                f"--input {spec}: no {dataset.name} files there (looked for "
                f"{', '.join(dataset.patterns)}); use --dataset to pick another format")
        found.update(picked)
    return sorted([Path(p) for p in found] + list(remote.values()), key=str)


def is_broken_link(path) -> bool:
    return isinstance(path, (str, Path)) and os.path.islink(path) and not os.path.exists(path)


def hub_prefix(subset: str) -> str:
    """Folder of a FineWeb(-Edu) subset in its repository: 'sample-10BT' -> 'sample/10BT/',
    'CC-MAIN-2024-10' -> 'data/CC-MAIN-2024-10/', 'default' -> 'data/'."""
    if subset == "default":
        return "data/"
    if subset.startswith("sample-"):
        return f"sample/{subset.removeprefix('sample-')}/"
    return f"data/{subset}/"


def select_hub_files(dataset: Dataset, subset: str, listing: list[tuple[str, int]]
                     ) -> list[tuple[str, int]]:
    """The (path, size) entries of a repository listing that make up `subset`, in build order."""
    prefix = hub_prefix(subset)
    picked = sorted((p, s) for p, s in listing if p.startswith(prefix) and matches(dataset, p))
    if not picked:
        raise SettingsError(
            f"the hub repository {dataset.hub_repo} has no {', '.join(dataset.patterns)} files "
            f"under {prefix} (subset {subset!r}); check --subset")
    return picked
