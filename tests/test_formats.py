"""The shard formats (pipeline/formats/__init__.py): each one writes shards and an index that it reads
back, records every file with its size and sha256 in one shape whatever its index schema, and
the writer, the manifest and the readers go through them (a format added in a test is built
and read with no other change)."""

import hashlib
import json

import numpy as np
import pytest

from conftest import make_texts, write_jsonl
from longpack.core.errors import SettingsError
from longpack.pipeline.formats import FORMATS, get_format, open_format
from longpack.pipeline.formats.shards import open_split

SEQ = 16


def rows_and_segments(n: int, seed: int):
    """n rows of SEQ uint16 tokens and their segments (row, start, hash), sorted by row then
    start, a segment at offset 0 of each row."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 60000, (n, SEQ)).astype(np.uint16)
    segments = [[r, 0, 1000 + r] for r in range(n)] + [[r, 5, 7] for r in range(0, n, 2)]
    return rows, np.array(sorted(segments), np.uint64)


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_format_reads_back_what_it_wrote_and_records_each_files_size_and_sha256(tmp_path,
                                                                                  name):
    writer = get_format(name).for_writing(tmp_path, SEQ, np.uint16, None, 1 << 20)
    parts = [rows_and_segments(n, seed) for seed, n in enumerate((5, 1, 3))]
    entries = []
    for number, (rows, segments) in enumerate(parts):
        files, entry = writer.encode_shard(number, rows, segments)
        for basename, data in files.items():
            (tmp_path / basename).write_bytes(data)
        entries.append(entry)
    (tmp_path / "index.json").write_text(json.dumps(writer.index_json(entries)))

    shards = open_format(tmp_path)
    assert type(shards) is get_format(name) and len(shards) == len(parts)
    on_disk = {p.name for p in tmp_path.iterdir()} - {"index.json"}
    assert {f.basename for i in range(len(shards)) for f in shards.stored(i)} == on_disk
    for i, (rows, segments) in enumerate(parts):
        assert shards.rows_in(i) == len(rows)
        for f in shards.stored(i):
            data = (tmp_path / f.basename).read_bytes()
            assert (f.bytes, f.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        shard = shards.read_shard(i)
        assert np.array_equal(shard.tokens, rows) and np.array_equal(shard.segments, segments)
        blocks = shards.read_blocks(i, 2 * SEQ * 2)
        got = np.concatenate([b.copy() for _, b in blocks.blocks])
        assert np.array_equal(got, rows) and np.array_equal(blocks.segments, segments)


def test_an_unknown_format_name_lists_the_known_ones():
    with pytest.raises(SettingsError, match="unknown shard format 'parquet' .one of: mds, memmap"):
        get_format("parquet")


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_manifest_counts_the_bytes_and_rows_its_format_records(tmp_path, byte_tokenizer,
                                                                   fmt):
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(60, seed=3)])
    build(BuildConfig(out=str(tmp_path / "out"), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=byte_tokenizer, seq=64, format=fmt, val_fraction=0.2,
                      shard_bytes=64 * 2 * 8), show_progress=False)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    for split in ("train", "val"):
        folder = tmp_path / "out" / split
        files = [p for p in folder.iterdir() if p.name != "index.json"]
        got = manifest["splits"][split]
        assert got["bytes"] == sum(p.stat().st_size for p in files)
        assert got["rows"] == sum(len(row) for row, _, _ in open_split(folder).rows()) // 64
        assert got["shards"] == len(open_format(folder))


class RawFormat(get_format("memmap")):
    """A format of the test's own: tokens as raw bytes with no .npy header, segments as .npy."""

    name = "raw"
    entry_keys = ("rows", "tokens", "docs", "raw")

    @classmethod
    def claims(cls, index):
        return index.get("format") == "raw-test"

    def encode_shard(self, number, rows, segments):
        files, entry = super().encode_shard(number, rows, segments)
        files[entry["tokens"]["basename"]] = rows.astype("<u2").tobytes()
        entry["tokens"]["bytes"] = rows.nbytes
        entry["tokens"]["sha256"] = hashlib.sha256(rows.tobytes()).hexdigest()
        return files, {**entry, "raw": True}

    def index_json(self, entries):
        return {**super().index_json(entries), "format": "raw-test"}

    def _read(self, i, load):
        def raw_tokens(path):
            if path.name.endswith(".tokens.npy"):
                return np.fromfile(path, "<u2").reshape(-1, self.index["seq"])
            return load(path)

        return super()._read(i, raw_tokens)


def test_a_format_added_in_one_class_is_built_read_and_counted(tmp_path, byte_tokenizer,
                                                               monkeypatch):
    """ShardSink, the manifest and the reader find a new format by its name and its index: one
    registry line (formats.FORMATS), no other code changes."""
    from longpack.pipeline import formats
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    monkeypatch.setitem(formats.FORMATS, "raw", RawFormat)
    texts = make_texts(40, seed=9)
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    build(BuildConfig(out=str(tmp_path / "out"), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=byte_tokenizer, seq=64, format="raw", compression="none",
                      val_fraction=0.0, shard_bytes=64 * 2 * 4, packing="concat"),
          show_progress=False)  # concat: the rows are the documents in input order, below
    train = tmp_path / "out" / "train"
    assert type(open_format(train)) is RawFormat
    tokens = np.concatenate([row for row, _, _ in open_split(train).rows()])
    ids = np.concatenate([[*t.encode(), 50256] for t in texts])  # byte tokenizer, EOS after each
    assert np.array_equal(tokens[:len(ids)], ids)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["bytes"] == sum(p.stat().st_size for p in train.iterdir()
                                                       if p.name != "index.json")


def test_the_format_flag_offers_exactly_the_registered_formats():
    from longpack.pipeline.cli import pack

    for command in ("build", "import"):
        option = next(o for o in pack.commands[command].params if o.name == "format")
        assert list(option.type.choices) == list(FORMATS), command
