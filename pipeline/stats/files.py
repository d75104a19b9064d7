"""What `pack stats` is pointed at: the build's folder (OUT, one split, or a folder of shards),
its manifest, and the presence, size and checksum of every shard file its indexes name.

Everything here is read before a split is scanned, so a folder that holds nothing to read, an
unfinished build or a manifest that is not longpack's is one line (LongpackError), and a build
that lost its manifest or a split is a listed problem.
"""

import json
from pathlib import Path

from longpack.core import LongpackError
from longpack.pipeline.config import WORK_DIR
from longpack.pipeline.formats import holds_shards
from longpack.pipeline.formats.shards import SplitReader
from longpack.pipeline.manifest import manifest_lacks
from longpack.pipeline.stats.scan import SPLITS, Problem
from longpack.pipeline.store.output_dir import TASKS


def file_checks(split: str, reader: SplitReader, verify: bool) -> list[Problem]:
    """Every shard file the index names is present, has its size, and (verify) its checksum
    (a remote build's: as each shard is read, remote.py)."""
    problems = []
    for i in range(len(reader.format)):
        for info in reader.format.stored(i):
            name = f"{split}/{info.basename}"
            size = reader.stored_size(info.basename)
            if size is None:
                problems.append(Problem(name, "missing"))
                continue
            if size != info.bytes:
                what = "truncated" if size < info.bytes else "longer than its index says"
                problems.append(Problem(name, f"{what} ({size:,} bytes, index.json says "
                                              f"{info.bytes:,})"))
            elif (verify and info.sha256 and not reader.remote
                  and reader.stored_sha256(info.basename) != info.sha256):
                problems.append(Problem(name, "checksum mismatch (sha256): the file changed "
                                              "after it was written"))
    return problems


def open_output(path: Path) -> tuple[dict | None, dict[str, Path], Problem | None]:
    """(manifest or None, {split name: directory}, a problem of the build as a whole or None)
    for OUT, OUT/train, or a plain shard dir. A build's splits are those its manifest lists
    (a missing one is then reported, not skipped); a folder holding nothing to read is an error
    that says what it lacks."""
    if not path.exists():
        raise LongpackError(f"{path}: no such directory")
    if not path.is_dir():
        raise LongpackError(f"{path}: not a directory (pass the --out of pack build)")
    if (path / WORK_DIR / TASKS).exists() and not (path / "manifest.json").exists():
        raise LongpackError(_unfinished_tasks(path))
    root, splits = path, {s: path / s for s in SPLITS if (path / s).is_dir()}
    if not _is_build_root(path):  # a train/ or val/ of no build counts only if it holds shards
        splits = {s: d for s, d in splits.items() if holds_shards(d)}
    if not splits and not _is_build_root(path):  # one split directory, or a directory of shards
        if not holds_shards(path):
            raise LongpackError(f"{path}: no manifest.json, no train/ or val/ folder, no "
                                "index.json and no .npy files")
        splits = {path.name: path}
        if path.name in SPLITS and _is_build_root(path.parent):
            root = path.parent
    if (root / WORK_DIR).exists() and not (root / "manifest.json").exists():
        raise LongpackError(f"{root}: an unfinished build (no manifest.json yet); re-run the same "
                            "pack build command to finish it")
    if not (root / "manifest.json").exists():
        lost = (Problem("manifest.json", f"missing from {root}, which holds a build's other "
                                         "outputs (it is written last)",
                        fix="re-run the same pack build command to rebuild it")
                if _is_build_root(root) else None)
        return None, splits, lost
    manifest = _read_manifest(root / "manifest.json")
    if root == path:
        splits = {s: path / s for s in manifest["splits"]}
    return manifest, splits, None


def _is_build_root(path: Path) -> bool:
    """pack build writes manifest.json last and skipped.jsonl first: either marks its --out."""
    return (path / "manifest.json").exists() or (path / "skipped.jsonl").exists()


# What pack stats reads from a manifest (docs/FORMAT.md), checked before it is read.
def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise LongpackError(f"{path}: unreadable ({e})") from None
    lacks = manifest_lacks(manifest)
    if lacks:
        raise LongpackError(f"{path}: not a longpack manifest (no {', '.join(lacks)}); re-run "
                            "the pack build that wrote it")
    return manifest


def _unfinished_tasks(root: Path) -> str:
    from longpack.pipeline.distribute.tasks import task_status

    status = task_status(root)
    n, missing = status["tasks"], status["missing"]
    if not missing:
        return (f"{root}: an unfinished build split into {n} tasks, all done but not merged; "
                f"run `pack merge {root}`")
    shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
    return (f"{root}: an unfinished build split into {n} tasks: tasks {shown} of {n} are not "
            f"done; run them (the build's command with --tasks {n} --task-index I), then "
            f"`pack merge {root}`")
