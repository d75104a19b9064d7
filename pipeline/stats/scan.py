"""`pack stats`: what a build holds, whether it is sound, and what it will train.

    open_output (files.py)         the build's folder, manifest and splits, or a one-line
                                         error saying what the folder lacks
One pass over each split, shard by shard (memory: the few shards in flight, not the split):

    SplitReader.read_blocks (formats/shards.py)  a shard's rows block by block + its segments, or a
                                         ShardError -> a Problem
      -> digest (digest.py, in the       its padding spans (the hash-0 segments), then id range,
         reading thread)                 EOS positions, token frequencies of the real tokens,
                                         each block while it is in the CPU's cache
      -> SplitScan.add (in order)        padding, document lengths and boundaries, documents
                                         split across rows and those longer than a row, the
                                         ids' frequencies and range; with --verify also segment
                                         / EOS agreement, padding, continued documents' hashes
                                         and id < vocab_size
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

from longpack.pipeline.formats.base import ShardBlocks, ShardFormat
from longpack.pipeline.stats.digest import Digest, digest, find_rare, in_spans, minus_padding
from longpack.pipeline.tokenize.split import PAD_HASH

# digest and find_rare moved to digest.py; named here too for the callers that import them from scan
__all__ = ["DocLengths", "Problem", "SplitScan", "digest", "find_rare"]

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
    _prev_closed: bool | None = None  # the previous shard's last row ends a document (None:
    # none, or unread): its last token is EOS or padding
    _prev_hash: int | None = None  # hash of the previous shard's last segment (None: as above)
    stream_pos: int = 0  # real tokens of this split seen so far
    last_eos: int = -1  # stream position of the last EOS seen
    has_segments: bool = False
    # Documents split across rows, and the floor: documents longer than a row, which every
    # packing splits. `_open_split`: the document still open at the last EOS runs over a row end.
    split_documents: int = 0
    split_tokens: int = 0
    long_documents: int = 0
    long_tokens: int = 0
    _open_split: bool = False

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
        continued = self._continued(d, n, seq) if self.eos_id is not None and n else None
        if segments is not None and len(segments) and not self._segments_usable(name, n,
                                                                                 segments):
            segments = None
        if segments is not None and len(segments):
            self.has_segments = True
            self.padding += n * seq - d.real
            self.segments += len(segments) - int((segments[:, 2] == PAD_HASH).sum())
            starts = self._true_starts(name, n, continued, segments)
            if self.keep_hashes:
                self.hashes.append(starts)
            if self.other_hashes is not None and len(self.other_hashes):
                self.overlap += int(np.isin(starts, self.other_hashes).sum())
            if self.verify:
                self._check_padding(name, seq, d)
        else:
            self._prev_hash = None  # the next shard's first row has no recorded hash before it
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
            ends = self.stream_pos + minus_padding(d.eos, d.pad)
            lengths = np.diff(np.concatenate([[self.last_eos], ends]))
            self.lengths.add(lengths)
            if continued is not None:
                opened = minus_padding(np.flatnonzero(continued) * seq, d.pad)
                self._count_split(ends, lengths, self.stream_pos + opened)
            if len(ends):
                self.last_eos = int(ends[-1])
            self.documents += len(ends)
            starts = d.eos + 1
            inner = starts[starts % seq != 0]  # a row's start is a segment's anyway
            inner = inner[~in_spans(inner, d.pad)]  # after a row's last EOS: its padding
            self.rows_with_boundary += len(np.unique(inner // seq))
            if self.verify and segments is not None:
                self._check_segments(name, n, seq, segments, inner, d.pad)
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
        self._prev_closed = self._prev_hash = None

    def _continued(self, d: Digest, n: int, seq: int) -> np.ndarray:
        """Per row, whether it opens with the rest of the last document of the row before it
        (the previous shard's last row for row 0): exactly when that row's last token is neither
        EOS nor padding (FORMAT.md, Segments: in concat and best-fit alike, a document that
        fits is followed by EOS, and only a row ending inside a document ends otherwise). The
        split's first row, and a row after one that could not be read, continues nothing."""
        ends_doc = (d.last == self.eos_id) | in_spans(np.arange(1, n + 1) * seq - 1, d.pad)
        before = np.empty(n, bool)
        before[0] = self._prev_closed is None or self._prev_closed
        before[1:] = ends_doc[:-1]
        self._prev_closed = bool(ends_doc[-1])
        return ~before

    def _count_split(self, ends: np.ndarray, lengths: np.ndarray, opened: np.ndarray) -> None:
        """Documents ending at stream positions `ends` (their EOS), of `lengths`; `opened`: the
        stream positions of the first tokens of rows that open with a continued document. The
        document holding such a token is split across rows: the first whose EOS is at or after
        it (`len(ends)`: the one still open at the shard's end)."""
        split = np.zeros(len(ends) + 1, bool)
        split[np.searchsorted(ends, opened)] = True
        split[0] |= self._open_split
        self._open_split = bool(split[-1])
        closed = split[:-1]
        self.split_documents += int(closed.sum())
        self.split_tokens += int(lengths[closed].sum())
        long = lengths > self.seq
        self.long_documents += int(long.sum())
        self.long_tokens += int(lengths[long].sum())

    def _true_starts(self, name: str, n: int, continued: np.ndarray | None,
                     segments: np.ndarray) -> np.ndarray:
        """Hashes of the documents that begin in this shard (not continuations, not padding).
        `continued` (`_continued`, None without an EOS id): the rows that open with the rest of
        the row before's last document; their segment at offset 0 must carry that document's
        hash, which --verify checks. Without an EOS id, a row whose segment at 0 repeats the
        previous row's last hash is taken for a continuation (an identical text right after,
        the one thing this misses, is in the same split anyway)."""
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
        if continued is None:
            continued = repeats
        else:
            wrong = np.flatnonzero(continued & at_0 & before_known & ~repeats)
            if self.verify and len(wrong):
                r = int(wrong[0])
                before = "the previous shard's last row" if r == 0 else f"row {r - 1}"
                more = f" ({len(wrong) - 1:,} more rows of this shard alike)" if len(wrong) > 1 else ""
                self.problems.append(Problem(
                    name, f"the row continues the last document of {before} "
                          f"({int(before_hash[r]):016x}) but its first segment's hash is "
                          f"{int(first_hash[r]):016x}{more}", row=r))
        self._prev_hash = int(segments[-1, 2])
        opens_doc = (segments[:, 1] != 0) | ~continued[segments[:, 0].astype(np.int64)]
        return segments[opens_doc & (segments[:, 2] != PAD_HASH), 2]

    def _check_segments(self, name, n, seq, segments, inner, pad):
        """The recorded document starts are the row starts and the positions after each EOS,
        outside the padding (`pad`: the shard's padding spans)."""
        recorded = (segments[:, 0].astype(np.int64) * seq + segments[:, 1].astype(np.int64))
        row_starts = np.arange(n, dtype=np.int64) * seq
        expected = np.union1d(row_starts[~in_spans(row_starts, pad)], inner)
        got = np.sort(recorded[segments[:, 2] != PAD_HASH])
        if not np.array_equal(got, expected):
            diff = np.setxor1d(got, expected)
            self.problems.append(Problem(
                name, "document starts do not match the EOS positions (first difference at "
                      f"offset {int(diff[0] % seq)})", row=int(diff[0] // seq)))

    def _check_padding(self, name: str, seq: int, d: Digest):
        """Padding (FORMAT.md) is a row's last segment, of pad tokens (the EOS id): a hash-0
        segment followed by another in its row, or padding holding other ids, is damage."""
        inside = d.pad[d.pad[:, 1] % seq != 0] if seq else d.pad[:0]
        if len(inside):
            self.problems.append(Problem(
                name, "a padding segment (hash 0) is followed by another segment in its row "
                      "(padding ends a row)", row=int(inside[0, 0] // seq)))
        if d.pad_not_eos_row is not None:
            self.problems.append(Problem(
                name, f"the row's padding holds ids other than the pad id {self.eos_id}",
                row=d.pad_not_eos_row))

    def split_figures(self) -> tuple[int, int, int, int]:
        """(documents split across rows, their tokens, documents longer than a row, their
        tokens), the split's last document counted even without an EOS (an import's stream may
        end without one)."""
        figures = [self.split_documents, self.split_tokens, self.long_documents,
                   self.long_tokens]
        tail = self.stream_pos - 1 - self.last_eos
        if tail > 0:
            if self._open_split:
                figures[0:2] = figures[0] + 1, figures[1] + tail
            if tail > (self.seq or 0):
                figures[2:4] = figures[2] + 1, figures[3] + tail
        return tuple(figures)

    def report(self, disk: int, shards: ShardFormat, tokenizer=None) -> dict:
        """`disk`: the split's stored bytes (SplitReader.stored_bytes)."""
        raw = (sum(shards.raw_bytes(i) for i in range(len(shards))) if shards.compressed
               else disk)
        tokens = self.rows * (self.seq or 0)
        real = tokens - self.padding
        out = {"shards": self.shards, "rows": self.rows, "seq": self.seq, "dtype": self.dtype,
               "bytes_on_disk": disk, "raw_bytes": raw,
               "compression_ratio": raw / disk if disk else None,
               "bytes_per_token": disk / tokens if tokens else None,
               "tokens": tokens, "real_tokens": real, "padding_tokens": self.padding,
               "padding_share": self.padding / tokens if tokens else None}
        if self.eos_id is not None:
            split_docs, split_tokens, long_docs, long_tokens = self.split_figures()
            out.update({
                "documents": self.documents,
                "documents_per_row": (self.segments / self.rows if self.has_segments and
                                      self.rows else None),
                "rows_with_boundary_fraction": self.rows_with_boundary / self.rows
                if self.rows else None,
                "doc_length": self.lengths.summary(),
                "split_documents": split_docs,
                "tokens_in_split_documents": split_tokens,
                "split_share": split_tokens / real if real else None,
                "documents_longer_than_row": long_docs,
                "tokens_in_documents_longer_than_row": long_tokens,
                "split_share_floor": long_tokens / real if real else None})
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
