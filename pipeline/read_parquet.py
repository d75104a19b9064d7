"""Read parquet documents (FineWeb, FineWeb-Edu): one column, one record batch at a time.

Yields (n, text | Skip) where n counts the rows read so far (row index + 1), as read_jsonl's
line numbers do. Resuming at row `start` skips whole
row groups from the footer metadata without decoding them. A file whose footer or a row group
cannot be decoded yields one CORRUPT_FILE skip that counts the rows it loses.
"""

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.records import CORRUPT_FILE, EMPTY, INVALID_UTF8, MISSING_TEXT, Skip

BATCH_ROWS = 1024


def _texts(column: pa.Array) -> list:
    """Python values of one batch; invalid UTF-8 affects only its own rows."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        try:
            return column.to_pylist()
        except UnicodeDecodeError:
            column = column.cast(pa.large_binary())
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        out = []
        for raw in column.to_pylist():
            try:
                out.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                out.append(Skip(INVALID_UTF8, str(e)))
        return out
    return [Skip(MISSING_TEXT, f"column type is {column.type}, not string")] * len(column)


def read_parquet(path: Path, field: str = "text", start: int = 0) -> Iterator[tuple[int, object]]:
    try:
        pf = pq.ParquetFile(path)
        total = pf.metadata.num_rows
    except Exception as e:  # ArrowInvalid, OSError: not parquet, truncated footer
        yield start + 1, Skip(CORRUPT_FILE, f"not a readable parquet file ({e})")
        return
    if field not in pf.schema_arrow.names:
        yield max(total, start + 1), Skip(
            MISSING_TEXT, f"no {field!r} column (has: {pf.schema_arrow.names})",
            records=max(total - start, 1))
        return
    groups, first_row, row = [], 0, 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if row + n > start:
            if not groups:
                first_row = row
            groups.append(g)
        row += n
    row = first_row
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=[field],
                                     use_threads=False):
            for value in _texts(batch.column(0)):
                if row >= start:
                    if value is None:
                        value = Skip(MISSING_TEXT, f"{field!r} is null")
                    elif isinstance(value, str) and (not value or value.isspace()):
                        value = Skip(EMPTY, "empty text")
                    yield row + 1, value
                row += 1
    except Exception as e:  # ArrowInvalid/OSError from a damaged page or row group
        yield row + 1, Skip(CORRUPT_FILE, f"unreadable from row {row} on ({type(e).__name__}: "
                            f"{e})", records=max(total - row, 1))
