"""Turn one batch of texts into documents ready to pack (runs in a worker thread).

Per text: the token ids with BOS/EOS in the output dtype, the document hash (of its UTF-8 bytes)
and its split; lone surrogates in a text make it a skip. The tokenizer releases the GIL, so
`--workers` threads run in parallel, and the result is a pure function of the batch, which is
why the output does not depend on the worker count.
"""

from dataclasses import dataclass, field

import numpy as np

from pipeline.records import INVALID_UTF8, Skip
from pipeline.split import Splitter, doc_hash
from pipeline.tokenizer import Tokenizer


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
    texts, text_hashes = [], []
    for _, value in records:
        if isinstance(value, Skip):
            out.docs.append(value)
            continue
        try:
            text_hashes.append(doc_hash(value))
        except UnicodeEncodeError as e:
            out.docs.append(Skip(INVALID_UTF8, f"lone surrogate at character {e.start}"))
            continue
        texts.append(value)
        out.docs.append(None)  # filled below, once its length is known
    ids = tok.encode_batch(texts)
    head = 0 if bos_id is None else 1
    parts: tuple[list, list] = ([], [])
    hashes: tuple[list, list] = ([], [])
    nbytes: tuple[list, list] = ([], [])
    slots = (i for i, d in enumerate(out.docs) if d is None)
    for slot, text, h, doc_ids in zip(slots, texts, text_hashes, ids):
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
