"""One shard's digest for `pack stats` (scan.py's module docstring draws where it sits): what
its tokens give (id range, EOS positions, token frequencies, each row's last token), computed in
the thread that reads the shard, and where its padding is (`padding_spans`), which every
figure of scan.py leaves out. Padding is read from the segments (FORMAT.md): concat pads its
split's last row, best-fit any row, each a hash-0 segment that ends its row.
"""

from dataclasses import dataclass, field

import numpy as np

from longpack.pipeline.formats.base import ShardBlocks
from longpack.pipeline.tokenize.split import PAD_HASH


@dataclass
class Digest:
    """What one shard's tokens give, computed in the thread that reads the shard (numpy
    releases the GIL in these loops, so the read-ahead threads digest several shards at once)."""

    real: int  # tokens outside the padding
    lo: int | None
    hi: int | None
    counts: np.ndarray  # occurrences of each id < hi + 1 among the counted rows
    eos: np.ndarray | None  # flat positions of EOS among the real tokens (None: EOS unknown)
    last: np.ndarray  # each row's last token: a segment at offset 0 opens a document after EOS
    over_vocab_row: int | None  # the first row with an id >= vocab_size (when one was given)
    pad: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))  # padding_spans
    pad_not_eos_row: int | None = None  # the first row whose padding holds an id other than EOS


def padding_spans(segments: np.ndarray | None, rows: int, seq: int) -> np.ndarray:
    """The shard's padding as [k, 2] flat (start, end) positions (row x seq + offset), sorted
    and disjoint: a segment of hash 0 runs to the next segment's start, else to the shard's end.
    A best-fit row's padding is its last segment, so it ends at the row's end (the next row
    has a segment at offset 0); concat's one padded row is its split's last, so it ends at the
    shard's end. Out-of-range rows and offsets (SplitScan names them) are clipped."""
    if segments is None or not len(segments):
        return np.zeros((0, 2), np.int64)
    size = rows * seq
    at = (np.minimum(segments[:, 0], rows).astype(np.int64) * seq
          + np.minimum(segments[:, 1], seq).astype(np.int64))
    order = np.argsort(np.minimum(at, size), kind="stable")
    at, pad = np.minimum(at, size)[order], segments[order, 2] == PAD_HASH
    spans = np.stack([at, np.append(at[1:], size)], axis=1)[pad]
    return spans[spans[:, 1] > spans[:, 0]]


