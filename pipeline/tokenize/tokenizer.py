"""Load a tokenizer from a tiktoken name, a `.tiktoken` ranks file or a Hugging Face tokenizer.json.

Offline use is first-class: a file path never touches the network. A tiktoken name (gpt2,
cl100k_base, ...) is fetched by tiktoken itself (and cached in TIKTOKEN_CACHE_DIR); when that
fails, the ranks file shipped with the package (`pipeline/samples/`, SAMPLE_RANKS) stands in for
it where it is there and has the official file's sha256, and otherwise the error names the file
to pass instead.

A `.tiktoken` file is named by what it is, its sha256 against the official files' (gpt2 /
r50k_base, p50k_base, cl100k_base, o200k_base): the real GPT-2 ranks are "gpt2" whatever the
file is called. A file of no known hash takes the pattern and special tokens of the encoding
its name says (`mine/gpt2.tiktoken`: GPT-2's) and a name that claims no known encoding:
`gpt2-1a2b3c4d`, the stem and the first 8 hex digits of its sha256. A file's `source` is
recorded as an absolute path, so it names the same file from any folder. What a build keeps of
its tokenizer, and how a reader loads it back: kept.py.

Text is always encoded as ordinary text: a literal "<|endoftext|>" inside a document becomes the
tokens of those characters, never the EOS id, so splitting packed rows at EOS gives back exactly
the input documents.
"""

import base64
import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from longpack.core import TokenizerError, sha256_file
from longpack.pipeline.config import TOKENIZER_ENGINES
from longpack.pipeline.tokenize.engines import (
    FastEngine,
    ReferenceEngine,
    check_agreement,
    concat_ids,
    gave_up,
)

ENDOFTEXT = "<|endoftext|>"

# tiktoken's own encodings (facts from tiktoken_ext/openai_public.py, tiktoken 0.14): the sha256 of
# each ranks file, its special tokens and its pre-tokenization regex. They let a local
# `.tiktoken` file be used with no network. gpt2 and r50k_base have the same ranks.
_R50K_PAT = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
TIKTOKEN_ENCODINGS = {
    "gpt2": ("306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
             _R50K_PAT, {ENDOFTEXT: 50256}),
    "r50k_base": ("306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
                  _R50K_PAT, {ENDOFTEXT: 50256}),
    "p50k_base": ("94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
                  _R50K_PAT, {ENDOFTEXT: 50256}),
    "cl100k_base": ("223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
                    _CL100K_PAT, {ENDOFTEXT: 100257, "<|fim_prefix|>": 100258,
                                  "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
                                  "<|endofprompt|>": 100276}),
    "o200k_base": ("446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
                   _O200K_PAT, {ENDOFTEXT: 199999, "<|endofprompt|>": 200018}),
}
# tiktoken names whose ranks file the package may ship (pipeline/samples/, another part's): the
# offline stand-in for tiktoken's download, used only when its sha256 is the official one.
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
SAMPLE_RANKS = {"gpt2": "gpt2.tiktoken", "r50k_base": "gpt2.tiktoken"}
# Names a Hugging Face tokenizer gives its end- and start-of-document tokens, in order of preference.
HF_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
HF_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|bos|>")


