import gzip
import json

import pytest
import zstandard

from conftest import write_jsonl, write_parquet
from longpack.pipeline.read.jsonl import read_jsonl
from longpack.pipeline.read.parquet import read_parquet
from longpack.pipeline.read.records import (
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


def _damage_row_group(path, group: int, checksums: bool):
    """Write 40 rows in 4 groups of 10 and overwrite bytes inside `group`'s text pages."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)  # incompressible text, so the pages are mostly the text itself
    texts = [f"row {i} " + "".join(rng.choices("abcdefghij", k=2000)) for i in range(40)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=10,
                   compression="none" if checksums else "gzip", write_page_checksum=checksums,
                   use_dictionary=False)
    column = pq.ParquetFile(path).metadata.row_group(group).column(0)
    middle = column.data_page_offset + column.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    # With checksums one flipped byte is caught; without, only damage that breaks decoding.
    data[middle:middle + (1 if checksums else 400)] = b"\xff" * (1 if checksums else 400)
    path.write_bytes(bytes(data))
    return texts


@pytest.mark.parametrize("checksums", [False, True])
def test_a_damaged_row_group_loses_only_its_own_rows(tmp_path, checksums):
    texts = _damage_row_group(tmp_path / "a.parquet", 2, checksums)
    got = list(read_parquet(tmp_path / "a.parquet"))
    assert [v for _, v in got if isinstance(v, str)] == texts[:20] + texts[30:]
    (n, skip), = [(n, v) for n, v in got if isinstance(v, Skip)]
    # Numbered at the group's last row, so a resume cursor taken after it passes the group.
    assert (n, skip.reason, skip.records) == (30, CORRUPT_FILE, 10)
    assert "row group 2" in skip.detail
    # Resuming inside the damaged group counts only the rows not read before.
    resumed = list(read_parquet(tmp_path / "a.parquet", start=25))
    assert [(n, v.records) for n, v in resumed if isinstance(v, Skip)] == [(30, 5)]
    assert [v for _, v in resumed if isinstance(v, str)] == texts[30:]


def test_a_damaged_row_group_in_a_build_is_counted_and_the_rest_is_built(tmp_path,
                                                                          byte_tokenizer):
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    texts = _damage_row_group(tmp_path / "a.parquet", 1, checksums=True)
    m = build(BuildConfig(out=str(tmp_path / "out"), dataset="parquet",
                          inputs=(str(tmp_path / "a.parquet"),), tokenizer=byte_tokenizer,
                          seq=4096, val_fraction=0.0), show_progress=False)
    assert m["counts"]["documents"] == 30 and m["counts"]["skipped"]["corrupt_file"] == 10
    assert m["counts"]["records_read"] == 40
    assert m["counts"]["tokens"] == sum(len(t) + 1 for t in texts[:10] + texts[20:])


@pytest.mark.parametrize("column", ["dictionary", "string_view", "large_string", "binary_view"])
def test_any_string_like_arrow_type_is_read_as_text(tmp_path, column):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["alpha", "beta", "alpha", None, "δέλτα"]
    array = {"dictionary": pa.array(texts).dictionary_encode(),
             "string_view": pa.array(texts, pa.string_view()),
             "large_string": pa.array(texts, pa.large_string()),
             "binary_view": pa.array([t and t.encode() for t in texts], pa.binary_view())}[column]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": array}), path)
    got = reasons(read_parquet(path))
    assert got == [(1, "alpha"), (2, "beta"), (3, "alpha"), (4, MISSING_TEXT), (5, "δέλτα")]


def test_json_with_lone_surrogate_reaches_encode_as_text(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": "a\ud800b"}).encode()])
    (n, text), = list(read_jsonl(path))
    assert text == "a\ud800b"  # tokenize/encode.py turns this into an INVALID_UTF8 skip


def test_a_deeply_nested_json_line_is_a_bad_json_skip_and_the_next_line_is_read(tmp_path):
    deep = b'{"text": "x", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "before"}, deep, {"text": "after"}])
    got = reasons(read_jsonl(path))
    assert got == [(1, "before"), (2, BAD_JSON), (3, "after")]


def test_a_broken_symlink_in_an_input_folder_is_counted_and_logged(tmp_path, byte_tokenizer):
    from longpack.core.errors import SettingsError
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"text": "alpha"}, {"text": "beta"}])
    (corpus / "b.jsonl").symlink_to(tmp_path / "gone.jsonl")
    (corpus / "notes.txt").symlink_to(tmp_path / "gone.txt")  # not a document file: not counted

    def run(inputs, out="out"):
        return build(BuildConfig(out=str(tmp_path / out), dataset="jsonl", inputs=inputs,
                                 tokenizer=byte_tokenizer, seq=16, val_fraction=0.0),
                     show_progress=False)

    m = run((str(corpus),))
    assert m["counts"]["skipped"]["broken_link"] == 1 and m["counts"]["documents"] == 2
    assert [i.get("broken_link") for i in m["inputs"]] == [None, str(tmp_path / "gone.jsonl")]
    (logged,) = [json.loads(x) for x in (tmp_path / "out/skipped.jsonl").read_text().splitlines()]
    assert logged["file"] == str(corpus / "b.jsonl") and logged["reason"] == "broken_link"
    assert "gone.jsonl" in logged["detail"]
    # Named directly, a broken link is a missing file: an error, as for any missing path.
    with pytest.raises(SettingsError, match="b.jsonl: no such file"):
        run((str(corpus / "b.jsonl"),), "out2")
    # Mending the link changes the inputs: the re-run is refused, not mixed into the old build.
    write_jsonl(tmp_path / "gone.jsonl", [{"text": "gamma"}])
    with pytest.raises(SettingsError, match="inputs changed"):
        run((str(corpus),))


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz", "d.jsonl.zst", "d.parquet"])
def test_batches_report_how_far_into_their_file_they_are(tmp_path, monkeypatch, name):
    """Progress moves within one big file: each batch says how many of the file's stored bytes
    were read, rising to the file's size at its end."""
    import numpy as np

    import longpack.pipeline.read.batches as batches_mod
    import longpack.pipeline.read.inputs as inputs
    from conftest import make_texts

    monkeypatch.setattr(batches_mod, "BATCH_DOCS", 50)
    monkeypatch.setattr("longpack.pipeline.read.jsonl.CHUNK", 1 << 14)  # zstd is read a chunk at a time
    rng = np.random.default_rng(0)  # text that does not compress away: stored bytes track reading
    texts = [t + " " + rng.bytes(300).hex() for t in make_texts(1000)]
    path = tmp_path / name
    if name.endswith(".parquet"):
        write_parquet(path, texts)
    else:
        compress = {"gz": "gz", "zst": "zst"}.get(name.rsplit(".", 1)[-1])
        write_jsonl(path, [{"text": t} for t in texts], compress)
    files = inputs.InputFiles([path])
    batches = list(batches_mod.read_batches(files, "text", (0, 0)))
    positions = [b.bytes_read for b in batches]
    size = path.stat().st_size
    assert len(batches) >= 20 and positions[-1] == size and batches[-1].file_done
    assert positions == sorted(positions)
    halfway = positions[len(positions) // 2]
    assert 0.3 * size < halfway < 0.7 * size


def test_read_ahead_gives_the_same_batches_raises_where_reading_failed_and_stops_when_closed():
    import threading

    from longpack.pipeline.read.batches import read_ahead

    def source(fail_at=None):
        for i in range(50):
            if i == fail_at:
                raise OSError(f"disk gone at batch {i}")
            yield i

    assert list(read_ahead(source(), depth=3)) == list(range(50))
    got = []
    with pytest.raises(OSError, match="disk gone at batch 7"):
        for batch in read_ahead(source(fail_at=7), depth=3):
            got.append(batch)
    assert got == list(range(7))  # every batch before the failure, none after
    early = read_ahead(source(), depth=2)
    assert [next(early), next(early)] == [0, 1]
    early.close()  # the build stops early (--max-tokens, an error): the reader thread ends
    assert not [t for t in threading.enumerate() if t.name == "read"]