def in_spans(pos: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Whether each flat position is in one of the (sorted, disjoint) spans."""
    i = np.searchsorted(spans[:, 0], pos, side="right") - 1
    return (i >= 0) & (pos < spans[np.maximum(i, 0), 1]) if len(spans) else np.zeros(
        np.shape(pos), bool)


def padding_before(pos: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Padding tokens at flat positions below each of `pos` (anywhere: in a span or not)."""
    pos = np.asarray(pos, np.int64)
    if not len(spans):
        return np.zeros(pos.shape, np.int64)
    sizes = spans[:, 1] - spans[:, 0]
    before = np.concatenate([[0], np.cumsum(sizes)])
    k = np.searchsorted(spans[:, 0], pos, side="right") - 1  # the last span starting at or before
    inside = np.clip(pos - spans[np.maximum(k, 0), 0], 0, sizes[np.maximum(k, 0)])
    return np.where(k >= 0, before[np.maximum(k, 0)] + inside, 0)


def minus_padding(pos: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Flat positions of real tokens -> their positions among the shard's real tokens (the
    padding before each taken out): where they are in the split's stream of documents."""
    return pos - padding_before(pos, spans) if len(spans) else pos


def _real_mask(spans: np.ndarray, a: int, b: int) -> np.ndarray:
    """Which of the flat positions [a, b) are real tokens."""
    lo = int(np.searchsorted(spans[:, 1], a, side="right"))
    hi = int(np.searchsorted(spans[:, 0], b, side="left"))
    edges = np.clip(spans[lo:hi], a, b).reshape(-1) - a  # start, end, start, end, ...
    runs = np.diff(np.concatenate([[0], edges, [b - a]]))  # real, padding, real, ...
    return np.repeat(np.arange(len(runs)) % 2 == 0, runs)


def digest(shard: ShardBlocks, eos_id: int | None, count_every: int = 1,
           vocab_size: int | None = None) -> Digest:
    """One pass over the shard's blocks of rows; each block is read several times (id range,
    EOS, frequencies) while it is in the CPU's cache, not the whole shard from memory each time.
    Token frequencies come from every `count_every`-th row (rows 0, k, 2k, ... of the shard):
    counting every token costs several times the rest of this digest, so the default report
    counts a 1/VOCAB_SAMPLE sample and --verify counts every token. Id range and EOS use every
    token.

    Only the real tokens count. A block's padding (any best-fit row's end, concat's last row)
    is found from its spans; when it is all the pad id (EOS, as FORMAT.md has it: the block's
    EOS outside the real tokens are as many as its padding tokens), the figures are taken over
    the whole block and the padding taken back out of them (the EOS among the spans dropped,
    the pad id's count lowered), so a best-fit block, padded in most rows, is never copied; otherwise
    (damage, or no EOS id to tell) its real tokens are copied out by a mask, and the first row
    whose padding holds another id is kept for --verify."""
    seq = shard.seq
    spans = padding_spans(shard.segments, shard.rows, seq)
    real = shard.rows * seq - int((spans[:, 1] - spans[:, 0]).sum())
    lo = hi = over = pad_not_eos = None
    counts = np.zeros(0, np.int64)
    eos, last = [], []
    for first, rows in shard.blocks:
        if seq:
            last.append(rows[:, -1].copy())  # the block's buffer is reused for the next one
        flat, a = rows.reshape(-1), first * seq
        bounds = padding_before(np.array([a, a + flat.size]), spans)
        padding = int(bounds[1] - bounds[0])  # padding tokens in this block
        at = find_rare(flat, eos_id) if eos_id is not None else None
        if padding and at is not None:
            real_at = at[~in_spans(a + at, spans)]
            if len(at) - len(real_at) == padding:  # every pad token is EOS
                at, mask = real_at, None
            else:
                mask = _real_mask(spans, a, a + flat.size)
                if pad_not_eos is None:
                    pad_not_eos = first + int(np.flatnonzero(~mask & (flat != eos_id))[0]) // seq
                at = at[mask[at]]
        else:
            mask = _real_mask(spans, a, a + flat.size) if padding else None
        if padding == flat.size:
            continue  # padding only
        if at is not None:
            eos.append(a + at)
        ids = flat if mask is None else flat[mask]
        top, bottom = int(ids.max()), int(ids.min())
        if mask is None and padding and not len(at) and eos_id in (top, bottom):
            rest = flat[flat != eos_id]  # the real tokens: the pad id is none of theirs here
            top, bottom = int(rest.max()), int(rest.min())
        hi, lo = (top, bottom) if hi is None else (max(hi, top), min(lo, bottom))
        if vocab_size is not None and over is None and top >= vocab_size:
            bad = np.flatnonzero(flat >= vocab_size)
            bad = bad[~in_spans(a + bad, spans)] if mask is None else bad[mask[bad]]
            over = first + int(bad[0]) // seq
        if count_every == 1:
            counts = _add_counts(counts, ids, eos_id, padding if mask is None else 0)
        else:
            skip = -first % count_every
            picked = rows[skip::count_every]
            if mask is not None:
                counts = _add_counts(counts, picked[mask.reshape(len(rows), seq)[skip::count_every]])
            else:
                starts = a + (skip + count_every * np.arange(len(picked))) * seq
                pads = padding_before(starts + seq, spans) - padding_before(starts, spans)
                counts = _add_counts(counts, picked.reshape(-1), eos_id, int(pads.sum()))
    return Digest(real, lo, hi, counts,
                  None if eos_id is None else np.concatenate([np.zeros(0, np.int64), *eos]),
                  np.concatenate([np.zeros(0, shard.dtype), *last]), over, spans, pad_not_eos)


def _add_counts(counts: np.ndarray, ids: np.ndarray, pad_id: int | None = None,
                padding: int = 0) -> np.ndarray:
    """`counts` plus the occurrences in `ids`, `padding` of which are pad tokens (`pad_id`) to
    leave out."""
    got = np.bincount(ids)
    if padding:
        got[pad_id] -= padding
    if len(got) > len(counts):
        counts = np.concatenate([counts, np.zeros(len(got) - len(counts), np.int64)])
    counts[: len(got)] += got
    return counts


def find_rare(flat: np.ndarray, value: int) -> np.ndarray:
    """np.flatnonzero(flat == value), faster for a value that is rare (EOS: one per document):
    one vectorised compare over the mask's 8-byte words finds the few words that hold a hit,
    and only those are looked into byte by byte."""
    hit = flat == value
    whole = len(hit) // 8 * 8
    words = np.flatnonzero(hit[:whole].view(np.uint64) != 0)
    word, byte = np.nonzero(hit[:whole].reshape(-1, 8)[words])
    return np.concatenate([words[word] * 8 + byte, whole + np.flatnonzero(hit[whole:])])
