"""What turns texts into token ids: the reference library, or fastokens, which must agree with it.

    ReferenceEngine   tiktoken (a .tiktoken ranks file / encoding name) or Hugging Face
                      `tokenizers` (a tokenizer.json): the libraries that define the ids.
    FastEngine        fastokens (Rust BPE, releases the GIL), loaded from the same file with the
                      same pattern and special tokens; 4-6x tiktoken's throughput here
                      (docs/BENCHMARKS.md).

Both give `encode_flat(texts) -> (ids uint32, offsets int64)`: text i's ids are
ids[offsets[i]:offsets[i + 1]], special-token strings encoded as plain text. The ids never depend
on the engine; that is what the guards check:
- `check_agreement` encodes HARD_TEXTS (unicode classes, CJK, emoji, whitespace runs, digits,
  contractions, a literal <|endoftext|>, 100 kB runs of one character) with both when the fast
  engine is loaded, and refuses it on any difference;
- encode.py re-encodes a deterministic sample of the build's documents with the reference.
"""

import base64
import os
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from longpack.core import TokenizerError

HARD_TEXTS = (
    "Hello world", "hello <|endoftext|> world", "<|endoftext|>", "a<|endoftext|>b<|fim_prefix|>",
    "I'm you're they'll we've she'd it's DON'T Can'T", "1 12 123 1234 12345 3.14159 1,000,000",
    "日本語のテキストと漢字、ひらがな。中文文本，标点符号。한국어 텍스트",
    "Ελληνικά κείμενα; кириллица — ёж", "emoji 👩‍👩‍👧‍👦 🇺🇸 🙂🙃 ✨",
    "tabs\tand\t\tnewlines\n\n\r\n  \n   trailing   ", "\u00a0\u2003\u3000 spaces",
    "e\u0301 combining ǅ title case ß ﬁ ligature", "\x00\x01\x7f control \ufeff bom \ufffd",
    "x" * 100_000, " " * 100_000, "\n" * 100_000, "9" * 100_000, "👍" * 20_000,
    "def f(x):\n    return x ** 2  # code\n\n\tpass", "https://example.com/a?b=c&d=e#f",
)


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def concat_ids(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-text id arrays as encode_flat's (ids uint32, offsets int64)."""
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    ids = np.concatenate(parts).astype(np.uint32, copy=False) if parts else np.zeros(0, np.uint32)
    return ids, offsets


# With the fast engine, documents whose hash is a multiple of the reference's `sample_every` are
# also encoded by the reference library and compared (the same ones on every run), sized by
# tools/bench_reference_sample.py (docs/BENCHMARKS.md) to cost under 3% of the build's CPU:
# - tiktoken, 1 in 128 (~0.8% of documents): ~1.7% of the steady CPU (1 in 64 would be ~3.4%).
#   A wrong engine the load-time check misses that changes 7% of documents is caught with 90%
#   chance within ~4,250 documents (rarer ones take N / p documents whatever N; ~N - 1 wrong
#   documents are written before the stop).
# - Hugging Face `tokenizers`, 1 in 2048: it is ~7x slower than tiktoken, so 1 in 128 cost 18-30%
#   of the build; 1 in 2048 is ~2.0% (1 in 1024: ~3.9%), expected over the documents.
SAMPLE_EVERY = {"tiktoken": 128, "tokenizers": 2048}


class ReferenceEngine:
    name = "reference"

    def __init__(self, impl, kind: str):
        self.impl, self.kind = impl, kind
        self.library = "tiktoken" if kind == "tiktoken" else "tokenizers"
        self.version = package_version(self.library)
        self.sample_every = SAMPLE_EVERY[self.library]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "tiktoken":
            return concat_ids([self.impl.encode_to_numpy(t, disallowed_special=()) for t in texts])
        encodings = self.impl.encode_batch_fast(texts, add_special_tokens=False)
        return concat_ids([np.asarray(e.ids, np.uint32) for e in encodings])


class FastEngine:
    name = "fast"
    library = "fastokens"

    def __init__(self, impl):
        self.impl = impl
        self.version = package_version(self.library)

    @classmethod
    def load(cls, kind: str, path: Path | None, ranks: dict[bytes, int] | None, pattern: str,
             special_tokens: dict[str, int]) -> "FastEngine":
        """From the tokenizer.json, or from the ranks (a file written from them when the
        encoding came by name from tiktoken's cache, which has no stable path)."""
        # pack build's --workers threads are the parallelism; fastokens' own BPE helper threads
        # only crowd the same cores (a quiet 2-core build: ~0.5 CPU s and 4-6% wall less without
        # them, docs/BENCHMARKS.md). Read when fastokens starts its pool; a user's value wins.
        os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
        import fastokens

        if kind == "huggingface":
            return cls(fastokens.Tokenizer.from_file(str(path)))
        if path is not None:
            return cls(fastokens.Tokenizer.from_tiktoken(str(path), pattern=pattern,
                                                         special_tokens=special_tokens))
        with tempfile.NamedTemporaryFile(suffix=".tiktoken") as f:
            for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
                f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
            f.flush()
            return cls(fastokens.Tokenizer.from_tiktoken(f.name, pattern=pattern,
                                                         special_tokens=special_tokens))

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = self.impl.encode_batch_flat(texts, add_special_tokens=False,
                                                   split_special_tokens=True)
        return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)


def gave_up(e: BaseException) -> bool:
    """The engine gave up on a text rather than failing on our input: tiktoken's regex runs out
    of backtracking stack on ~1 MB runs of whitespace with the o200k pattern (a ValueError
    from encode_to_numpy, a Rust panic -- pyo3's PanicException, a BaseException -- from
    encode_ordinary)."""
    return type(e).__name__ == "PanicException" or (
        isinstance(e, ValueError) and "Regex error" in str(e))


def first_mismatch(reference: ReferenceEngine, texts: list[str], ids: np.ndarray,
                   offsets: np.ndarray, picks) -> int | None:
    """The first index in `picks` whose ids (text i's are ids[offsets[i]:offsets[i + 1]]) differ
    from the reference's; None if all agree. A text the reference library itself cannot encode
    (it gives up) cannot be compared and is passed over."""
    picks = list(picks)
    if not picks:
        return None
    try:
        ids_r, off_r = reference.encode_flat([texts[i] for i in picks])
    except BaseException as e:
        if not gave_up(e):
            raise
        ids_r = off_r = None
    for j, i in enumerate(picks):
        if ids_r is not None:
            want = ids_r[off_r[j]:off_r[j + 1]]
        else:  # the reference gave up on one: compare one by one
            try:
                want, _ = reference.encode_flat([texts[i]])
            except BaseException as e:
                if not gave_up(e):
                    raise
                continue
        if not np.array_equal(ids[offsets[i]:offsets[i + 1]], want):
            return i
    return None


def check_agreement(fast: FastEngine, reference: ReferenceEngine, tokenizer: str) -> None:
    texts = list(HARD_TEXTS)
    i = first_mismatch(reference, texts, *fast.encode_flat(texts), range(len(texts)))
    if i is not None:
        raise TokenizerError(
            f"fastokens {fast.version} encodes {HARD_TEXTS[i][:40]!r} differently from "
            f"{reference.library} {reference.version} with tokenizer {tokenizer}; pass "
            "--tokenizer-engine reference (or update fastokens)")
