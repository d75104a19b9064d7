"""Checkpoints: RUN/step-NNNNNNNN/ directories, written whole or not at all, newest kept.

A checkpoint is written into `.step-N.tmp/`, with a `COMPLETE` file holding the sha256 of
`state.pt`, then renamed; `RUN/latest` names the newest. Loading takes the newest checkpoint
whose COMPLETE matches its state.pt, warning about (and skipping) any that do not.
"""

import hashlib
import shutil
import warnings
from pathlib import Path

import torch

from pipeline.atomic import write_bytes


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def save(run: Path, step: int, state: dict, keep_last: int) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    final = run / f"step-{step:08d}"
    tmp = run / f".step-{step:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "COMPLETE").write_text(_sha256(tmp / "state.pt") + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    write_bytes(run / "latest", (final.name + "\n").encode())
    for old in sorted(run.glob("step-*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest(run: Path) -> tuple[dict, Path] | None:
    for path in sorted(run.glob("step-*"), reverse=True):
        try:
            if (path / "COMPLETE").read_text().strip() != _sha256(path / "state.pt"):
                raise ValueError("state.pt does not match its checksum")
            return torch.load(path / "state.pt", weights_only=False), path
        except Exception as e:  # truncated, missing or unreadable: fall back to the one before
            warnings.warn(f"skipping checkpoint {path}: {e}", stacklevel=2)
    return None
