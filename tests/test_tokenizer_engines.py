"""The fast engine (fastokens) gives the reference library's ids, and is refused where it does not."""

import json
import re

import numpy as np
import pytest

from conftest import write_byte_ranks
from longpack.core.errors import TokenizerError
from longpack.pipeline.tokenize.engines import HARD_TEXTS, FastEngine
from longpack.pipeline.tokenize.tokenizer import load_tokenizer

pytest.importorskip("fastokens")

SHARED_TOKENIZERS = ["gpt2.tiktoken", "cl100k_base.tiktoken", "gpt-neox-tokenizer.json"]


def shared_texts(real_text, limit: int = 2000) -> list[str]:
    import gzip

    import pyarrow.parquet as pq

    texts = []
    for path in sorted(real_text.data("fineweb-edu-sample").glob("*.parquet")):
        texts += pq.read_table(path, columns=["text"]).column(0).to_pylist()[: limit // 2]
    for path in sorted(real_text.data("dolma-sample").glob("*.gz")):
        with gzip.open(path, "rt") as f:
            texts += [json.loads(line)["text"] for _, line in zip(range(limit // 4), f)]
    return texts


@pytest.mark.slow
@pytest.mark.parametrize("name", SHARED_TOKENIZERS)
def test_fast_engine_gives_the_reference_ids_on_the_real_corpus(real_text, name):
    fast = load_tokenizer(str(real_text.tokenizer(name)), engine="fast")
    reference = load_tokenizer(str(real_text.tokenizer(name)), engine="reference")
    assert fast.engine_identity()["library"] == "fastokens"
    assert reference.engine_identity()["library"] in ("tiktoken", "tokenizers")
    texts = shared_texts(real_text) + list(HARD_TEXTS)
    ids_f, off_f = fast.encode_flat(texts)
    ids_r, off_r = reference.encode_flat(texts)
    assert np.array_equal(off_f, off_r) and np.array_equal(ids_f, ids_r)


def ranks_with_a_merge(path):
    """The 256 bytes plus one merge, "'T": GPT-2's pattern never puts those two characters in
    one piece (its contractions are lower case), cl100k's does."""
    import base64

    write_byte_ranks(path)
    with open(path, "ab") as f:
        f.write(base64.b64encode(b"'T") + b" 256\n")
    return path


def test_the_load_check_refuses_a_fast_engine_that_disagrees(tmp_path, monkeypatch):
    """A real fastokens engine given GPT-2's ranks with cl100k's pattern: wrong ids on
    "DON'T", one of the texts checked at load."""
    import longpack.pipeline.tokenize.tokenizer as tokenizer_mod

    path = ranks_with_a_merge(tmp_path / "gpt2.tiktoken")
    real_load = FastEngine.load

    def load_with_wrong_pattern(kind, path_, ranks, pattern, special_tokens):
        _, cl100k_pattern, _ = tokenizer_mod.TIKTOKEN_ENCODINGS["cl100k_base"]
        return real_load(kind, path_, ranks, cl100k_pattern, special_tokens)

    monkeypatch.setattr(FastEngine, "load", staticmethod(load_with_wrong_pattern))
    with pytest.raises(TokenizerError, match="differently from tiktoken.*--tokenizer-engine "
                                             "reference"):
        load_tokenizer(str(path), engine="fast")
    auto = load_tokenizer(str(path), engine="auto")
    assert auto.engine is auto.reference
    assert "differently" in auto.engine_identity()["note"]


def test_a_text_the_reference_gives_up_on_is_encoded_by_the_fast_engine(tmp_path):
    """tiktoken's regex runs out of backtracking stack on 1 MB of spaces with o200k's pattern
    (ValueError); the build must neither crash nor depend on which engine it runs."""
    path = write_byte_ranks(tmp_path / "o200k_base.tiktoken")
    texts = ["before", " " * 1_000_000, "after"]
    with pytest.raises(ValueError, match="Regex error"):
        load_tokenizer(str(path)).reference.encode_flat(texts[1:2])
    results = [load_tokenizer(str(path), engine=e).encode_flat(texts) for e in ("reference", "fast")]
    for ids, offsets in results:
        assert offsets.tolist() == [0, 6, 1_000_006, 1_000_011]
        assert bytes(ids[6:1_000_006].astype(np.uint8)) == b" " * 1_000_000
    assert np.array_equal(results[0][0], results[1][0])


def test_an_unknown_engine_is_refused(tmp_path):
    path = write_byte_ranks(tmp_path / "gpt2.tiktoken")
    with pytest.raises(TokenizerError, match="--tokenizer-engine 'quick': choose one of auto"):
        load_tokenizer(str(path), engine="quick")


def ranks_with_merges(path):
    """256 bytes and merges up to whole words of conftest.make_texts' vocabulary, so BPE and the
    pre-tokenizing pattern both matter (every word is one token, " word" another)."""
    import base64

    write_byte_ranks(path)
    words = ["alpha", "beta", "gamma", "long-context"]
    merges, rank = [], 256
    for word in words + [" " + w for w in words]:
        for end in range(2, len(word.encode()) + 1):
            piece = word.encode()[:end]
            if piece not in merges:
                merges.append(piece)
    with open(path, "ab") as f:
        for piece in merges:
            f.write(base64.b64encode(piece) + b" " + str(rank).encode() + b"\n")
            rank += 1
    return path


def build_with(tmp_path, corpus, tokenizer, engine, name, **kw):
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    settings = {"seq": 64, "val_fraction": 0.2, "shard_bytes": 64 * 2 * 8} | kw
    return build(BuildConfig(out=str(tmp_path / name), dataset="jsonl", inputs=(str(corpus),),
                             tokenizer=str(tokenizer), tokenizer_engine=engine, **settings),
                 show_progress=False)


def tree(out) -> dict:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


@pytest.mark.slow
def test_a_build_resumed_under_the_other_engine_is_byte_identical(tmp_path, monkeypatch):
    import longpack.pipeline.build as build_mod
    from conftest import make_texts, write_jsonl

    tok = ranks_with_merges(tmp_path / "gpt2.tiktoken")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(400)])
    monkeypatch.setattr(build_mod, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr("longpack.pipeline.read.batches.BATCH_CHARS", 2000)
    clean = {e: build_with(tmp_path, corpus, tok, e, f"clean-{e}") for e in ("reference", "fast")}
    assert clean["fast"]["tokenizer_engine"]["library"] == "fastokens"
    assert clean["reference"]["tokenizer_engine"]["library"] == "tiktoken"
    assert clean["fast"]["fingerprint"] == clean["reference"]["fingerprint"]
    assert tree(tmp_path / "clean-fast") == tree(tmp_path / "clean-reference")
    calls = {"n": 0}
    original = build_mod.Build._consume

    def crash_on_the_third(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, *args)

    with monkeypatch.context() as mp:
        mp.setattr(build_mod.Build, "_consume", crash_on_the_third)
        with pytest.raises(KeyboardInterrupt):
            build_with(tmp_path, corpus, tok, "reference", "resumed")
    m = build_with(tmp_path, corpus, tok, "fast", "resumed")
    assert m["timings"]["resumed"] and m["tokenizer_engine"]["engine"] == "fast"
    assert tree(tmp_path / "resumed") == tree(tmp_path / "clean-reference")
    # The finished build is the same build whichever engine a re-run names.
    again = build_with(tmp_path, corpus, tok, "reference", "resumed")
    assert again["timings"] == m["timings"]


def test_the_sample_check_stops_a_build_whose_fast_engine_disagrees(tmp_path, monkeypatch):
    """A fast engine right on every load-time text but wrong on one document: the build stops
    at that document, if it is one of the sampled ones (hash % 128 == 0 with tiktoken), naming it."""
    from conftest import write_jsonl
    from longpack.pipeline.tokenize.engines import SAMPLE_EVERY
    from longpack.pipeline.tokenize.split import doc_hash

    texts = [f"document number {i}" for i in range(2000)]
    sampled = next(t for t in texts if doc_hash(t) % SAMPLE_EVERY["tiktoken"] == 0)
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    real = FastEngine.encode_flat

    def wrong_on_one(self, batch):
        ids, offsets = real(self, batch)
        if sampled in batch:
            i = batch.index(sampled)
            ids = ids.copy()
            ids[offsets[i]] += 1
        return ids, offsets

    monkeypatch.setattr(FastEngine, "encode_flat", wrong_on_one)
    tok = write_byte_ranks(tmp_path / "gpt2.tiktoken")
    with pytest.raises(TokenizerError) as e:
        build_with(tmp_path, corpus, tok, "fast", "out")
    line = texts.index(sampled) + 1
    assert f"c.jsonl, record {line} ('{sampled}'" in str(e.value)
    assert "--tokenizer-engine reference" in str(e.value)
    # The reference engine builds it.
    m = build_with(tmp_path, corpus, tok, "reference", "out")
    assert m["counts"]["documents"] == 2000


@pytest.mark.slow
@pytest.mark.parametrize("name,engines", [("gpt2.tiktoken", ("fast", "reference")),
                                          ("gpt-neox-tokenizer.json", ("fast",))])
def test_a_100_mb_document_is_packed_whole_by_every_engine(tmp_path, real_text, name, engines):
    """One document of 100 MB of real text between two small ones: packed whole, every token
    once, the same bytes under both engines. (Hugging Face tokenizers itself, the reference of
    a tokenizer.json, takes ~70 s and ~12 GB for it here -- per-token objects -- so that pair is
    left to the fast engine; docs/BENCHMARKS.md.)"""
    from conftest import write_jsonl

    tok = real_text.tokenizer(name)
    real = "\n\n".join(shared_texts(real_text, limit=400))
    huge = (real * (100_000_000 // len(real) + 1))[:100_000_000]
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "first"}, {"text": huge},
                                                {"text": "last"}])
    del real
    expected = sum(len(load_tokenizer(str(tok), engine=engines[0]).encode_flat([t])[0]) + 1
                   for t in ("first", huge, "last"))
    builds = {e: build_with(tmp_path, corpus, tok, e, f"out-{e}", val_fraction=0.0,
                            shard_bytes=1 << 26, seq=4096) for e in engines}
    for e, m in builds.items():
        assert m["tokenizer_engine"]["engine"] == e
        assert m["counts"]["documents"] == 3 and m["counts"]["tokens"] == expected
        assert not any(m["counts"]["skipped"].values())
    if len(engines) == 2:
        assert tree(tmp_path / "out-fast") == tree(tmp_path / "out-reference")


def test_ranks_the_fast_engine_cannot_load_are_built_by_the_reference_with_a_note(tmp_path):
    """A ranks file with a token that is no merge of two lower-ranked ones ("xyz": neither
    "xy" nor "yz" is a token): tiktoken takes it (BPE never makes it), fastokens refuses to
    decompose it. `auto` builds with tiktoken and says so once; `fast` is one line."""
    import base64

    from click.testing import CliRunner

    from conftest import make_texts, write_jsonl
    from longpack.pipeline.cli import pack

    tok = ranks_with_merges(tmp_path / "gpt2.tiktoken")
    ranks = len(tok.read_bytes().splitlines())
    with open(tok, "ab") as f:
        f.write(base64.b64encode(b"xyz") + b" " + str(ranks).encode() + b"\n")
    reference = load_tokenizer(str(tok))
    assert reference.decode([ranks]) == "xyz"  # tiktoken took it
    assert reference.encode_flat(["alpha xyz"])[0].tolist() == [*reference.encode_flat(
        ["alpha"])[0], *reference.encode_flat([" "])[0], ord("x"), ord("y"), ord("z")]
    with pytest.raises(TokenizerError, match=r"^--tokenizer-engine fast: fastokens cannot load "
                                             + re.escape(str(tok)) + r" \(.*decompose"):
        load_tokenizer(str(tok), engine="fast")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(40)])
    r = CliRunner().invoke(pack, ["build", "--out", str(tmp_path / "auto"), "--dataset", "jsonl",
                                  "--input", str(corpus), "--tokenizer", str(tok), "--seq", "64",
                                  "--val-fraction", "0.2", "--shard-bytes", str(64 * 2 * 8)])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    notes = [line for line in r.output.splitlines() if line.startswith("  note ")]
    assert len(notes) == 1 and notes[0].startswith(
        f"  note        tiktoken encoded; fastokens not used: fastokens cannot load {tok} (")
    assert "decompose" in notes[0], r.output
    m = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert m["tokenizer_engine"]["library"] == "tiktoken"
    built = build_with(tmp_path, corpus, tok, "reference", "reference")
    assert m["fingerprint"] == built["fingerprint"]
    assert tree(tmp_path / "auto") == tree(tmp_path / "reference")
