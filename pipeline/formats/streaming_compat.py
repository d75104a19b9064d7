"""The one place that imports mosaicml-streaming, and works around what it leaves behind.

`import streaming` imports `streaming.vision`, which imports torchvision. The torchvision wheel
on PyPI is built for CUDA and fails to load next to a CPU-only torch ("operator torchvision::nms
does not exist"), and data preparation runs on CPU-only nodes. Nothing longpack uses needs
`streaming.vision`, so when torchvision cannot load we register an empty module under that name
before importing streaming. The README's install pins a torch/torchvision pair that loads
(tests/test_user_environment.py imports streaming with nothing of this); this keeps longpack
working in an environment that has a mismatched pair.

Each StreamingDataset takes the first number N whose shared memory and lock files are free and
makes `N_barrier_filelock` and `N_cache_filelock` in the temp folder, which it never removes; a
number with a lock file counts as taken. So every dataset that ever read a shard leaves two files,
and every later dataset walks them all before it opens (0.4 s an open at ~4,700 such files on a
machine that had run the test suite a few times, 4 ms once they were gone).
`clear_stale_locks` removes the lock files of numbers with no shared memory left: no dataset uses
them (a dataset makes its shared memory before its lock files and keeps it while it lives).
"""

import re
import sys
import tempfile
import types
from pathlib import Path

_LOCK = re.compile(r"(\d{6})_(barrier|cache)_filelock")


def import_streaming():
    if "streaming" not in sys.modules and "streaming.vision" not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except Exception:  # RuntimeError on CPU torch, ImportError when absent
            sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    import streaming

    return streaming


def clear_stale_locks(temp: Path | None = None, shm: Path = Path("/dev/shm")) -> int:
    """Remove mosaicml-streaming's lock files whose dataset is gone (see above); the number
    removed. Does nothing where shared memory is not under `shm` (not Linux); another user's
    files, which cannot be removed, stay."""
    if not shm.is_dir():
        return 0
    removed = 0
    for path in Path(temp or tempfile.gettempdir()).glob("*_filelock"):
        match = _LOCK.fullmatch(path.name)
        if match is None or (shm / f"{match[1]}_locals").exists():
            continue
        try:
            path.unlink()
            removed += 1
        except OSError:  # removed by another process just now, or not ours
            continue
    return removed