@dataclass
class Tokenizer:
    """A loaded tokenizer: `encode_flat` for packing, `identity` for the manifest's fingerprint
    (which never names the engine: the ids do not depend on it), `engine_identity` for the rest."""

    name: str
    kind: str  # "tiktoken" or "huggingface"
    source: str  # the name or file it was loaded from
    sha256: str  # of the ranks file / tokenizer.json (for a tiktoken name: of its canonical ranks file)
    vocab_size: int  # every token id is < vocab_size
    eos_id: int
    bos_id: int | None
    reference: ReferenceEngine = field(repr=False)
    _load_fast: Callable[[], FastEngine] = field(repr=False)  # loads fastokens (_checked_fast)
    engine: FastEngine | ReferenceEngine | None = field(default=None, repr=False)
    engine_note: str | None = None  # why --tokenizer-engine auto chose the reference
    _fallback: FastEngine | ReferenceEngine | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def dtype(self) -> np.dtype:
        """The smallest unsigned dtype that holds every id: uint16 for GPT-2, uint32 for cl100k."""
        return np.dtype(np.uint16) if self.vocab_size <= 1 << 16 else np.dtype(np.uint32)

    def choose_engine(self, engine: str) -> None:
        if engine not in TOKENIZER_ENGINES:
            raise TokenizerError(f"--tokenizer-engine {engine!r}: choose one of "
                                 f"{', '.join(TOKENIZER_ENGINES)}")
        self.engine, self.engine_note = self.reference, None
        if engine == "reference":
            return
        try:
            self.engine = self._checked_fast()
        except (ImportError, TokenizerError) as e:
            if engine == "fast":
                raise TokenizerError(f"--tokenizer-engine fast: {e}") from None
            self.engine_note = str(e)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Ids (uint32) of every text concatenated and the offsets (int64, len(texts) + 1) of each
        text's ids; special-token strings are encoded as plain text. Releases the GIL inside the
        tokenizer, so worker threads run in parallel. Raises UnicodeEncodeError for a lone
        surrogate (encode.py finds those first). A text the engine gives up on (tiktoken's regex
        gives up on ~1 MB whitespace runs with o200k's pattern) is encoded by the other engine;
        `Unencodable` names a text neither can encode."""
        engine = self.engine or self.reference
        try:
            return engine.encode_flat(texts)
        except BaseException as e:
            if not gave_up(e):
                raise
        parts = []
        for i, text in enumerate(texts):
            for candidate in (engine, self._other_engine()):
                try:
                    ids, _ = candidate.encode_flat([text]) if candidate else (None, None)
                except BaseException as e:
                    if not gave_up(e):
                        raise
                    continue
                if ids is not None:
                    break
            else:
                raise Unencodable(i)
            parts.append(ids)
        return concat_ids(parts)

    def _checked_fast(self) -> FastEngine:
        """fastokens, loaded, and refused unless it gives the reference's ids for every text of
        engines.HARD_TEXTS."""
        fast = self._load_fast()
        check_agreement(fast, self.reference, self.source)
        return fast

    def _other_engine(self):
        """The engine a give-up falls back to, loaded once: fastokens when the reference
        gave up (only where it loads and passes the agreement check), else the reference."""
        if self.engine is not None and self.engine is not self.reference:
            return self.reference
        with self._lock:
            if self._fallback is None:
                try:
                    self._fallback = self._checked_fast()
                except (ImportError, TokenizerError):
                    self._fallback = False
            return self._fallback or None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (uint32) of each text: views into one `encode_flat` result."""
        ids, offsets = self.encode_flat(texts)
        return [ids[offsets[i]:offsets[i + 1]] for i in range(len(texts))]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.kind == "tiktoken":
            return self.reference.impl.decode(ids)
        return self.reference.impl.decode(ids, skip_special_tokens=False)

    def decodable(self) -> np.ndarray:
        """A bool per id below vocab_size: True where the id is a token (a ranks file or a
        tokenizer.json may leave holes, e.g. cl100k's 100256), so generation samples only ids
        that decode."""
        impl = self.reference.impl
        if self.kind == "tiktoken":
            def known(i):
                try:
                    impl.decode_single_token_bytes(i)
                    return True
                except KeyError:
                    return False
        else:
            def known(i):
                return impl.id_to_token(i) is not None
        return np.array([known(i) for i in range(self.vocab_size)], dtype=bool)

    def identity(self) -> dict:
        return {"name": self.name, "kind": self.kind, "source": self.source,
                "sha256": self.sha256, "vocab_size": self.vocab_size,
                "eos_id": self.eos_id, "bos_id": self.bos_id, "dtype": self.dtype.name}

    def engine_identity(self) -> dict:
        """Which library encoded (for the manifest, outside the fingerprint)."""
        engine = self.engine or self.reference
        out = {"engine": engine.name, "library": engine.library, "version": engine.version}
        if self.engine_note:
            out["note"] = f"fastokens not used: {self.engine_note}"
        return out


class Unencodable(Exception):
    """Text `index` of a batch could be encoded by no engine."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


def load_tokenizer(spec: str, bos: bool = False, engine: str = "reference",
                   encoding: str | None = None) -> Tokenizer:
    """`spec` is a tiktoken encoding name, a `.tiktoken` ranks file, or a tokenizer.json.
    `engine` (auto, fast, reference) picks what encodes; the ids are the same whichever.
    `encoding`: the encoding whose pattern and special tokens a ranks file of no known hash
    uses, where its file name does not say (a build's copy, OUT/tokenizer.tiktoken)."""
    path = Path(spec).expanduser()
    prefetch = engine != "reference"  # start loading fastokens beside the reference library
    if path.is_file():
        if path.suffix == ".json":
            tok = _load_huggingface(path, prefetch)
        else:
            tok = _load_tiktoken_file(path, prefetch, encoding)
    elif spec in TIKTOKEN_ENCODINGS:
        tok = load_tiktoken_name(spec)
    elif path.suffix in (".json", ".tiktoken") or os.sep in spec:
        raise TokenizerError(f"tokenizer file not found: {spec}")
    else:
        raise TokenizerError(
            f"unknown tokenizer {spec!r}: pass one of {', '.join(TIKTOKEN_ENCODINGS)}, "
            "a path to a .tiktoken ranks file, or a path to a Hugging Face tokenizer.json")
    if bos and tok.bos_id is None:
        raise TokenizerError(
            f"--bos: tokenizer {tok.name} has no beginning-of-document token distinct from its "
            "EOS; drop --bos (documents are still separated by EOS)")
    if not bos:
        tok.bos_id = None
    tok.choose_engine(engine)
    return tok


def canonical_ranks(ranks: dict[bytes, int]) -> bytes:
    """The .tiktoken serialization ("base64 rank" lines in rank order) of the official files."""
    return b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
                    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]))


