"""Turn one batch of texts into documents ready to pack (runs in a worker thread).

Per text: UTF-8 bytes (lone surrogates are a skip), the document hash and split, and the token
ids with BOS/EOS in the output dtype. The tokenizer and BLAKE2b release the GIL, so `--workers`
threads run these in parallel; the result is a pure function of the batch, which is why the
output does not depend on the worker count.
"""

import numpy as np

from pipeline.records import INVALID_UTF8, Skip
from pipeline.split import Splitter, doc_hash
from pipeline.tokenizer import Tokenizer


def encode_batch(records: list[tuple[int, object]], tok: Tokenizer, splitter: Splitter,
                 bos_id: int | None) -> list:
    """One entry per record: the record's Skip, or (is_val, hash, tokens, utf8_bytes)."""
    out: list = []
    texts, where = [], []
    for _, value in records:
        if isinstance(value, Skip):
            out.append(value)
            continue
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as e:
            out.append(Skip(INVALID_UTF8, f"lone surrogate at character {e.start}"))
            continue
        out.append((doc_hash(data), len(data)))
        texts.append(value)
        where.append(len(out) - 1)
    head = 0 if bos_id is None else 1
    for i, ids in zip(where, tok.encode_batch(texts)):
        h, nbytes = out[i]
        doc = np.empty(head + len(ids) + 1, tok.dtype)
        if head:
            doc[0] = bos_id
        doc[head:-1] = ids
        doc[-1] = tok.eos_id
        out[i] = (splitter.is_val(h), h, doc, nbytes)
    return out
