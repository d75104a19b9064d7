"""Checkpoints: RUN/step-NNNNNNNN/ directories, written whole or not at all, newest kept.

A checkpoint is written into `.step-N.tmp/`, with a `COMPLETE` file holding the sha256 of
`state.pt`, then renamed; `RUN/latest` names the newest. Loading takes the newest checkpoint
whose COMPLETE matches its state.pt, warning about (and skipping) any that do not.
"""

import shutil
import warnings
from pathlib import Path

import torch

from pipeline.atomic import sha256_file, write_bytes


def save(run: Path, step: int, state: dict, keep_last: int) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    final = run / f"step-{step:08d}"
    tmp = run / f".step-{step:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "COMPLETE").write_text(sha256_file(tmp / "state.pt") + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    write_bytes(run / "latest", (final.name + "\n").encode())
    for old in sorted(run.glob("step-*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: Path) -> tuple[dict, Path]:
    """The checkpoint in `path`, after checking state.pt against COMPLETE (on the CPU: each
    process moves what it needs to its own device)."""
    complete = path / "COMPLETE"
    if not complete.is_file():
        raise ValueError(f"{path} is not a complete checkpoint (no COMPLETE file)")
    if complete.read_text().strip() != sha256_file(path / "state.pt"):
        raise ValueError(f"{path}/state.pt does not match its checksum")
    return torch.load(path / "state.pt", map_location="cpu", weights_only=False), path


def load_latest(run: Path) -> tuple[dict, Path] | None:
    for path in sorted(run.glob("step-*"), reverse=True):
        try:
            return load(path)
        except Exception as e:  # truncated, missing or unreadable: fall back to the one before
            warnings.warn(f"skipping checkpoint {path}: {e}", stacklevel=2)
    return None
