"""End-to-end builds on generated corpora with the hermetic byte tokenizer."""

import json
from pathlib import Path

import numpy as np
import pytest

import longpack.pipeline.build as build_mod
from conftest import make_texts, split_documents, write_jsonl, write_parquet
from longpack.core.errors import InputError, SettingsError
from longpack.pipeline.build import build
from longpack.pipeline.config import WORK_DIR, BuildConfig
from longpack.pipeline.formats.shards import open_split
from longpack.pipeline.tokenize.split import Splitter, doc_hash

EOS = 50256


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, list[str]]:
    """Three files (parquet, jsonl.gz, jsonl.zst); returns the --input values and the texts in
    build order. The parquet file is named directly: a directory contributes only the files of
    the dataset's format (jsonl here)."""
    d = tmp_path / "corpus"
    d.mkdir()
    texts = make_texts(300)
    write_parquet(d / "a.parquet", texts[:100])
    write_jsonl(d / "b.jsonl.gz", [{"text": t} for t in texts[100:200]], "gz")
    write_jsonl(d / "c.jsonl.zst", [{"text": t} for t in texts[200:]], "zst")
    return [str(d / "a.parquet"), str(d)], texts


def run(tmp_path, inputs, name="out", **kw) -> tuple[Path, dict]:
    kw.setdefault("tokenizer", str(tmp_path / "gpt2.tiktoken"))
    kw.setdefault("seq", 64)
    kw.setdefault("val_fraction", 0.2)
    kw.setdefault("shard_bytes", 64 * 2 * 8)  # 8 rows per shard: many shards
    out = tmp_path / name
    inputs = [str(inputs)] if isinstance(inputs, (str, Path)) else inputs
    m = build(BuildConfig(out=str(out), dataset="jsonl", inputs=tuple(inputs), **kw),
              show_progress=False)
    return out, m


def output_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name not in ("manifest.json", "skipped.jsonl")}


def test_round_trip_gives_back_every_document_in_order(tmp_path, corpus, byte_tokenizer):
    """concat keeps the input order (best-fit's order is its window's: test_best_fit.py)."""
    out, m = run(tmp_path, corpus[0], packing="concat")
    texts = corpus[1]
    splitter = Splitter(0.2, 0)
    is_val = [splitter.is_val(doc_hash(t.encode())) for t in texts]
    for split, want in (("train", [t for t, v in zip(texts, is_val) if not v]),
                        ("val", [t for t, v in zip(texts, is_val) if v])):
        docs = split_documents(out, split, EOS)
        got = [bytes(d[:-1].astype(np.uint8)).decode() for d in docs]  # byte tokens
        assert got == want
        s = m["splits"][split]
        assert s["documents"] == len(want)
        assert s["tokens"] == sum(len(t.encode()) + 1 for t in want)
        assert s["rows"] * 64 == s["tokens"] + s["padding_tokens"]
    assert 0 < m["splits"]["val"]["documents"] < m["splits"]["train"]["documents"]
    assert m["counts"]["documents"] == 300 and m["counts"]["records_read"] == 300
    assert m["splits"]["train"]["shards"] > 3
    assert m["tokenizer"]["eos_id"] == EOS and m["dtype"] == "uint16"


def test_segments_agree_with_eos_positions(tmp_path, corpus, byte_tokenizer):
    out, _ = run(tmp_path, corpus[0])
    previous_ended, previous_hash, rows, continued = True, None, 0, 0
    for tokens, starts, hashes in open_split(out / "train").rows():
        padded = hashes[-1] == 0  # the split's last row: a padding segment after its documents
        real = tokens[: starts[-1]] if padded else tokens
        expected = [0] + [p + 1 for p in np.flatnonzero(real[:-1] == EOS)]
        assert list(starts) == expected + ([len(real)] if padded else [])
        assert all(hashes[: len(expected)] != 0)
        if not previous_ended:  # the row opens with the rest of the previous row's last document
            assert hashes[0] == previous_hash
            continued += 1
        previous_ended, previous_hash = real[-1] == EOS, hashes[len(expected) - 1]
        rows += 1
    assert rows > 3 and continued > 0


