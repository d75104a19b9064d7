"""The shard formats, by name (what `--format` and manifest.json's "format" say), and which one
a split's folder holds. Adding a format is a file like memmap.py and a line here.
"""

import json
from pathlib import Path

from longpack.errors import SettingsError
from pipeline.formats.base import ShardError, ShardFormat
from pipeline.formats.mds import MdsFormat
from pipeline.formats.memmap import MemmapFormat
from pipeline.formats.npy import NpyFolder

FORMATS: dict[str, type[ShardFormat]] = {"mds": MdsFormat, "memmap": MemmapFormat}
INDEXED = (MemmapFormat, MdsFormat)  # asked in turn whether an index.json is theirs; MDS last


def get_format(name: str) -> type[ShardFormat]:
    try:
        return FORMATS[name]
    except KeyError:
        raise SettingsError(f"unknown shard format {name!r} (one of: "
                            f"{', '.join(FORMATS)})") from None


def open_format(folder: Path, index: bytes | None = None, source: str | None = None
                ) -> ShardFormat:
    """The format object of the split in `folder`: its index.json's format, or a folder of
    plain .npy files; ShardError naming what it lacks. `index`: the bytes of the split's
    index.json fetched from elsewhere (a store: `source` names it), `folder` being where its
    shards are to be put."""
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
    return (Path(folder) / "index.json").exists() or NpyFolder.holds(folder)


def _read_index(path: Path) -> tuple[dict, type[ShardFormat]]:
    """A split's index.json and its format; ShardError naming it when it is not JSON or not an
    index a format can use, so no reader of it fails on a missing key."""
    try:
        return _parse_index(path.read_bytes(), path)
    except OSError as e:
        raise ShardError(path, f"unreadable ({e.strerror})") from None


def _parse_index(data: bytes, path) -> tuple[dict, type[ShardFormat]]:
    try:
        index = json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ShardError(path, f"not valid JSON ({e})") from None
    if not isinstance(index, dict) or not isinstance(index.get("shards"), list):
        raise ShardError(path, "has no list of shards: not an MDS or longpack-memmap index")
    fmt = next(f for f in INDEXED if f.claims(index))
    for i, entry in enumerate(index["shards"]):
        lacks = [k for k in fmt.entry_keys if not isinstance(entry, dict) or k not in entry]
        if lacks:
            raise ShardError(path, f"shard {i} of its {fmt.name} index has no {', '.join(lacks)}")
    return index, fmt
