"""`pack stats`: what a build holds, whether it is sound, and what it will train.

    open_output (files.py)         the build's folder, manifest and splits, or a one-line
                                         error saying what the folder lacks
One pass over each split, shard by shard (memory: the few shards in flight, not the split):

    SplitReader.read_blocks (formats/shards.py)  a shard's rows block by block + its segments, or a
                                         ShardError -> a Problem
      -> digest (in the reading thread)  id range, EOS positions, token frequencies, each block
                                         while it is in the CPU's cache
      -> SplitScan.add (in order)        padding, document lengths and boundaries, the ids'
                                         frequencies and range; with --verify also segment /
                                         EOS agreement, continued documents' hashes and
                                         id < vocab_size
      -> report                          per split + total, checks, recommendations (text or JSON)

Cheap checks always run (index present and readable, every shard file present with the size its
index gives (files.py), counts agree with the manifest, the build's copy of its tokenizer has
the manifest's sha256 (builds/identity.py)); --verify adds checksums and the row-level checks.
The val split is scanned first so that the train scan can check that no document is in both (by
hash).
docs/STATS.md documents the JSON keys.
"""

from dataclasses import dataclass, field

import numpy as np

from pipeline.formats.base import ShardBlocks, ShardFormat
from pipeline.tokenize.split import PAD_HASH

SPLITS = ("train", "val")
EXACT_LENGTHS = 1 << 16  # document lengths below this are counted exactly; longer ones kept as-is
TOP_TOKENS = 10
VOCAB_SAMPLE = 8  # without --verify, token frequencies come from every 8th row
FIX_REBUILD = "re-run the same pack build with --overwrite to rewrite it"


@dataclass
class Problem:
    file: str
    what: str
    fix: str = FIX_REBUILD
    row: int | None = None

    def line(self) -> str:
        where = f"{self.file}, row {self.row}" if self.row is not None else self.file
        return f"{where}: {self.what}; {self.fix}"


class DocLengths:
    """Exact distribution of document lengths in bounded memory: a count per length below
    EXACT_LENGTHS, and the rare longer documents kept individually."""

    def __init__(self):
        self.counts = np.zeros(EXACT_LENGTHS, np.int64)
        self.long: list[np.ndarray] = []

    def add(self, lengths: np.ndarray):
        short = lengths < EXACT_LENGTHS
        self.counts += np.bincount(lengths[short], minlength=EXACT_LENGTHS)
        if not short.all():
            self.long.append(lengths[~short])

    def summary(self) -> dict | None:
        long = np.sort(np.concatenate(self.long)) if self.long else np.zeros(0, np.int64)
        n = int(self.counts.sum()) + len(long)
        if n == 0:
            return None
        cum = np.cumsum(self.counts)

        def quantile(q: float) -> int:
            k = min(int(q * n), n - 1)  # the k-th smallest length (0-based)
            if k < cum[-1]:
                return int(np.searchsorted(cum, k, side="right"))
            return int(long[k - cum[-1]])

        total = float(np.dot(self.counts, np.arange(EXACT_LENGTHS))) + float(long.sum())
        top = int(long[-1]) if len(long) else int(np.flatnonzero(self.counts)[-1])
        edges = [1 << k for k in range(0, max(top, 1).bit_length() + 1)]
        hist = [int(self.counts[a:min(b, EXACT_LENGTHS)].sum()) +
                int(((long >= a) & (long < b)).sum()) for a, b in zip(edges, edges[1:])]
        return {"count": n, "mean": total / n, "median": quantile(0.5), "p10": quantile(0.1),
                "p90": quantile(0.9), "p99": quantile(0.99), "max": top,
                "histogram": {"edges": edges, "counts": hist}}


