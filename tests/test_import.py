"""pack import: others' token rows (.npy folders, .pt tensors, nanoGPT .bin) become a longpack
build that pack stats --verify passes and train trains on; bad rows counted and named."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from longpack.pipeline.cli import pack
from longpack.pipeline.formats.shards import open_split
from longpack.training.cli import train as train_cli

EOS = 50256


def rows_of(out, split="train") -> np.ndarray:
    return np.concatenate([np.asarray(r)[None] for r, _, _ in open_split(out / split).rows()])


def documents(rng, n_rows: int, seq: int) -> np.ndarray:
    """Rows of documents of random lengths, each ended by EOS, packed end to end."""
    stream = []
    while len(stream) < n_rows * seq:
        stream += rng.integers(0, 256, rng.integers(5, 150)).tolist() + [EOS]
    return np.array(stream[: n_rows * seq], np.uint16).reshape(n_rows, seq)


def run(*args) -> tuple[int, str]:
    result = CliRunner().invoke(pack, list(map(str, args)))
    return result.exit_code, result.output


@pytest.mark.slow
def test_a_seed_style_npy_folder_is_stats_verified_and_trained_on(tmp_path, byte_tokenizer):
    rng = np.random.default_rng(0)
    src = tmp_path / "seed"
    (src / "train").mkdir(parents=True)
    (src / "val").mkdir()
    train_rows = [documents(rng, 40, 65), documents(rng, 30, 65)]
    np.save(src / "train" / "a.npy", train_rows[0])
    np.save(src / "train" / "b.npy", train_rows[1])
    np.save(src / "val" / "v.npy", documents(rng, 8, 65))
    out = tmp_path / "imported"
    code, text = run("import", src, "--out", out, "--eos-id", EOS, "--tokenizer", byte_tokenizer,
                     "--shard-bytes", 65 * 2 * 16)
    assert code == 0, text
    assert np.array_equal(rows_of(out), np.concatenate(train_rows))
    m = json.loads((out / "manifest.json").read_text())
    assert m["splits"]["train"]["rows"] == 70 and m["splits"]["train"]["shards"] == 5
    assert m["tokenizer"]["vocab_size"] == 50257 and m["tokenizer"]["eos_id"] == EOS
    code, text = run("stats", out, "--verify")
    assert code == 0, text  # document starts after each EOS, continued documents' hashes
    result = CliRunner().invoke(train_cli, [
        "--shards", str(out), "--out", str(tmp_path / "run"), "--model", "neox-tiny",
        "--batch-size", "4", "--max-steps", "2", "--warmup", "1", "--workers", "0",
        "--report-to", "jsonl"])
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_nanogpt_bin_and_pt_tensors_with_bad_rows_counted(tmp_path, byte_tokenizer):
    rng = np.random.default_rng(1)
    src = tmp_path / "mixed"
    src.mkdir()
    flat = documents(rng, 10, 64).reshape(-1)
    np.concatenate([flat, flat[:7]]).tofile(src / "a.bin")  # 10 rows + 7 tokens over
    bad = documents(rng, 5, 64).astype(np.int64)
    bad[2, 3] = 70000  # beyond the vocabulary
    torch.save(torch.from_numpy(bad), src / "b.pt")
    np.save(src / "c.npy", documents(rng, 3, 32))  # rows of another width
    out = tmp_path / "out"
    code, text = run("import", src, "--out", out, "--seq", 64, "--dtype", "uint16",
                     "--tokenizer", byte_tokenizer, "--format", "memmap", "--quiet")
    assert code == 0, text
    expected = np.concatenate([flat.reshape(10, 64), np.delete(bad, 2, axis=0)])
    assert np.array_equal(rows_of(out), expected)
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["skipped"] == {"partial_row": 1, "id_out_of_range": 1, "wrong_length": 3}
    skips = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert {(s["file"].rsplit("/", 1)[-1], s["row"], s["reason"]) for s in skips} == {
        ("a.bin", 10, "partial_row"), ("b.pt", 2, "id_out_of_range"),
        ("c.npy", 0, "wrong_length")}
    code, text = run("stats", out, "--verify")
    assert code == 0, text
    code, again = run("import", src, "--out", out, "--seq", 64, "--dtype", "uint16",
                      "--tokenizer", byte_tokenizer, "--format", "memmap")
    assert code == 0 and "already complete" not in again  # nothing new: the same files


def test_refusals_are_one_line(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0" * 100)
    code, text = run("import", tmp_path / "x.bin", "--out", tmp_path / "o")
    assert code == 1 and "needs --seq and --dtype" in text
    code, text = run("import", tmp_path / "nothing", "--out", tmp_path / "o")
    assert code == 1 and "no such file or directory" in text
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    code, text = run("import", tmp_path / "notes", "--out", tmp_path / "o")
    assert code == 1 and "no .npy, .npz, .pt, .bin files to import" in text
    assert not (tmp_path / "o").exists()


def test_without_a_tokenizer_the_vocabulary_is_the_largest_id_and_it_says_so(tmp_path):
    np.save(tmp_path / "r.npy", np.arange(40, dtype=np.int32).reshape(4, 10))
    result = CliRunner().invoke(pack, ["import", str(tmp_path / "r.npy"), "--out",
                                       str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "the vocabulary is taken as the largest id + 1 (40)" in result.output
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["tokenizer"]["vocab_size"] == 40 and m["splits"]["train"]["documents"] == 4
    pytest.importorskip("streaming")  # pack stats reads the MDS shards back


@pytest.mark.parametrize("encoding", ["ndarray:int32", "bytes"])
@pytest.mark.slow
def test_an_llm_foundry_mds_dataset_is_imported(tmp_path, byte_tokenizer, encoding):
    """llm-foundry's convert scripts write `tokens` as ndarray:int32, or (older ones) as the
    bytes of int64 ids: streaming's own MDSWriter writes both here."""
    from longpack.pipeline import import_streaming

    streaming = import_streaming()
    rows = documents(np.random.default_rng(2), 50, 64)
    src = tmp_path / "foundry"
    with streaming.MDSWriter(out=str(src / "train"), columns={"tokens": encoding},
                             size_limit=4000) as writer:
        for row in rows:
            value = row.astype(np.int32) if encoding != "bytes" else row.astype(np.int64).tobytes()
            writer.write({"tokens": value})
    out = tmp_path / "out"
    code, text = run("import", src, "--out", out, "--tokenizer", byte_tokenizer, "--quiet")
    assert code == 0, text
    assert np.array_equal(rows_of(out), rows)
    code, text = run("stats", out, "--verify")
    assert code == 0, text


