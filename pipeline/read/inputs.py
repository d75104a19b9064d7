"""The build's input files: what --input (or the dataset's hub location) names, listed,
sorted and described for the build's fingerprint. batches.py reads them.
"""

import glob
import os
from pathlib import Path

from longpack.core import SettingsError, is_url
from longpack.pipeline.read.hub import HubFiles, HuggingFaceHub
from longpack.pipeline.read.records import is_broken_link


def open_inputs(cfg, dataset, hub_client=None):
    """(the build's input files, their description for the fingerprint): --input's, else the
    dataset's shipped sample folder, else its hub repository's."""
    if cfg.inputs or dataset.sample_folder:
        inputs = list(cfg.inputs) or [str(dataset.sample_folder)]
        files = InputFiles(expand_inputs(dataset, inputs, cfg.out))
        return files, files.description
    if dataset.hub_repo is None:
        raise SettingsError(f"--dataset {dataset.name} has no hub location; pass --input PATH "
                            "(or --dataset fineweb-edu-sample / dolma-sample: the samples "
                            "shipped with longpack, offline)")
    hub = HubFiles(hub_client or HuggingFaceHub(), dataset, cfg.subset or dataset.hub_subset)
    return hub, hub.describe()


def expand_inputs(dataset, inputs: list[str], out: str | None = None) -> list:
    """Files named directly are taken whatever their name; directories and globs contribute the
    files matching the dataset's patterns. The result is sorted and free of duplicates: local
    Paths, and RemoteInputs for inputs at a URL (remote_inputs.py: a prefix is a directory).
    Document order, which the round trip and resumption rely on, is: these files sorted by path
    (the full path string), then records in file order.

    A broken symlink matching the patterns inside a directory or glob is kept in the list: the
    build reads it as one BROKEN_LINK skip, so it is counted and logged, not lost without a word.
    A broken link named directly is an error, like any missing file. `out`: the build's --out,
    which may neither lie inside an input folder nor hold an input file."""
    found: set[str] = set()
    remote = {}
    for spec in inputs:
        if not is_url(spec):
            picked = _local_files(dataset, spec)
            if out is not None and not is_url(out):
                _refuse_own_output(out, spec, picked)
            found.update(picked)
            continue
        from longpack.pipeline.read.remote_inputs import expand_remote

        remote.update({f.url: f for f in expand_remote(dataset, spec)})
    return sorted([Path(p) for p in found] + list(remote.values()), key=str)


def _local_files(dataset, spec: str) -> list[str]:
    """The absolute paths a local --input names: the file, or the dataset's files in a folder
    or matching a glob (a broken link among them too)."""
    path = os.path.expanduser(spec)
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    if os.path.isdir(path):
        candidates = [os.path.join(root, f) for root, _, files in os.walk(path) for f in files]
    elif glob.has_magic(path):
        candidates = glob.glob(path, recursive=True)
    elif os.path.exists(path):  # a FIFO, a socket, a device: no file to read twice
        raise SettingsError(f"--input {path} is neither a file nor a directory (a pipe or "
                            "a device?); write the data to a file and give that")
    else:
        raise SettingsError(f"--input {path}: no such file or directory")
    picked = [os.path.abspath(c) for c in candidates
              if (os.path.isfile(c) or is_broken_link(c))
              and dataset.names.match(os.path.basename(c))]
    if not picked:
        raise SettingsError(
            f"--input {path}: no {dataset.name} files there (looked for "
            f"{', '.join(dataset.patterns)}); use --dataset to pick another format")
    return picked


def _refuse_own_output(out: str, spec: str, files: list[str]) -> None:
    """OUT inside the --input folder `spec`, or one of its files under OUT: the build's own
    files (skipped.jsonl, index.json, ...) would be read as input by its next run, which could
    then neither resume nor find it complete."""
    root = os.path.realpath(out)
    folder = os.path.realpath(os.path.expanduser(spec))
    if os.path.isdir(folder) and root.startswith(folder + os.sep):
        raise SettingsError(f"--out {out} is inside --input {spec}, which the build reads: its "
                            f"own files would become its input; choose an --out outside {spec}")
    for p in sorted(files):
        if os.path.realpath(p).startswith(root + os.sep):
            raise SettingsError(f"--input takes in {p}, which is under --out {out}: the build's "
                                "own files would become its input; choose an --out outside "
                                "the inputs")


class InputFiles:
    """The files --input names: local Paths, and RemoteInputs at URLs (remote_inputs.py), which
    the readers take alike."""

    def __init__(self, paths: list):
        self.paths = paths
        self.files = [(str(p), 0 if is_broken_link(p) else p.stat().st_size) for p in paths]
        # Path, size and mtime of each file (an object: URL, size and ETag); a broken link is
        # described by its target, so that mending it changes the build's fingerprint (a re-run
        # is refused, not mixed).
        self.description = [p.describe() if hasattr(p, "describe") else _describe(p)
                            for p in paths]

    def path(self, i: int, prefetch_next: bool = True):
        return self.paths[i]

    def uri(self, i: int) -> str:
        return str(self.paths[i])

    def close(self):
        pass


def _describe(path: Path) -> dict:
    if is_broken_link(path):
        return {"path": str(path), "size": 0, "broken_link": os.readlink(path)}
    st = os.stat(path)
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
