import hashlib
import json
import os

import numpy as np
import pytest

from longpack.core.errors import TokenizerError
from longpack.pipeline.tokenize.tokenizer import load_tokenizer


def test_byte_ranks_file_takes_the_encoding_named_by_the_file(byte_tokenizer):
    """Not GPT-2's ranks, though named gpt2.tiktoken: GPT-2's pattern and <|endoftext|>, and a
    name that does not claim to be gpt2 (its stem and its sha256's first 8 hex digits)."""
    tok = load_tokenizer(byte_tokenizer)
    sha = hashlib.sha256(open(byte_tokenizer, "rb").read()).hexdigest()
    assert (tok.name, tok.eos_id, tok.vocab_size, tok.dtype) == (
        f"gpt2-{sha[:8]}", 50256, 50257, np.uint16)
    assert tok.encode_batch(["ab"])[0].tolist() == [97, 98]
    assert tok.source == os.path.abspath(byte_tokenizer)


def test_special_token_text_is_encoded_as_text(byte_tokenizer):
    tok = load_tokenizer(byte_tokenizer)
    ids = tok.encode_batch(["<|endoftext|>"])[0]
    assert tok.eos_id not in ids and tok.decode(ids) == "<|endoftext|>"


def test_wide_vocabulary_needs_uint32(byte_tokenizer_u32):
    tok = load_tokenizer(byte_tokenizer_u32)
    assert tok.vocab_size == 100277 and tok.dtype == np.uint32


def test_unknown_names_and_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(TokenizerError, match="unknown tokenizer 'nope'.*cl100k_base"):
        load_tokenizer("nope")
    with pytest.raises(TokenizerError, match="tokenizer file not found"):
        load_tokenizer(str(tmp_path / "missing.tiktoken"))
    odd = tmp_path / "mine.tiktoken"
    odd.write_bytes(b"YQ== 0\n")
    with pytest.raises(TokenizerError, match="unknown .tiktoken ranks file.*name it after"):
        load_tokenizer(str(odd))


def test_offline_tiktoken_name_says_which_file_to_pass(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(TokenizerError, match=r"--tokenizer path/to/cl100k_base\.tiktoken"):
        load_tokenizer("cl100k_base")


def tiny_hf_tokenizer(path, with_bos: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>"] + (["<s>"] if with_bos else [])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world", "long context packing"] * 20, trainer)
    tok.save(str(path))
    return str(path)


def test_huggingface_tokenizer_json(tmp_path):
    pytest.importorskip("tokenizers")
    tok = load_tokenizer(tiny_hf_tokenizer(tmp_path / "tokenizer.json", with_bos=True), bos=True)
    assert tok.kind == "huggingface" and tok.eos_id == 0 and tok.bos_id == 1
    ids = tok.encode_batch(["hello <|endoftext|> world"])[0]
    assert tok.eos_id not in ids and tok.decode(ids) == "hello <|endoftext|> world"
    assert len(tok.sha256) == 64 and tok.dtype == np.uint16


def test_bos_requires_a_distinct_token(tmp_path):
    pytest.importorskip("tokenizers")
    path = tiny_hf_tokenizer(tmp_path / "tokenizer.json", with_bos=False)
    assert load_tokenizer(path).bos_id is None
    with pytest.raises(TokenizerError, match="--bos"):
        load_tokenizer(path, bos=True)


def test_shared_tokenizer_files_match_their_published_hashes(shared):
    gpt2 = load_tokenizer(str(shared / "tokenizers/gpt2.tiktoken"))
    assert gpt2.encode_batch(["Hello world"])[0].tolist() == [15496, 995]
    assert gpt2.sha256.startswith("306cd27f03c1")
    cl = load_tokenizer(str(shared / "tokenizers/cl100k_base.tiktoken"))
    assert cl.encode_batch(["Hello world"])[0].tolist() == [9906, 1917] and cl.dtype == np.uint32
    pytest.importorskip("tokenizers")
    neox = load_tokenizer(str(shared / "tokenizers/gpt-neox-tokenizer.json"))
    assert neox.encode_batch(["Hello world"])[0].tolist() == [12092, 1533]
    assert (neox.eos_id, neox.vocab_size) == (50279, 50280)


