"""pack import's splits: a source's val split is read from its names (nanoGPT's train.bin and
val.bin, llm.c's *_val_*.bin, llm-foundry's train/ and val/), never mixed into train; a file
whose split cannot be told (a test split, a loose file beside named ones) is refused in one
line; --val-fraction gives a source without val a hash split of whole documents (whole rows
without --eos-id), the same bytes on every run."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_import import EOS, documents, rows_of, run
from test_import_hostile import refused

from longpack.core.errors import SettingsError
from longpack.pipeline.adopt.config import ImportConfig
from longpack.pipeline.cli import pack
from longpack.training.cli import train as train_cli


def manifest_of(out) -> dict:
    return json.loads((out / "manifest.json").read_text())


def stream_of(out, split) -> np.ndarray:
    """A split's tokens in order, its padding cut off (manifest: tokens are the real ones)."""
    real = manifest_of(out)["splits"][split]["tokens"]
    return rows_of(out, split).reshape(-1)[:real]


def docs_of(tokens: np.ndarray) -> list[tuple]:
    """The documents of a token stream: cut after each EOS (the last may have none)."""
    ends = np.flatnonzero(tokens == EOS) + 1
    return [tuple(d) for d in np.split(tokens, ends) if len(d)]


def tree_bytes(out) -> dict:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def nanogpt_folder(tmp_path, rng, names=("train.bin", "val.bin"), sizes=(40, 9), seq=64):
    src = tmp_path / "owt"
    src.mkdir()
    flats = {}
    for name, n in zip(names, sizes):
        flat = documents(rng, n, seq).reshape(-1)
        flats[name] = np.concatenate([flat, flat[:5]])  # and a tail shorter than a row
        flats[name].tofile(src / name)
    return src, flats


# -- splits by name --------------------------------------------------------------------------

@pytest.mark.parametrize("names", [("train.bin", "val.bin"),  # nanoGPT
                                   pytest.param(("shakespeare_train_000001.bin",  # llm.c
                                                 "shakespeare_val_000000.bin"),
                                                marks=pytest.mark.slow),
                                   pytest.param(("train.bin", "valid.bin"),  # fairseq
                                                marks=pytest.mark.slow)])