def test_an_npz_archive_is_imported_array_by_array(tmp_path, byte_tokenizer):
    """numpy.savez's archives (seed 000's data): [N, seq] arrays as .npy rows, 1-D arrays as
    token streams cut at --seq (their tails counted), in the archive's order; an array of
    another width is skipped whole, as a .npy of another width."""
    rng = np.random.default_rng(1)
    src = tmp_path / "seed"
    (src / "train").mkdir(parents=True)
    (src / "val").mkdir()
    rows = documents(rng, 12, 16)
    stream = documents(rng, 3, 16).reshape(-1)
    np.savez(src / "train" / "shards.npz", rows=rows, stream=np.append(stream, [7, 8, 9]),
             narrow=rows[:, :8])
    np.savez_compressed(src / "val" / "v.npz", documents(rng, 2, 16))
    out = tmp_path / "imported"
    code, text = run("import", src, "--out", out, "--seq", 16, "--eos-id", EOS,
                     "--tokenizer", byte_tokenizer)
    assert code == 0, text
    assert np.array_equal(rows_of(out), np.concatenate([rows, stream.reshape(-1, 16)]))
    assert rows_of(out, "val").shape == (2, 16)
    skips = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(s["reason"], s["row"], s["records"]) for s in skips] == [
        ("wrong_length", 15, 12), ("partial_row", 15, 1)]
    assert "array 'stream'" in skips[1]["detail"]
    code, text = run("stats", out, "--verify")
    assert code == 0, text


def test_npz_refusals_are_one_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", docs=np.array([[1, 2], "x"], dtype=object))
    code, text = run("import", src, "--out", tmp_path / "o")
    assert code == 1 and len(text.strip().splitlines()) == 1, text
    assert "array 'docs': holds Python objects" in text and not (tmp_path / "o").exists()
    np.savez(src / "a.npz", stream=np.arange(40, dtype=np.uint16))
    code, text = run("import", src, "--out", tmp_path / "o")
    assert code == 1 and "a 1-D token stream: pass --seq" in text, text
    (src / "a.npz").write_bytes(b"PK\x03\x04 not a zip")
    code, text = run("import", src, "--out", tmp_path / "o")
    assert code == 1 and "not a .npz file" in text, text
