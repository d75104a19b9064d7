"""One task's documents of one split, as the task tokenized them: not yet rows.

A task of `pack build --tasks N` cannot cut rows: where its first row begins depends on how
many tokens the tasks before it hold. So it writes its documents as they come, in its work
folder:

    <split>.tokens   the documents' tokens ([BOS] + ids + EOS each), concatenated, token dtype
    <split>.docs     uint64 pairs (length in tokens, document hash), one per document

Both are append-only; the task's checkpoint records how many tokens and documents of them are
valid, and a resumed task cuts them back to that (as ShardSink does with its partial files).
Once the counts of earlier tasks are known, task_merge.py cuts rows out of these files.
"""

import contextlib
from pathlib import Path

import numpy as np

from pipeline.atomic import open_write_ahead, writing
from pipeline.errors import SettingsError

DOC_BYTES = 2 * 8


def stream_paths(folder: Path, split: str) -> tuple[Path, Path]:
    return folder / f"{split}.tokens", folder / f"{split}.docs"


class TaskStream:
    def __init__(self, folder: Path, split: str, dtype: np.dtype, state: dict | None = None):
        self.dtype = np.dtype(dtype)
        state = state or {"tokens": 0, "docs": 0}
        self.tokens, self.docs = state["tokens"], state["docs"]
        sizes = (self.tokens * self.dtype.itemsize, self.docs * DOC_BYTES)
        self._files = [open_write_ahead(path, size)
                       for path, size in zip(stream_paths(folder, split), sizes)]

    def append(self, tokens: np.ndarray, lengths: np.ndarray, hashes: np.ndarray) -> None:
        docs = np.stack([lengths.astype("<u8"), hashes.astype("<u8")], axis=1)
        for f, data in zip(self._files, (tokens.astype(self.dtype.newbyteorder("<"), copy=False),
                                         docs)):
            with writing(Path(f.name)):
                f.write(data.tobytes())
        self.tokens += len(tokens)
        self.docs += len(docs)

    def state(self) -> dict:
        for f in self._files:
            with writing(Path(f.name)):
                f.flush()
        return {"tokens": self.tokens, "docs": self.docs}

    def close(self) -> None:
        for f in self._files:
            with writing(Path(f.name)):
                f.close()

    def abandon(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()


def read_stream(folder: Path, split: str, dtype: np.dtype, tokens: int, docs: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, docs [m, 2] uint64) of a finished task's split: the tokens mapped, not read."""
    tokens_path, docs_path = stream_paths(folder, split)
    dtype = np.dtype(dtype).newbyteorder("<")
    for path, size in ((tokens_path, tokens * dtype.itemsize), (docs_path, docs * DOC_BYTES)):
        if (path.stat().st_size if path.exists() else 0) < size:
            raise SettingsError(f"{path}: shorter than its task recorded (damaged or removed); "
                                f"delete {folder} and re-run that task")
    token_array = (np.memmap(tokens_path, dtype, "r", shape=(tokens,)) if tokens
                   else np.zeros(0, dtype))
    doc_array = np.fromfile(docs_path, "<u8", count=2 * docs).reshape(-1, 2)
    return token_array, doc_array