@dataclass
class Digest:
    """What one shard's tokens give, computed in the thread that reads the shard (numpy
    releases the GIL in these loops, so the read-ahead threads digest several shards at once)."""

    real: int  # tokens before the padding
    lo: int | None
    hi: int | None
    counts: np.ndarray  # occurrences of each id < hi + 1 among the counted rows
    eos: np.ndarray | None  # flat positions of EOS among the real tokens (None: EOS unknown)
    last: np.ndarray  # each row's last token: a segment at offset 0 opens a document after EOS
    over_vocab_row: int | None  # the first row with an id >= vocab_size (when one was given)


def digest(shard: ShardBlocks, eos_id: int | None, count_every: int = 1,
           vocab_size: int | None = None) -> Digest:
    """One pass over the shard's blocks of rows; each block is read several times (id range,
    EOS, frequencies) while it is in the CPU's cache, not the whole shard from memory each time.
    Token frequencies come from every `count_every`-th row (rows 0, k, 2k, ... of the shard):
    counting every token costs several times the rest of this digest, so the default report
    counts a 1/VOCAB_SAMPLE sample and --verify counts every token. Id range and EOS use every token."""
    seq = shard.seq
    real = shard.rows * seq
    if shard.segments is not None and len(shard.segments):
        pad = shard.segments[shard.segments[:, 2] == PAD_HASH]
        if len(pad):
            real = min(real, int(pad[0, 0]) * seq + int(pad[0, 1]))
    lo = hi = over = None
    counts = np.zeros(0, np.int64)
    eos, last = [], []
    for first, rows in shard.blocks:
        if seq:
            last.append(rows[:, -1].copy())  # the block's buffer is reused for the next one
        flat = rows.reshape(-1)[: max(0, real - first * seq)]
        if not len(flat):
            continue
        top, bottom = int(flat.max()), int(flat.min())
        hi, lo = (top, bottom) if hi is None else (max(hi, top), min(lo, bottom))
        if vocab_size is not None and over is None and top >= vocab_size:
            over = first + int(np.flatnonzero(flat >= vocab_size)[0]) // seq
        if eos_id is not None:
            eos.append(first * seq + find_rare(flat, eos_id))
        if count_every == 1:
            counts = _add_counts(counts, flat)
        else:
            picked = rows[-first % count_every::count_every]
            at = first + -first % count_every + count_every * np.arange(len(picked))
            real_in_picked = int(np.clip(real - at * seq, 0, seq).sum())  # padding comes last
            counts = _add_counts(counts, picked.reshape(-1)[:real_in_picked])
    return Digest(real, lo, hi, counts,
                  None if eos_id is None else np.concatenate([np.zeros(0, np.int64), *eos]),
                  np.concatenate([np.zeros(0, shard.dtype), *last]), over)


def _add_counts(counts: np.ndarray, ids: np.ndarray) -> np.ndarray:
    got = np.bincount(ids)
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