@pytest.mark.parametrize("fmt", ["mds", pytest.param("memmap", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_output_is_byte_identical_for_any_worker_count(tmp_path, corpus, byte_tokenizer, fmt):
    a, _ = run(tmp_path, corpus[0], "w1", workers=1, format=fmt)
    b, _ = run(tmp_path, corpus[0], "w3", workers=3, format=fmt)
    c, _ = run(tmp_path, corpus[0], "w3again", workers=3, format=fmt)
    assert output_files(a) == output_files(b) == output_files(c)
    assert len(output_files(a)) > 4


@pytest.mark.slow
def test_mds_and_memmap_hold_the_same_rows(tmp_path, corpus, byte_tokenizer):
    a, _ = run(tmp_path, corpus[0], "mds", format="mds")
    b, _ = run(tmp_path, corpus[0], "mm", format="memmap")
    for split in ("train", "val"):
        ra, rb = list(open_split(a / split).rows()), list(open_split(b / split).rows())
        assert len(ra) == len(rb) > 0
        for (ta, sa, ha), (tb, sb, hb) in zip(ra, rb):
            assert np.array_equal(ta, tb) and np.array_equal(sa, sb) and np.array_equal(ha, hb)
    tokens = np.load(next((b / "train").glob("*.tokens.npy")))
    assert tokens.ndim == 2 and tokens.shape[1] == 64 and tokens.dtype == np.uint16


def test_wide_vocabulary_gets_uint32_rows(tmp_path, corpus, byte_tokenizer_u32):
    out, m = run(tmp_path, corpus[0], tokenizer=byte_tokenizer_u32)
    tokens, _, _ = next(open_split(out / "train").rows())
    assert tokens.dtype == np.uint32 and m["dtype"] == "uint32"


class Crash(Exception):
    pass


def crash_on_call(monkeypatch, owner, name, k):
    original = getattr(owner, name)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == k:
            raise Crash(f"{name} call {k}")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


@pytest.mark.parametrize("fmt", ["mds", "memmap"])
@pytest.mark.parametrize("where,k", [
    ("_consume", 2), ("_consume", 5), ("_checkpoint", 3), ("_finish", 1),
    ("_write_manifest", 1), ("finish_shard", 4), ("write_bytes", 6)])
@pytest.mark.slow
def test_interrupted_build_resumes_to_identical_output(tmp_path, corpus, byte_tokenizer,
                                                       monkeypatch, fmt, where, k):
    monkeypatch.setattr(build_mod, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr("longpack.pipeline.read.batches.BATCH_CHARS", 2000)
    clean, _ = run(tmp_path, corpus[0], "clean", format=fmt)
    owner = {"finish_shard": "longpack.pipeline.pack.writers.ShardSink",
             "write_bytes": "longpack.pipeline.pack.writers"}.get(where, "longpack.pipeline.build.Build")
    module, _, cls = owner.rpartition(".")
    import importlib
    target = (getattr(importlib.import_module(module), cls) if where != "write_bytes"
              else importlib.import_module(owner))
    name = "_finish_shard" if where == "finish_shard" else where
    with monkeypatch.context() as mp:
        crash_on_call(mp, target, name, k)
        with pytest.raises(Crash):
            run(tmp_path, corpus[0], "resumed", format=fmt)
    assert not (tmp_path / "resumed" / "manifest.json").exists() or where == "_write_manifest"
    for split in ("train", "val"):  # nothing half-done looks complete
        if where not in ("_write_manifest",):
            assert not (tmp_path / "resumed" / split / "index.json").exists() or where == "_finish"
    had_checkpoint = (tmp_path / "resumed" / WORK_DIR / "checkpoint.npz").exists()
    out, m = run(tmp_path, corpus[0], "resumed", format=fmt)
    assert output_files(out) == output_files(clean)
    assert m["timings"]["resumed"] is had_checkpoint
    assert (out / "skipped.jsonl").read_bytes() == (clean / "skipped.jsonl").read_bytes()
    assert not (out / WORK_DIR).exists()


def test_resume_does_not_redo_finished_work(tmp_path, corpus, byte_tokenizer, monkeypatch):
    monkeypatch.setattr(build_mod, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr("longpack.pipeline.read.batches.BATCH_CHARS", 2000)
    with monkeypatch.context() as mp:
        crash_on_call(mp, build_mod.Build, "_consume", 20)
        with pytest.raises(Crash):
            run(tmp_path, corpus[0])
    _, m = run(tmp_path, corpus[0])
    assert 0 < m["timings"]["tokens_this_run"] < m["counts"]["tokens"]


def test_rerun_of_a_finished_build_is_a_no_op(tmp_path, corpus, byte_tokenizer):
    out, m1 = run(tmp_path, corpus[0])
    _, m2 = run(tmp_path, corpus[0])
    assert m1 == m2


@pytest.mark.slow
def test_different_settings_into_an_existing_output_are_refused(tmp_path, corpus, byte_tokenizer):
    out, _ = run(tmp_path, corpus[0])
    with pytest.raises(SettingsError, match="different settings.*seq.*--overwrite"):
        run(tmp_path, corpus[0], seq=128)
    _, m = run(tmp_path, corpus[0], seq=128, overwrite=True)
    assert m["seq"] == 128


def test_a_foreign_directory_is_never_written_into(tmp_path, corpus, byte_tokenizer):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(SettingsError, match="not empty and holds no longpack build"):
        run(tmp_path, corpus[0], overwrite=True)
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


def test_max_tokens_stops_after_the_document_that_reaches_it(tmp_path, corpus, byte_tokenizer):
    _, m = run(tmp_path, corpus[0], max_tokens=5000)
    lengths = [len(t.encode()) + 1 for t in corpus[1]]
    n = int(np.searchsorted(np.cumsum(lengths), 5000)) + 1
    assert m["counts"]["documents"] == n and m["counts"]["tokens"] == sum(lengths[:n])


def test_limit_docs(tmp_path, corpus, byte_tokenizer):
    _, m = run(tmp_path, corpus[0], limit_docs=123)
    assert m["counts"]["documents"] == 123


def test_drop_last_row_counts_what_it_drops(tmp_path, corpus, byte_tokenizer):
    _, m = run(tmp_path, corpus[0], last_row="drop", packing="concat")  # concat's last row
    for s in m["splits"].values():
        assert s["padding_tokens"] == 0
        assert s["rows"] * 64 + s["dropped_tokens"] == s["tokens"]


BAD = [{"text": "good one"}, b"{not json", {"id": 1}, {"text": ""}, b'{"text": "caf\xe9"}',
       {"text": "a\ud800b"}, {"text": "good two"}]


def test_bad_input_is_counted_and_logged_with_file_and_line(tmp_path, byte_tokenizer):
    d = tmp_path / "bad"
    d.mkdir()
    path = write_jsonl(d / "x.jsonl", [json.dumps(r).encode() if isinstance(r, dict) else r
                                       for r in BAD])
    out, m = run(tmp_path, d, val_fraction=0.0)
    assert m["counts"]["skipped"] == {"bad_json": 1, "missing_text": 1, "empty": 1,
                                      "invalid_utf8": 2, "blank_line": 0, "truncated_file": 0,
                                      "corrupt_file": 0, "broken_link": 0,
                                      "unencodable": 0}
    assert m["counts"]["documents"] == 2 and m["counts"]["records_read"] == 7
    log = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(e["line"], e["reason"]) for e in log] == [
        (2, "bad_json"), (3, "missing_text"), (4, "empty"), (5, "invalid_utf8"),
        (6, "invalid_utf8")]
    assert all(e["file"] == str(path) for e in log)


def test_on_error_fail_stops_with_one_clear_message(tmp_path, byte_tokenizer):
    d = tmp_path / "bad"
    d.mkdir()
    write_jsonl(d / "x.jsonl", [{"text": "fine"}, b"{oops"])
    with pytest.raises(InputError, match=r"x\.jsonl, line 2: bad_json: .*--on-error skip"):
        run(tmp_path, d, on_error="fail")


def test_bos_needs_a_tokenizer_with_one(tmp_path, corpus, byte_tokenizer):
    from longpack.core.errors import TokenizerError
    with pytest.raises(TokenizerError, match="no beginning-of-document token"):
        run(tmp_path, corpus[0], bos=True)


def test_inputs_that_match_nothing_are_named(tmp_path, byte_tokenizer):
    with pytest.raises(SettingsError, match="no such file or directory"):
        run(tmp_path, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SettingsError, match="no jsonl files there"):
        run(tmp_path, tmp_path / "empty")


def test_a_missing_tokenizer_and_missing_inputs_are_said_at_once(tmp_path, byte_tokenizer):
    """Offline, a first run meets both: one line names each, not one run at a time (issue 44);
    either alone is its own line, as before."""
    from longpack.core.errors import TokenizerError

    def cfg(tokenizer, inputs):
        return BuildConfig(out=str(tmp_path / "out"), dataset="jsonl", inputs=(inputs,),
                           tokenizer=tokenizer, seq=16)

    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(4)])
    with pytest.raises(TokenizerError) as both:
        build(cfg(str(tmp_path / "missing.tiktoken"), str(tmp_path / "nowhere.jsonl")),
              show_progress=False)
    assert "tokenizer file not found" in str(both.value) and "nowhere.jsonl" in str(both.value)
    with pytest.raises(TokenizerError, match="tokenizer file not found") as one:
        build(cfg(str(tmp_path / "missing.tiktoken"), str(tmp_path / "d.jsonl")),
              show_progress=False)
    assert "d.jsonl" not in str(one.value)
    with pytest.raises(SettingsError, match="nowhere.jsonl: no such file"):
        build(cfg(byte_tokenizer, str(tmp_path / "nowhere.jsonl")), show_progress=False)
    assert not (tmp_path / "out").exists()
