"""The fast engine (fastokens) gives the reference library's ids, and is refused where it does not."""

import json

import numpy as np
import pytest

from conftest import write_byte_ranks
from pipeline.errors import TokenizerError
from pipeline.tokenizer import load_tokenizer
from pipeline.tokenizer_engines import HARD_TEXTS, FastEngine

pytest.importorskip("fastokens")

SHARED_TOKENIZERS = ["gpt2.tiktoken", "cl100k_base.tiktoken", "gpt-neox-tokenizer.json"]


def shared_texts(shared, limit: int = 2000) -> list[str]:
    import gzip

    import pyarrow.parquet as pq

    texts = []
    for path in sorted((shared / "data/fineweb-edu-sample").glob("*.parquet")):
        texts += pq.read_table(path, columns=["text"]).column(0).to_pylist()[: limit // 2]
    for path in sorted((shared / "data/dolma-sample").glob("*.gz")):
        with gzip.open(path, "rt") as f:
            texts += [json.loads(line)["text"] for _, line in zip(range(limit // 4), f)]
    return texts


@pytest.mark.slow
@pytest.mark.parametrize("name", SHARED_TOKENIZERS)
def test_fast_engine_gives_the_reference_ids_on_the_real_corpus(shared, name):
    fast = load_tokenizer(str(shared / "tokenizers" / name), engine="fast")
    reference = load_tokenizer(str(shared / "tokenizers" / name), engine="reference")
    assert fast.engine_identity()["library"] == "fastokens"
    assert reference.engine_identity()["library"] in ("tiktoken", "tokenizers")
    texts = shared_texts(shared) + list(HARD_TEXTS)
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
    import pipeline.tokenizer as tokenizer_mod

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