@dataclass
class SplitScan:
    """Accumulates one split's figures, shard by shard."""

    name: str
    eos_id: int | None
    vocab_size: int | None
    verify: bool
    problems: list
    seq: int | None = None
    dtype: str | None = None
    shards: int = 0
    rows: int = 0
    padding: int = 0
    documents: int = 0
    segments: int = 0
    rows_with_boundary: int = 0
    min_id: int | None = None
    max_id: int | None = None
    lengths: DocLengths = field(default_factory=DocLengths)
    freq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    hashes: list = field(default_factory=list)  # kept only when keep_hashes (the val split)
    keep_hashes: bool = False
    other_hashes: np.ndarray | None = None  # documents of the other split, to find overlaps
    overlap: int = 0
    _prev_token: int | None = None  # last token of the previous shard (None: none, or unread)
    _prev_hash: int | None = None  # hash of the previous shard's last segment (None: as above)
    stream_pos: int = 0  # tokens of this split seen so far
    last_eos: int = -1  # stream position of the last EOS seen
    has_segments: bool = False

    def add(self, shard: ShardBlocks, d: Digest):
        """Fold one shard in, in order; `d` is its digest (computed in a read-ahead thread)."""
        n, seq, segments = shard.rows, shard.seq, shard.segments
        name = f"{self.name}/{shard.path.name}"
        if self.seq is None:
            self.seq = seq
        if seq != self.seq:
            self.problems.append(Problem(name, f"rows of {seq} tokens, the split's seq is "
                                               f"{self.seq}"))
            self.lost_shard()
            return
        self.dtype = np.dtype(shard.dtype).name
        if segments is not None and len(segments) and not self._segments_usable(name, n,
                                                                                 segments):
            segments = None
        if segments is not None and len(segments):
            self.has_segments = True
            self.padding += n * seq - d.real
            self.segments += len(segments) - int((segments[:, 2] == PAD_HASH).sum())
            starts = self._true_starts(name, d.last, segments)
            if self.keep_hashes:
                self.hashes.append(starts)
            if self.other_hashes is not None and len(self.other_hashes):
                self.overlap += int(np.isin(starts, self.other_hashes).sum())
        else:
            self.lost_shard()
        if d.real:
            self.min_id = d.lo if self.min_id is None else min(self.min_id, d.lo)
            self.max_id = d.hi if self.max_id is None else max(self.max_id, d.hi)
            if len(self.freq) < len(d.counts):
                self.freq = np.concatenate([self.freq,
                                            np.zeros(len(d.counts) - len(self.freq), np.int64)])
            self.freq[: len(d.counts)] += d.counts
            if self.verify and d.over_vocab_row is not None:
                self.problems.append(Problem(name, f"token id {d.hi} >= vocab size "
                                                   f"{self.vocab_size}", row=d.over_vocab_row))
        if d.eos is not None:
            ends = self.stream_pos + d.eos
            self.lengths.add(np.diff(np.concatenate([[self.last_eos], ends])))
            if len(ends):
                self.last_eos = int(ends[-1])
            self.documents += len(ends)
            starts = d.eos + 1
            inner = starts[(starts % seq != 0) & (starts < d.real)]
            self.rows_with_boundary += len(np.unique(inner // seq))
            if self.verify and segments is not None:
                self._check_segments(name, n, seq, segments, inner, d.real)
        self.stream_pos += d.real
        self.rows += n
        self.shards += 1

    def _segments_usable(self, name: str, n: int, segments: np.ndarray) -> bool:
        """Segments sorted by row, each in one of the shard's rows: what the fold relies on."""
        rows = segments[:, 0]
        if (rows[1:] < rows[:-1]).any() or int(rows[-1]) >= n:
            what = ("segments not sorted by row" if (rows[1:] < rows[:-1]).any()
                    else f"a segment of row {int(rows[-1]):,}, the shard has {n:,} rows")
            self.problems.append(Problem(name, what))
            return False
        return True

    def lost_shard(self):
        """A shard could not be folded in: the next shard's first row has no row before it."""
        self._prev_token = self._prev_hash = None

    def _true_starts(self, name: str, last: np.ndarray, segments: np.ndarray) -> np.ndarray:
        """Hashes of the documents that begin in this shard (not continuations, not padding).
        A row continues the previous row's last document when the token before it (the last of
        the row before, `last`) is not EOS; then its segment at offset 0 must carry that
        document's hash, which --verify checks. Without an EOS id, a row whose segment at 0
        repeats the previous row's last hash is taken for a continuation (an identical text
        right after, the one thing this misses, is in the same split anyway)."""
        n = len(last)
        bounds = np.searchsorted(segments[:, 0], np.arange(n + 1, dtype=np.uint64))
        has = bounds[1:] > bounds[:-1]  # a row without segments is _check_segments' to name
        first = np.minimum(bounds[:-1], len(segments) - 1)
        first_hash = segments[first, 2]
        at_0 = has & (segments[first, 1] == 0)
        before_hash = np.zeros(n, np.uint64)  # the previous row's last segment's hash
        before_hash[1:] = segments[np.maximum(bounds[1:-1] - 1, 0), 2]
        before_known = np.empty(n, bool)
        before_known[1:] = has[:-1]
        before_known[0] = self._prev_hash is not None
        before_hash[0] = self._prev_hash or 0
        repeats = at_0 & before_known & (first_hash == before_hash)
        if self.eos_id is None:
            continued = repeats
        else:
            before_row = np.empty(n, np.int64)
            before_row[1:] = last[:-1]
            before_row[0] = self.eos_id if self._prev_token is None else self._prev_token
            continued = before_row != self.eos_id
            wrong = np.flatnonzero(continued & at_0 & before_known & ~repeats)
            if self.verify and len(wrong):
                r = int(wrong[0])
                before = "the previous shard's last row" if r == 0 else f"row {r - 1}"
                more = f" ({len(wrong) - 1:,} more rows of this shard alike)" if len(wrong) > 1 else ""
                self.problems.append(Problem(
                    name, f"the row continues the last document of {before} "
                          f"({int(before_hash[r]):016x}) but its first segment's hash is "
                          f"{int(first_hash[r]):016x}{more}", row=r))
        self._prev_token, self._prev_hash = int(last[-1]), int(segments[-1, 2])
        opens_doc = (segments[:, 1] != 0) | ~continued[segments[:, 0].astype(np.int64)]
        return segments[opens_doc & (segments[:, 2] != PAD_HASH), 2]

    def _check_segments(self, name, n, seq, segments, inner, real):
        recorded = (segments[:, 0].astype(np.int64) * seq + segments[:, 1].astype(np.int64))
        pad = segments[:, 2] == PAD_HASH
        expected = np.union1d(np.arange(n, dtype=np.int64) * seq, inner)
        expected = expected[expected < real] if real < n * seq else expected
        got = np.sort(recorded[~pad])
        if not np.array_equal(got, expected):
            diff = np.setxor1d(got, expected)
            self.problems.append(Problem(
                name, "document starts do not match the EOS positions (first difference at "
                      f"offset {int(diff[0] % seq)})", row=int(diff[0] // seq)))

    def report(self, disk: int, shards: ShardFormat, tokenizer=None) -> dict:
        """`disk`: the split's stored bytes (SplitReader.stored_bytes)."""
        raw = (sum(shards.raw_bytes(i) for i in range(len(shards))) if shards.compressed
               else disk)
        tokens = self.rows * (self.seq or 0)
        out = {"shards": self.shards, "rows": self.rows, "seq": self.seq, "dtype": self.dtype,
               "bytes_on_disk": disk, "raw_bytes": raw,
               "compression_ratio": raw / disk if disk else None,
               "bytes_per_token": disk / tokens if tokens else None,
               "tokens": tokens, "real_tokens": tokens - self.padding,
               "padding_tokens": self.padding}
        if self.eos_id is not None:
            out.update({
                "documents": self.documents,
                "documents_per_row": (self.segments / self.rows if self.has_segments and
                                      self.rows else None),
                "rows_with_boundary_fraction": self.rows_with_boundary / self.rows
                if self.rows else None,
                "doc_length": self.lengths.summary()})
        out["vocab"] = self.vocab_report(tokenizer)
        return out

    def vocab_report(self, tokenizer) -> dict:
        used = np.flatnonzero(self.freq)
        top = np.argsort(-self.freq, kind="stable")[:TOP_TOKENS] if len(used) else []
        total = int(self.freq.sum()) or 1
        by_rank = np.sort(self.freq[used])[::-1]
        ranks = [1 << k for k in range(max(len(by_rank), 1).bit_length()) if 1 << k <= len(by_rank)]
        return {"min_id": self.min_id, "max_id": self.max_id, "distinct_ids": len(used),
                "counted_fraction": total / max(self.rows * (self.seq or 0) - self.padding, 1),
                "rank_fractions": {"ranks": ranks,
                                   "fractions": [float(by_rank[r - 1]) / total for r in ranks]},
                "top": [{"id": int(t), "count": int(self.freq[t]),
                         "fraction": float(self.freq[t]) / total,
                         "text": tokenizer.decode([int(t)]) if tokenizer else None}
                        for t in top if self.freq[t]]}