def _ranks_sha256(ranks: dict[bytes, int]) -> str:
    """sha256 of the canonical .tiktoken serialization, which equals the sha256 of the official
    ranks file."""
    return hashlib.sha256(canonical_ranks(ranks)).hexdigest()


def _in_background(load: Callable[[], FastEngine] | bool) -> Callable[[], FastEngine] | None:
    """Start `load` in a thread now and return what waits for its engine (or raises its
    error). fastokens builds its tables with the GIL released (~0.25 s for GPT-2's ranks), so
    it overlaps the reference library's load and the rest of start-up."""
    if not load:
        return None
    pool = ThreadPoolExecutor(1, thread_name_prefix="load-fastokens")
    future = pool.submit(load)
    pool.shutdown(wait=False)
    return future.result


def _tiktoken_tokenizer(enc, name: str, source: str, sha256: str, path: Path | None,
                        loading: Callable[[], FastEngine] | None = None) -> Tokenizer:
    if ENDOFTEXT not in enc._special_tokens:
        raise TokenizerError(f"tiktoken encoding {name} has no {ENDOFTEXT} token to end documents")
    reference = ReferenceEngine(enc, "tiktoken")

    def load_fast() -> FastEngine:
        try:
            return loading() if loading else FastEngine.load(
                "tiktoken", path, None if path else enc._mergeable_ranks, enc._pat_str,
                enc._special_tokens)
        except ImportError:
            raise
        except Exception as e:  # ranks fastokens refuses (a token that is no merge of two
            # lower-ranked ones), which tiktoken takes: under auto the reference encodes
            raise TokenizerError(f"fastokens cannot load {source} ({e})") from None

    return Tokenizer(name=name, kind="tiktoken", source=source, sha256=sha256,
                     vocab_size=enc.n_vocab, eos_id=enc.eot_token, bos_id=None,
                     reference=reference, _load_fast=load_fast)


def load_tiktoken_name(name: str) -> Tokenizer:
    import tiktoken

    try:
        enc = tiktoken.get_encoding(name)
    except Exception as e:  # requests/urllib/blobfile errors when offline
        shipped = _shipped_ranks(name)
        if shipped is None:
            raise TokenizerError(
                f"could not load tiktoken encoding {name!r} ({type(e).__name__}: no network?); "
                f"pass its ranks file instead, e.g. --tokenizer path/to/{name}.tiktoken") from None
        tok = _load_tiktoken_file(shipped, False, name)
        tok.source = name  # the same identity as tiktoken's download: the same build
        return tok
    return _tiktoken_tokenizer(enc, name, name, _ranks_sha256(enc._mergeable_ranks), None)


