"""The shard formats, by name (what `--format` and manifest.json's "format" say), and which one
a split's folder holds: the one registry `pack build`, `pack import`, `pack stats` and the
trainer all consult. Adding a format is a file like memmap.py (a ShardFormat: base.py) and a
line in FORMATS; nothing else names a format.

This module loads no format (nor numpy) until one is asked for: `pack --help` stays cheap.
"""

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from longpack.core import SettingsError

if TYPE_CHECKING:
    from longpack.pipeline.formats.base import ShardFormat

# name -> its class, as "module:Class" (loaded on first use) or the class itself. An index.json
# is claimed by the first format whose claims() takes it, a format that takes any index
# (MDS: other tools' too) last.
FORMATS: dict[str, object] = {"mds": "longpack.pipeline.formats.mds:MdsFormat",
                              "memmap": "longpack.pipeline.formats.memmap:MemmapFormat"}


def get_format(name: str):
    """The ShardFormat class registered as `name`; SettingsError listing the formats."""
    try:
        entry = FORMATS[name]
    except KeyError:
        raise SettingsError(f"unknown shard format {name!r} (one of: "
                            f"{', '.join(FORMATS)})") from None
    if isinstance(entry, str):
        module, _, cls = entry.partition(":")
        entry = FORMATS[name] = getattr(importlib.import_module(module), cls)
    return entry


def _claimants() -> list:
    """Every registered format in the order they are asked whether an index is theirs."""
    return sorted((get_format(n) for n in FORMATS), key=lambda f: f.claims_any)


def open_format(folder: Path, index: bytes | None = None, source: str | None = None
                ) -> "ShardFormat":
    """The format object of the split in `folder`: its index.json's format, or a folder of
    plain .npy files; ShardError naming what it lacks. `index`: the bytes of the split's
    index.json fetched from elsewhere (a store: `source` names it), `folder` being where its
    shards are to be put."""
    from longpack.pipeline.formats.base import ShardError
    from longpack.pipeline.formats.npy import NpyFolder

    folder = Path(folder)
    index_path = folder / "index.json"
    if index is not None:
        index, fmt = _parse_index(index, source or index_path)
        return fmt(folder, index)
    if index_path.exists():
        index, fmt = _read_index(index_path)
        return fmt(folder, index)
    if NpyFolder.holds(folder):
        return NpyFolder(folder)
    raise ShardError(folder, "no index.json and no .npy files")


def holds_shards(folder: Path) -> bool:
    from longpack.pipeline.formats.npy import NpyFolder

    return (Path(folder) / "index.json").exists() or NpyFolder.holds(folder)


def _read_index(path: Path) -> tuple[dict, type]:
    """A split's index.json and its format; ShardError naming it when it is not JSON or not an
    index a format can use, so no reader of it fails on a missing key."""
    from longpack.pipeline.formats.base import ShardError

    try:
        return _parse_index(path.read_bytes(), path)
    except OSError as e:
        raise ShardError(path, f"unreadable ({e.strerror})") from None


def _parse_index(data: bytes, path) -> tuple[dict, type]:
    from longpack.pipeline.formats.base import ShardError

    try:
        index = json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ShardError(path, f"not valid JSON ({e})") from None
    if not isinstance(index, dict) or not isinstance(index.get("shards"), list):
        raise ShardError(path, "has no list of shards: not an MDS or longpack-memmap index")
    fmt = next(f for f in _claimants() if f.claims(index))
    for i, entry in enumerate(index["shards"]):
        lacks = [k for k in fmt.entry_keys if not isinstance(entry, dict) or k not in entry]
        if lacks:
            raise ShardError(path, f"shard {i} of its {fmt.name} index has no {', '.join(lacks)}")
    return index, fmt
