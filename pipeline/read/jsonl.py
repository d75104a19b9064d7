"""Read JSON-lines documents (Dolma and friends): plain, .gz or .zst, streamed line by line.

Yields (line_number, text | Skip) with 1-based line numbers; memory is one line plus one
compressed chunk, whatever the file size. A truncated .gz or .zst yields a TRUNCATED_FILE skip
after its last complete line (zstandard's stream reader returns a short read silently on
truncation, so frames are decoded with an explicit end-of-frame check).
"""

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import zstandard

from longpack.pipeline.read.records import (
    BAD_JSON,
    BLANK_LINE,
    CORRUPT_FILE,
    EMPTY,
    INVALID_UTF8,
    MISSING_TEXT,
    TRUNCATED_FILE,
    ReadPosition,
    Skip,
)

CHUNK = 1 << 20


class Truncated(Exception):
    pass


def _zstd_chunks(f) -> Iterator[bytes]:
    dctx = zstandard.ZstdDecompressor()
    obj, pending = None, b""
    while True:
        data = pending or f.read(CHUNK)
        pending = b""
        if not data:
            if obj is not None:
                raise Truncated("the last zstd frame is incomplete")
            return
        if obj is None:
            obj = dctx.decompressobj()
        out = obj.decompress(data)
        if out:
            yield out
        if obj.eof:  # a frame ended; anything after it starts the next frame
            pending, obj = obj.unused_data, None


def _lines_from_chunks(chunks: Iterator[bytes]) -> Iterator[bytes]:
    rest = b""
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


def _raw_lines(path, position: ReadPosition) -> Iterator[bytes]:
    """Lines of the decompressed file (a local Path or a RemoteInput, read as a stream);
    `position` follows the stored (compressed) bytes read."""
    name = path.name
    with path.open("rb") as raw:
        if name.endswith(".gz"):
            lines = gzip.GzipFile(fileobj=raw, mode="rb")
        elif name.endswith(".zst") or name.endswith(".zstd"):
            lines = _lines_from_chunks(_zstd_chunks(raw))
        else:
            lines = raw
        for line in lines:
            position.bytes = raw.tell()
            yield line


def _document(line: bytes, field: str):
    if not line.strip():
        return Skip(BLANK_LINE, "empty line")
    try:
        obj = json.loads(line)
    except UnicodeDecodeError as e:
        return Skip(INVALID_UTF8, str(e))
    except ValueError as e:
        return Skip(BAD_JSON, str(e))
    except RecursionError:  # json's parser recurses once per level of nesting
        return Skip(BAD_JSON, "nested too deeply for Python's JSON parser")
    if not isinstance(obj, dict):
        return Skip(BAD_JSON, f"a JSON {type(obj).__name__}, not an object")
    text = obj.get(field)
    if not isinstance(text, str):
        why = f"no {field!r} field" if field not in obj else f"{field!r} is {type(text).__name__}"
        return Skip(MISSING_TEXT, why)
    if not text or text.isspace():
        return Skip(EMPTY, "empty text")
    return text


def read_jsonl(path: Path, field: str = "text", start: int = 0,
               position: ReadPosition | None = None) -> Iterator[tuple[int, object]]:
    """Documents from line `start` + 1 on (the first `start` lines are read and passed over)."""
    line_no = 0
    try:
        for line_no, line in enumerate(_raw_lines(path, position or ReadPosition()), start=1):
            if line_no > start:
                yield line_no, _document(line.rstrip(b"\r\n"), field)
    except (EOFError, Truncated) as e:
        yield line_no + 1, Skip(TRUNCATED_FILE, f"file ends mid-stream ({e})")
    except (OSError, zlib.error, zstandard.ZstdError) as e:
        yield line_no + 1, Skip(CORRUPT_FILE, f"unreadable ({type(e).__name__}: {e})")