@pytest.mark.slow
def test_a_nanogpt_folder_gives_its_train_and_val_splits(tmp_path, byte_tokenizer, names):
    src, flats = nanogpt_folder(tmp_path, np.random.default_rng(3), names)
    out = tmp_path / "out"
    code, text = run("import", src, "--out", out, "--seq", 64, "--dtype", "uint16",
                     "--tokenizer", byte_tokenizer, "--quiet")
    assert code == 0, text
    train, val = (flats[n][: len(flats[n]) // 64 * 64].reshape(-1, 64) for n in names)
    assert np.array_equal(rows_of(out, "train"), train)
    assert np.array_equal(rows_of(out, "val"), val)  # and none of it in train
    m = manifest_of(out)
    assert (m["splits"]["train"]["rows"], m["splits"]["val"]["rows"]) == (40, 9)
    assert [(i["path"].rsplit("/", 1)[-1], i["split"]) for i in m["inputs"]] == [
        (names[0], "train"), (names[1], "val")]
    assert m["counts"]["skipped"] == {"partial_row": 2}
    code, text = run("stats", out, "--verify")
    assert code == 0, text
    result = CliRunner().invoke(train_cli, ["--shards", str(out), "--out", str(tmp_path / "dry"),
                                            "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "no val rows" not in result.output


def test_split_folders_by_name_and_an_mds_dataset_in_each(tmp_path, byte_tokenizer):
    """llm-foundry writes train_small/ and val_small/ too; a longpack memmap split is a folder
    with index.json, read whole (its docs.npy is no rows)."""
    rng = np.random.default_rng(4)
    src = tmp_path / "c4"
    (src / "train_small").mkdir(parents=True)
    (src / "val_small").mkdir()
    train = [documents(rng, 12, 32), documents(rng, 7, 32)]
    np.save(src / "train_small" / "00.npy", train[0])
    np.save(src / "train_small" / "01.npy", train[1])
    memmap = tmp_path / "m"
    code, text = run("import", src / "train_small", "--out", memmap, "--format", "memmap",
                     "--eos-id", EOS, "--quiet")
    assert code == 0, text
    (memmap / "train").rename(src / "val_small" / "part")  # a dataset folder: index.json
    out = tmp_path / "out"
    code, text = run("import", src, "--out", out, "--tokenizer", byte_tokenizer, "--quiet")
    assert code == 0, text
    assert np.array_equal(rows_of(out, "train"), np.concatenate(train))
    assert np.array_equal(rows_of(out, "val"), np.concatenate(train))
    code, text = run("stats", out, "--verify")
    assert code == 0, text


@pytest.mark.parametrize("layout,says", [
    ({"train.bin": 1, "val.bin": 1, "test.bin": 1}, ["test.bin", "names a test split", "val"]),
    ({"train/a.npy": 1, "val/b.npy": 1, "extra.npy": 1},
     ["extra.npy names no split", "1 file", "train/a.npy"]),
    ({"train/a.npy": 1, "notes/b.npy": 1, "c.npy": 1},
     ["c.npy names no split", "2 files"]),
    ({"train.bin": 1, "val.bin": 1, "all.bin": 1}, ["all.bin names no split"]),
    ({"train/a.npy": 1, "train/val_x.npy": 1}, ["train/val_x.npy", "names both train and val"]),
    ({"train/a.npy": 1, "validation/b.npy": 1, "test/c.npy": 1}, ["test/c.npy"]),
])
def test_a_file_whose_split_cannot_be_told_is_refused(tmp_path, layout, says):
    """Today these went into train (test.bin, all.bin: the val data again) or were left out
    without a word (a loose file beside train/ and val/)."""
    src = tmp_path / "src"
    for name in layout:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".bin"):
            np.zeros(64, np.uint16).tofile(src / name)
        else:
            np.save(src / name, np.zeros((2, 8), np.int32))
    refused(tmp_path, src, "--seq", 8, "--dtype", "uint16", says=says)
    assert not (tmp_path / "out").exists()


def test_a_val_named_source_alone_is_train_and_says_so(tmp_path):
    np.save(tmp_path / "val.npy", np.arange(16, dtype=np.int32).reshape(2, 8))
    result = CliRunner().invoke(pack, ["import", str(tmp_path / "val.npy"), "--out",
                                       str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "val.npy's name says val data, but it is the whole source: imported as the train " \
           "split" in result.output
    assert list(manifest_of(tmp_path / "o")["splits"]) == ["train"]


# -- --val-fraction ---------------------------------------------------------------------------

def packed_source(tmp_path, rng, n_rows=300, seq=64):
    src = tmp_path / "src"
    src.mkdir()
    rows = documents(rng, n_rows, seq)
    np.save(src / "a.npy", rows[: n_rows // 2])
    np.save(src / "b.npy", rows[n_rows // 2:])
    return src, rows


@pytest.mark.slow
def test_val_fraction_moves_whole_documents_the_same_way_every_time(tmp_path, byte_tokenizer):
    src, rows = packed_source(tmp_path, np.random.default_rng(5))
    flags = ["--tokenizer", byte_tokenizer, "--val-fraction", 0.1, "--shard-bytes", 64 * 2 * 32]
    outs = [tmp_path / "one", tmp_path / "two"]
    for out in outs:
        code, text = run("import", src, "--out", out, *flags, "--quiet")
        assert code == 0, text
    assert tree_bytes(outs[0]) == tree_bytes(outs[1])  # shards, indexes, skipped.jsonl
    out = outs[0]
    m = manifest_of(out)
    assert m["settings"]["val_fraction"] == 0.1 and m["settings"]["seed"] == 0
    assert m["fingerprint"]["import"]["val_fraction"] == 0.1
    source_docs = docs_of(rows.reshape(-1))
    train, val = docs_of(stream_of(out, "train")), docs_of(stream_of(out, "val"))
    assert sorted(train + val) == sorted(source_docs)  # each document whole, in one split
    assert not set(train) & set(val)
    assert train == [d for d in source_docs if d in set(train)]  # the source's order kept
    assert 0.03 < len(val) / len(source_docs) < 0.2
    for name, docs in (("train", train), ("val", val)):
        s = m["splits"][name]
        assert s["documents"] == sum(d[-1] == EOS for d in docs)
        assert s["tokens"] + s["padding_tokens"] == s["rows"] * 64 == s["row_tokens"]
        assert s["tokens"] == sum(map(len, docs)) and s["padding_tokens"] < 64
    assert m["counts"]["tokens"] == rows.size
    code, text = run("stats", out, "--verify")
    assert code == 0, text
    result = CliRunner().invoke(train_cli, ["--shards", str(out), "--out", str(tmp_path / "dry"),
                                            "--dry-run"])
    assert result.exit_code == 0, result.output
    code, _ = run("import", src, "--out", tmp_path / "seed1", *flags, "--seed", 1, "--quiet")
    assert code == 0
    assert docs_of(stream_of(tmp_path / "seed1", "val")) != val  # the seed draws another split


def test_val_fraction_without_an_eos_id_moves_rows_and_says_what_that_cuts(tmp_path):
    src, rows = packed_source(tmp_path, np.random.default_rng(6), n_rows=400)
    out = tmp_path / "out"
    result = CliRunner().invoke(pack, ["import", str(src), "--out", str(out),
                                       "--val-fraction", "0.25"])
    assert result.exit_code == 0, result.output
    assert "without --eos-id each row is a document" in result.output
    train, val = rows_of(out, "train"), rows_of(out, "val")
    assert sorted(map(tuple, np.concatenate([train, val]))) == sorted(map(tuple, rows))
    assert not set(map(tuple, train)) & set(map(tuple, val))
    assert 0.15 < len(val) / len(rows) < 0.35
    m = manifest_of(out)
    assert m["splits"]["val"]["rows"] == len(val) and m["splits"]["val"]["padding_tokens"] == 0
    again = tmp_path / "again"
    assert run("import", src, "--out", again, "--val-fraction", 0.25, "--quiet")[0] == 0
    assert tree_bytes(out) == tree_bytes(again)
    code, text = run("stats", out, "--verify")
    assert code == 0, text


def test_val_fraction_is_refused_where_the_source_has_val_and_out_of_range(tmp_path):
    src, _ = nanogpt_folder(tmp_path, np.random.default_rng(7))
    refused(tmp_path, src, "--seq", 64, "--dtype", "uint16", "--val-fraction", 0.1,
            says=["--val-fraction 0.1", "already has a val split", "val.bin"])
    for bad in ("1", "1.5", "-0.1", "nan"):
        refused(tmp_path, src / "train.bin", "--seq", 64, "--dtype", "uint16",
                "--val-fraction", bad, says="--val-fraction must be in [0, 1)")
    with pytest.raises(SettingsError, match=r"--val-fraction must be in \[0, 1\)"):
        ImportConfig(src="x", out="y", val_fraction=1.0)


def test_an_import_without_val_fraction_keeps_its_fingerprint_free_of_the_seed(tmp_path):
    np.save(tmp_path / "r.npy", np.arange(16, dtype=np.int32).reshape(2, 8))
    out = tmp_path / "o"
    assert run("import", tmp_path / "r.npy", "--out", out, "--quiet")[0] == 0
    assert "seed" not in manifest_of(out)["fingerprint"]["import"]
    code, text = run("import", tmp_path / "r.npy", "--out", out, "--seed", 5, "--quiet")
    assert code == 0, text  # the same bytes: nothing to redo, nothing refused



def test_val_fraction_runs_a_document_on_over_a_skipped_row(tmp_path, byte_tokenizer):
    rows = documents(np.random.default_rng(8), 120, 64).astype(np.int64)
    rows[50, 10] = 70000  # beyond the vocabulary: the row is skipped, counted
    np.save(tmp_path / "r.npy", rows)
    out = tmp_path / "out"
    code, text = run("import", tmp_path / "r.npy", "--out", out, "--tokenizer", byte_tokenizer,
                     "--val-fraction", 0.3, "--quiet")
    assert code == 0, text
    kept = np.delete(rows, 50, axis=0).reshape(-1)
    got = docs_of(stream_of(out, "train")) + docs_of(stream_of(out, "val"))
    assert sorted(got) == sorted(docs_of(kept))  # the pieces either side of row 50: one document
    m = manifest_of(out)
    assert m["counts"]["skipped"] == {"id_out_of_range": 1} and m["counts"]["tokens"] == kept.size
    code, text = run("stats", out, "--verify")
    assert code == 0, text


def test_a_linked_folder_is_read_once_and_a_link_above_is_no_loop(tmp_path):
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    np.save(tmp_path / "elsewhere" / "v.npy", np.full((3, 8), 7, np.int32))
    np.save(src / "train" / "t.npy", np.full((2, 8), 5, np.int32))
    (src / "val").symlink_to(tmp_path / "elsewhere")
    (src / "train" / "up").symlink_to(src)  # a loop, were it followed
    out = tmp_path / "out"
    code, text = run("import", src, "--out", out, "--quiet")
    assert code == 0, text
    assert rows_of(out, "train").tolist() == [[5] * 8] * 2
    assert rows_of(out, "val").tolist() == [[7] * 8] * 3
