"""Read parquet documents (FineWeb, FineWeb-Edu): one column, one record batch at a time.

Yields (n, text | Skip) where n counts the rows read so far (row index + 1), as read_jsonl's
line numbers do. Resuming at row `start` skips whole row groups from the footer metadata without
decoding them. The text column may be any string-like Arrow type (string, large_string,
string_view, a dictionary of strings, or binary holding UTF-8).

Damage is contained to the row group it is in: groups are read one by one, and a group that
cannot be decoded (a bad page, a failed page checksum where the writer stored checksums) yields
one CORRUPT_FILE skip counting the rows of that group it loses, numbered at the group's last row
so that the resume cursor passes the whole group; the next group is read as usual. A file whose
footer cannot be read yields one skip for the whole file. A file at a URL (remote_inputs.py)
is read through its file object by range: footer, then each row group's column; a failure of
the store is no damage of the file and stops the build (StorageError), never a skip.
"""

import contextlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from longpack.core import StorageError
from longpack.pipeline.read.records import (
    CORRUPT_FILE,
    EMPTY,
    INVALID_UTF8,
    MISSING_TEXT,
    ReadPosition,
    Skip,
)

BATCH_ROWS = 1024
_STRINGS = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
_BINARIES = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view,
             pa.types.is_fixed_size_binary)


def _texts(column: pa.Array) -> list:
    """Python values of one batch; invalid UTF-8 affects only its own rows."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if any(is_type(column.type) for is_type in _STRINGS):
        try:
            return column.to_pylist()
        except UnicodeDecodeError:
            column = column.cast(pa.large_binary())
    if any(is_type(column.type) for is_type in _BINARIES):
        out = []
        for raw in column.to_pylist():
            try:
                out.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                out.append(Skip(INVALID_UTF8, str(e)))
        return out
    return [Skip(MISSING_TEXT, f"column type is {column.type}, not string")] * len(column)


def _value(value, field: str):
    if value is None:
        return Skip(MISSING_TEXT, f"{field!r} is null")
    if isinstance(value, str) and (not value or value.isspace()):
        return Skip(EMPTY, "empty text")
    return value


@contextlib.contextmanager
def parquet_file(source):
    """A pq.ParquetFile over a local path, or over a RemoteInput's file object (closed after)."""
    f = source.open("rb") if hasattr(source, "url") else None
    try:
        # Page checksums are verified where the writer stored them (pyarrow's
        # write_page_checksum, parquet-mr's): a flipped byte is then a counted skip, not text.
        yield pq.ParquetFile(source if f is None else f, page_checksum_verification=True)
    finally:
        if f is not None:
            f.close()


def read_parquet(path, field: str = "text", start: int = 0,
                 position: ReadPosition | None = None) -> Iterator[tuple[int, object]]:
    """`path`: a local Path or a RemoteInput."""
    with contextlib.ExitStack() as stack:
        try:
            pf = stack.enter_context(parquet_file(path))
            total = pf.metadata.num_rows
        except StorageError:
            raise
        except Exception as e:  # ArrowInvalid, OSError: not parquet, truncated footer
            yield start + 1, Skip(CORRUPT_FILE, f"not a readable parquet file ({e})")
            return
        yield from _read_file(pf, path, total, field, start, position)


def _read_file(pf: pq.ParquetFile, path, total: int, field: str, start: int,
               position: ReadPosition | None) -> Iterator[tuple[int, object]]:
    if field not in pf.schema_arrow.names:
        yield max(total, start + 1), Skip(
            MISSING_TEXT, f"no {field!r} column (has: {pf.schema_arrow.names})",
            records=max(total - start, 1))
        return
    position = position or ReadPosition()
    bytes_per_row = path.stat().st_size / max(total, 1)
    first = 0
    for g in range(pf.metadata.num_row_groups):
        end = first + pf.metadata.row_group(g).num_rows
        if end > start:
            yield from _read_group(pf, g, field, first, end, start, position, bytes_per_row)
        first = end


def _read_group(pf: pq.ParquetFile, g: int, field: str, first: int, end: int, start: int,
                position: ReadPosition, bytes_per_row: float) -> Iterator[tuple[int, object]]:
    """Rows [max(first, start), end) of row group g, which holds rows [first, end)."""
    row = first
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=[field],
                                     use_threads=False):
            position.bytes = int((row + batch.num_rows) * bytes_per_row)
            for value in _texts(batch.column(0)):
                if row >= start:
                    yield row + 1, _value(value, field)
                row += 1
    except StorageError:
        raise
    except Exception as e:  # ArrowInvalid/OSError from a damaged page or row group
        lost_from = max(row, start)
        yield end, Skip(CORRUPT_FILE, f"row group {g} unreadable from row {lost_from} to "
                        f"{end - 1} ({type(e).__name__}: {e})", records=end - lost_from)
