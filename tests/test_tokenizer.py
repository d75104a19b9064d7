import json

import numpy as np
import pytest

from longpack.errors import TokenizerError
from pipeline.tokenize.tokenizer import load_tokenizer


def test_byte_ranks_file_takes_the_encoding_named_by_the_file(byte_tokenizer):
    tok = load_tokenizer(byte_tokenizer)
    assert (tok.name, tok.eos_id, tok.vocab_size, tok.dtype) == ("gpt2", 50256, 50257, np.uint16)
    assert tok.encode_batch(["ab"])[0].tolist() == [97, 98]


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
    from pipeline.build import build
    from pipeline.config import BuildConfig

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
