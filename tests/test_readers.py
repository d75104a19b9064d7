import gzip
import json

import pytest
import zstandard

from conftest import write_jsonl, write_parquet
from pipeline.read_jsonl import read_jsonl
from pipeline.read_parquet import read_parquet
from pipeline.records import (
    BAD_JSON,
    BLANK_LINE,
    CORRUPT_FILE,
    EMPTY,
    INVALID_UTF8,
    MISSING_TEXT,
    TRUNCATED_FILE,
    Skip,
)


def reasons(items):
    return [(n, v.reason) if isinstance(v, Skip) else (n, v) for n, v in items]


BAD_LINES = [
    {"text": "first"},
    b'{"text": "broken',
    b'{"text": "caf\xe9"}',
    {"id": 3},
    {"text": None},
    {"text": "   "},
    b"",
    [1, 2],
    {"text": "last"},
]


@pytest.mark.parametrize("compress", [None, "gz", "zst"])
def test_each_bad_line_is_a_counted_skip_with_its_line_number(tmp_path, compress):
    path = write_jsonl(tmp_path / f"docs.jsonl.{compress or 'x'}", BAD_LINES, compress)
    if compress is None:
        path = path.rename(tmp_path / "docs.jsonl")
    assert reasons(read_jsonl(path)) == [
        (1, "first"), (2, BAD_JSON), (3, INVALID_UTF8), (4, MISSING_TEXT), (5, MISSING_TEXT),
        (6, EMPTY), (7, BLANK_LINE), (8, BAD_JSON), (9, "last")]


def test_resume_start_skips_lines_already_read(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl.gz", [{"text": f"t{i}"} for i in range(10)], "gz")
    assert reasons(read_jsonl(path, start=7)) == [(8, "t7"), (9, "t8"), (10, "t9")]


def test_custom_text_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"body": "x"}, {"text": "y"}])
    assert reasons(read_jsonl(path, field="body")) == [(1, "x"), (2, MISSING_TEXT)]


@pytest.mark.parametrize("compress", ["gz", "zst"])
def test_truncated_compressed_file_keeps_complete_lines_then_reports(tmp_path, compress):
    records = [{"text": f"document number {i} " * 50} for i in range(200)]
    path = write_jsonl(tmp_path / f"d.jsonl.{compress}", records, compress)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    got = list(read_jsonl(path))
    assert isinstance(got[-1][1], Skip) and got[-1][1].reason == TRUNCATED_FILE
    texts = [v for _, v in got if isinstance(v, str)]
    assert 0 < len(texts) < 200
    assert texts == [r["text"] for r in records[: len(texts)]]


def test_multi_frame_zstd_is_read_across_frames(tmp_path):
    a = zstandard.ZstdCompressor().compress(b'{"text": "one"}\n')
    b = zstandard.ZstdCompressor().compress(b'{"text": "two"}\n')
    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(a + b)
    assert reasons(read_jsonl(path)) == [(1, "one"), (2, "two")]


def test_multi_member_gzip_is_read_whole(tmp_path):
    path = tmp_path / "d.json.gz"
    path.write_bytes(gzip.compress(b'{"text": "one"}\n') + gzip.compress(b'{"text": "two"}'))
    assert reasons(read_jsonl(path)) == [(1, "one"), (2, "two")]


def test_garbage_gzip_is_a_corrupt_file(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    (n, skip), = list(read_jsonl(path))
    assert skip.reason in (CORRUPT_FILE, TRUNCATED_FILE)


def test_parquet_rows_nulls_and_empties(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", ["a", None, "", "d", "e"], row_group_size=2)
    assert reasons(read_parquet(path)) == [(1, "a"), (2, MISSING_TEXT), (3, EMPTY), (4, "d"),
                                           (5, "e")]
    assert reasons(read_parquet(path, start=3)) == [(4, "d"), (5, "e")]


def test_parquet_without_the_text_column_counts_every_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"body": ["x", "y", "z"]}), path)
    (n, skip), = list(read_parquet(path))
    assert skip.reason == MISSING_TEXT and skip.records == 3 and "'text'" in skip.detail


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "a.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    (n, skip), = list(read_parquet(path))
    assert skip.reason == CORRUPT_FILE


def test_parquet_with_a_damaged_row_group_keeps_the_rows_before_it(tmp_path):
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)  # incompressible text, so the middle of the file is page data
    texts = [f"row {i} " + "".join(rng.choices("abcdefghij", k=2000)) for i in range(40)]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=10, compression="gzip")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 400] = b"\xff" * 400  # inside the data pages, footer intact
    path.write_bytes(bytes(data))
    got = list(read_parquet(path))
    good = [v for _, v in got if isinstance(v, str)]
    skips = [v for _, v in got if isinstance(v, Skip)]
    assert good == texts[: len(good)] and len(good) < 40
    assert [s.reason for s in skips] == [CORRUPT_FILE]
    assert skips[0].records == 40 - len(good)


def test_json_with_lone_surrogate_reaches_encode_as_text(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": "a\ud800b"}).encode()])
    (n, text), = list(read_jsonl(path))
    assert text == "a\ud800b"  # encode.py turns this into an INVALID_UTF8 skip


def test_a_deeply_nested_json_line_is_a_bad_json_skip_and_the_next_line_is_read(tmp_path):
    deep = b'{"text": "x", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "before"}, deep, {"text": "after"}])
    got = reasons(read_jsonl(path))
    assert got == [(1, "before"), (2, BAD_JSON), (3, "after")]
