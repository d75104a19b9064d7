"""What readers yield: a document's text, or a counted reason it was skipped.

Every skip has one of the reasons below; build.py counts them per reason into the manifest and
logs each with its file and line/row to OUT/skipped.jsonl. Nothing is dropped without one.
A truncated or corrupt compressed JSON-lines file, and a broken symlink among the inputs, count
one record: how many documents the lost remainder held cannot be known.
"""

import os
from dataclasses import dataclass
from pathlib import Path

BAD_JSON = "bad_json"  # a line that is not a JSON object
INVALID_UTF8 = "invalid_utf8"  # bytes that are not UTF-8, or lone surrogates in the text
MISSING_TEXT = "missing_text"  # no text field, or it is not a string
EMPTY = "empty"  # text is empty or only whitespace
BLANK_LINE = "blank_line"  # an empty line between JSON lines
TRUNCATED_FILE = "truncated_file"  # a .gz/.zst that ends mid-stream: the rest of the file is lost
CORRUPT_FILE = "corrupt_file"  # unreadable compression or parquet data: the rest of the file is lost
BROKEN_LINK = "broken_link"  # a symlink found in an --input folder or glob whose target is gone
UNENCODABLE = "unencodable"  # text that every tokenizer engine failed on (none known to date)
REASONS = (BAD_JSON, INVALID_UTF8, MISSING_TEXT, EMPTY, BLANK_LINE, TRUNCATED_FILE, CORRUPT_FILE,
           BROKEN_LINK, UNENCODABLE)


@dataclass(frozen=True)
class Skip:
    reason: str
    detail: str
    records: int = 1  # input records this skip stands for (a corrupt parquet row group: its rows)


@dataclass
class ReadPosition:
    """How far a reader has got into its file, for progress: bytes of the file as stored
    (compressed bytes for .gz/.zst; for parquet, the share of rows read times the file size)."""

    bytes: int = 0


def is_broken_link(path) -> bool:
    """A symlink whose target is gone: read as one BROKEN_LINK skip, never silently lost."""
    return isinstance(path, (str, Path)) and os.path.islink(path) and not os.path.exists(path)