@pytest.mark.parametrize("kind", ["tiktoken", "huggingface"])
def test_a_lone_surrogate_is_an_invalid_utf8_skip_for_every_tokenizer(tmp_path, kind,
                                                                       byte_tokenizer):
    """JSON text may hold "\\ud800": a str no tokenizer can take (Hugging Face's raises a
    TypeError). The document is a counted skip, its neighbours are built."""
    from conftest import write_jsonl
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    if kind == "huggingface":
        pytest.importorskip("tokenizers")
        tokenizer = tiny_hf_tokenizer(tmp_path / "tokenizer.json", with_bos=False)
    else:
        tokenizer = byte_tokenizer
    lines = [json.dumps({"text": t}).encode() for t in ("hello world", "a\ud800b", "long context")]
    corpus = write_jsonl(tmp_path / "d.jsonl", lines)
    m = build(BuildConfig(out=str(tmp_path / "out"), dataset="jsonl", inputs=(str(corpus),),
                          tokenizer=tokenizer, seq=16, val_fraction=0.0), show_progress=False)
    assert m["counts"]["skipped"]["invalid_utf8"] == 1
    assert m["counts"]["documents"] == 2
    logged = [json.loads(line) for line in (tmp_path / "out/skipped.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in logged] == [(2, "invalid_utf8")]


def _registered(monkeypatch, name: str, path) -> str:
    """The byte ranks file's sha256 made the official one of `name` (hermetic: no real file)."""
    import longpack.pipeline.tokenize.tokenizer as tokenizer_mod

    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    _, pattern, specials = tokenizer_mod.TIKTOKEN_ENCODINGS[name]
    monkeypatch.setitem(tokenizer_mod.TIKTOKEN_ENCODINGS, name, (sha, pattern, specials))
    return sha


def test_a_ranks_file_is_named_by_its_content_not_its_file_name(tmp_path, monkeypatch):
    from conftest import write_byte_ranks

    mine = write_byte_ranks(tmp_path / "vocab.tiktoken")  # a name that says nothing
    _registered(monkeypatch, "cl100k_base", mine)
    tok = load_tokenizer(str(mine))
    assert (tok.name, tok.eos_id, tok.vocab_size) == ("cl100k_base", 100257, 100277)
    misnamed = write_byte_ranks(tmp_path / "gpt2.tiktoken")  # cl100k's ranks, named gpt2
    tok = load_tokenizer(str(misnamed))
    assert (tok.name, tok.eos_id) == ("cl100k_base", 100257)
    # a name the caller gives a file of no known hash (a build's copy, tokenizer.tiktoken)
    monkeypatch.undo()
    copy = write_byte_ranks(tmp_path / "tokenizer.tiktoken")
    with pytest.raises(TokenizerError, match="unknown .tiktoken ranks file"):
        load_tokenizer(str(copy))
    tok = load_tokenizer(str(copy), encoding="gpt2")
    assert tok.name.startswith("gpt2-") and tok.eos_id == 50256


def test_the_real_gpt2_file_is_gpt2_whatever_its_name(tmp_path, shared):
    renamed = tmp_path / "vocab.tiktoken"
    renamed.write_bytes((shared / "tokenizers/gpt2.tiktoken").read_bytes())
    tok = load_tokenizer(str(renamed))
    assert (tok.name, tok.eos_id, tok.vocab_size) == ("gpt2", 50256, 50257)
    assert load_tokenizer(str(shared / "tokenizers/gpt2.tiktoken")).name == "gpt2"


def test_offline_gpt2_falls_back_to_the_shipped_ranks_file(tmp_path, monkeypatch):
    """`--tokenizer gpt2` with no network: the package's pipeline/samples/gpt2.tiktoken, when
    it is there with the official sha256; the build's identity is the downloaded one's."""
    import tiktoken

    import longpack.pipeline.tokenize.tokenizer as tokenizer_mod
    from conftest import write_byte_ranks

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setattr(tokenizer_mod, "SAMPLES", tmp_path / "samples")
    with pytest.raises(TokenizerError, match=r"--tokenizer path/to/gpt2\.tiktoken"):
        load_tokenizer("gpt2")  # no shipped file
    (tmp_path / "samples").mkdir()
    shipped = write_byte_ranks(tmp_path / "samples" / "gpt2.tiktoken")
    with pytest.raises(TokenizerError, match="no network"):
        load_tokenizer("gpt2")  # a file there, but not the official one: not taken
    sha = _registered(monkeypatch, "gpt2", shipped)
    tok = load_tokenizer("gpt2")
    assert (tok.name, tok.source, tok.sha256, tok.eos_id) == ("gpt2", "gpt2", sha, 50256)
    assert tok.encode_batch(["hi"])[0].tolist() == [104, 105]
    with pytest.raises(TokenizerError, match="cl100k_base"):
        load_tokenizer("cl100k_base")  # nothing shipped for it