def _shipped_ranks(name: str) -> Path | None:
    """The package's own copy of an encoding's ranks file (SAMPLE_RANKS), where it is there
    with the official sha256."""
    path = SAMPLES / SAMPLE_RANKS[name] if name in SAMPLE_RANKS else None
    if path is None or not path.is_file():
        return None
    return path if sha256_file(path) == TIKTOKEN_ENCODINGS[name][0] else None


def _load_tiktoken_file(path: Path, prefetch: bool, encoding: str | None = None) -> Tokenizer:
    """A ranks file, named by its sha256 (the module docstring)."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    sha = sha256_file(path)
    by_hash = [n for n, (h, _, _) in TIKTOKEN_ENCODINGS.items() if h == sha]
    like = encoding or path.stem
    if by_hash:  # gpt2 and r50k_base share a file: the one asked for, else the first
        name = like if like in by_hash else by_hash[0]
        pattern_of = name
    elif like in TIKTOKEN_ENCODINGS:
        name, pattern_of = f"{like}-{sha[:8]}", like
    else:
        raise TokenizerError(
            f"{path}: unknown .tiktoken ranks file (sha256 {sha[:12]}…, none of the official "
            f"files'); name it after the encoding whose pattern and special tokens it uses "
            f"({', '.join(TIKTOKEN_ENCODINGS)}), e.g. {path.with_name('gpt2.tiktoken')}")
    _, pat_str, special_tokens = TIKTOKEN_ENCODINGS[pattern_of]
    loading = _in_background(prefetch and (
        lambda: FastEngine.load("tiktoken", path, None, pat_str, special_tokens)))
    try:
        ranks = load_tiktoken_bpe(str(path))
    except Exception as e:
        raise TokenizerError(f"{path}: not a .tiktoken ranks file ({e})") from None
    enc = tiktoken.Encoding(name=name, pat_str=pat_str, mergeable_ranks=ranks,
                            special_tokens=special_tokens)
    return _tiktoken_tokenizer(enc, name, os.path.abspath(path), sha, path, loading)


def _load_huggingface(path: Path, prefetch: bool) -> Tokenizer:
    loading = _in_background(prefetch and (lambda: FastEngine.load("huggingface", path, None,
                                                                    "", {})))
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise TokenizerError(
            f"{path} is a Hugging Face tokenizer.json; install the extra: pip install 'longpack[hf]'"
        ) from None
    try:
        impl = HFTokenizer.from_file(str(path))
    except Exception as e:
        raise TokenizerError(f"{path}: not a Hugging Face tokenizer.json ({e})") from None
    # Literal special-token strings inside a document stay text (see the module docstring).
    impl.encode_special_tokens = True
    vocab = impl.get_vocab(with_added_tokens=True)
    specials = {t.content for t in impl.get_added_tokens_decoder().values() if t.special}
    eos = next((n for n in HF_EOS_NAMES if n in specials), None)
    if eos is None:
        raise TokenizerError(
            f"{path}: no end-of-document token among its special tokens "
            f"(looked for {', '.join(HF_EOS_NAMES)})")
    bos = next((n for n in HF_BOS_NAMES if n in specials and n != eos), None)
    reference = ReferenceEngine(impl, "huggingface")

    def load_fast() -> FastEngine:
        try:
            return loading() if loading else FastEngine.load("huggingface", path, None, "", {})
        except ImportError:
            raise
        except Exception as e:  # a tokenizer.json fastokens does not support
            raise TokenizerError(f"fastokens cannot load {path} ({e})") from None

    return Tokenizer(name=path.stem, kind="huggingface", source=os.path.abspath(path),
                     sha256=sha256_file(path), vocab_size=max(vocab.values()) + 1,
                     eos_id=vocab[eos], bos_id=vocab[bos] if bos else None,
                     reference=reference, _load_fast=load_fast)
