"""Turn one batch of texts into documents ready to pack (runs in a worker thread).

Per text: the token ids with BOS/EOS in the output dtype, the document hash (of its UTF-8 bytes)
and its split; lone surrogates in a text make it a skip, as does a text no tokenizer engine can
encode. The tokenizer releases the GIL, so `--workers` threads run in parallel, and the result
is a pure function of the batch, which is why the output depends neither on the worker count nor
on the engine (a sample of documents is checked against the reference library as it goes).
"""

from dataclasses import dataclass, field

import numpy as np

from longpack.core import TokenizerError
from longpack.pipeline.read.records import INVALID_UTF8, UNENCODABLE, Skip
from longpack.pipeline.tokenize.engines import first_mismatch
from longpack.pipeline.tokenize.split import Splitter, doc_hash
from longpack.pipeline.tokenize.tokenizer import Tokenizer, Unencodable


@dataclass
class EncodedBatch:
    """`docs[i]` is record i's Skip, or (split index 0/1, document length in tokens)."""

    docs: list = field(default_factory=list)
    tokens: tuple = ()  # per split: the documents' tokens concatenated, in record order
    hashes: tuple = ()  # per split: uint64 hash of each document
    text_bytes: tuple = ()  # per split: UTF-8 bytes of each document
    bounds: tuple = ()  # per split: document i's tokens are tokens[bounds[i]:bounds[i + 1]]


def encode_batch(records: list[tuple[int, object]], tok: Tokenizer, splitter: Splitter,
                 bos_id: int | None) -> EncodedBatch:
    # Hash first: hashing takes the text's UTF-8 bytes, so a lone surrogate is found here, the
    # same way for every tokenizer, before a tokenizer sees it (tiktoken raises
    # UnicodeEncodeError on one, Hugging Face tokenizers a TypeError).
    out = EncodedBatch()
    texts, text_hashes, numbers = [], [], []
    for n, value in records:
        if isinstance(value, Skip):
            out.docs.append(value)
            continue
        try:
            text_hashes.append(doc_hash(value))
        except UnicodeEncodeError as e:
            out.docs.append(Skip(INVALID_UTF8, f"lone surrogate at character {e.start}"))
            continue
        texts.append(value)
        numbers.append(n)
        out.docs.append(None)  # filled below, once its length is known
    slots = [i for i, d in enumerate(out.docs) if d is None]
    ids, offsets = _encode(tok, texts, text_hashes, numbers, slots, out.docs)
    head = 0 if bos_id is None else 1
    parts: tuple[list, list] = ([], [])
    hashes: tuple[list, list] = ([], [])
    nbytes: tuple[list, list] = ([], [])
    for i, (slot, text, h) in enumerate(zip(slots, texts, text_hashes)):
        doc_ids = ids[offsets[i]:offsets[i + 1]]
        split = int(splitter.is_val(h))
        parts[split].append(doc_ids)
        hashes[split].append(h)
        nbytes[split].append(len(text) if text.isascii() else len(text.encode("utf-8")))
        out.docs[slot] = (split, head + len(doc_ids) + 1)
    marked = [_with_markers(p, tok.dtype, bos_id, tok.eos_id) for p in parts]
    out.tokens, out.bounds = tuple(m[0] for m in marked), tuple(m[1] for m in marked)
    out.hashes = tuple(np.array(h, np.uint64) for h in hashes)
    out.text_bytes = tuple(np.array(n, np.int64) for n in nbytes)
    return out


def _encode(tok: Tokenizer, texts: list, text_hashes: list, numbers: list, slots: list,
            docs: list) -> tuple[np.ndarray, np.ndarray]:
    """encode_flat over the texts. A text no engine can encode becomes an UNENCODABLE skip
    (removed from the four lists in place); with the fast engine, the sampled documents are
    re-encoded by the reference library and any difference stops the build."""
    while True:
        try:
            ids, offsets = tok.encode_flat(texts)
            break
        except Unencodable as e:
            docs[slots[e.index]] = Skip(UNENCODABLE, "no tokenizer engine could encode it")
            for column in (texts, text_hashes, numbers, slots):
                del column[e.index]
    if tok.engine is not tok.reference:
        every = tok.reference.sample_every  # engines.SAMPLE_EVERY: sized per library
        picks = [i for i, h in enumerate(text_hashes) if h % every == 0]
        bad = first_mismatch(tok.reference, texts, ids, offsets, picks)
        if bad is not None:
            raise EngineMismatch(numbers[bad], texts[bad], tok)
    return ids, offsets


class EngineMismatch(TokenizerError):
    """The fast engine gave other ids than the reference library for a sampled document."""

    def __init__(self, record: int, text: str, tok: Tokenizer):
        fast, ref = tok.engine_identity(), tok.reference
        super().__init__(
            f"record {record} ({text[:40]!r}...): {fast['library']} {fast['version']} and "
            f"{ref.library} {ref.version} give different ids for it with tokenizer {tok.name}; "
            "nothing was written from it: re-run with --tokenizer-engine reference to resume")
        self.record = record


def _with_markers(docs: list[np.ndarray], dtype, bos_id: int | None, eos_id: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """[BOS] + ids + [EOS] for each document, concatenated in one allocation, and the
    document bounds (len(docs) + 1 offsets)."""
    head = 0 if bos_id is None else 1
    lengths = np.array([len(d) for d in docs], np.int64) + head + 1
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if len(docs) else 0, dtype)
    if len(docs):
        out[ends - 1] = eos_id
        if head:
            out[ends - lengths] = bos_id
        for d, start in zip(docs, ends - lengths + head):
            out[start:start + len(d)] = d
    return out, np.concatenate([[0], ends])
