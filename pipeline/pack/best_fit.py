"""Best-fit packing (`pack build --packing best-fit`, the default): documents that fit a row are
never split (pure: no I/O). The same contract as packer.py's RowPacker: `add` takes whole
documents and returns the rows it completed with their segments; `finish` flushes the rest;
`state` is what a checkpoint saves, and a packer made from it continues with the same bytes.

Windows. A split's documents are laid end to end as concat lays them; a document whose first
token is at position p of that stream belongs to window floor(p / W), W = WINDOW_ROWS x seq
tokens. Each window is packed on its own (`pack_window`) and its rows follow the previous
window's. A window is a pure function of the split's document sequence: neither the batches
`add` is given (their bounds follow --workers) nor a checkpoint moves it, and a build split into
tasks tells a document's window from its task's offset (a prefix sum), as it tells a concat row
(distribute/layout.py). A window is whole once a document's tokens reach its end (every later
document starts in a later window: `window_ends`), and is packed then; the split's last window
is packed by `finish`.

Rule, within a window (best-fit decreasing, as in Ding et al. 2024, "Fewer Truncations Improve
Language Modeling", over a bounded window rather than the whole corpus): documents longest
first, ties in arrival order (`plan_rows`).
  - A document longer than seq: its first floor(L / seq) pieces of seq tokens are rows of their
    own, then its remainder (if any) opens the next row at offset 0. Each of these rows opens
    with the continuation of the row before, exactly as a document continued across a row end
    does in concat (FORMAT.md: its segment at 0 carries the document's hash), so the remainder
    cannot go into a row's middle; the row it opens is then filled like any other.
  - Any other document goes into the row with the least free space that holds it (ties: the row
    created first), or opens a new row when none does.
Within a row documents follow in the order they were placed. Rows leave in the order they were
created, so a long document's pieces are consecutive rows, in order. A row's unused end is
padding: `pad_id` tokens and a segment (offset, hash 0), as the final partial row's in concat;
`padding` counts them over the split. Every row may end in padding, so `--last-row drop` (which
drops concat's one partial row) has no meaning here: BuildConfig refuses it.

Edge cases: a document of exactly seq tokens is a row; one of k x seq tokens is k rows and no
remainder; an empty split makes no row.

Memory: the open window holds fewer than W tokens (it is packed once they reach W), the window
being packed at most W plus its last document, and its rows about as many tokens again. Cost
per window: a stable sort of its documents (O(n log n)), a bisect and a list insert per
document over the rows with free space (O(log r + r), r about WINDOW_ROWS), and one copy of each
token (at packing; `add` keeps its batches as they are until then).
"""

import bisect

import numpy as np

# Rows per window. Padding comes mostly from each window's last, least filled rows, so it falls
# roughly as 1 / WINDOW_ROWS, while memory grows with it (W tokens held: 32 MiB of uint32 at
# seq 32768). docs/FORMAT.md has the measurements behind this value. Changing it changes the
# bytes of every best-fit build: it is recorded in the manifest and in the fingerprint.
WINDOW_ROWS = 256
RULE = ("best-fit decreasing: documents longest first (ties in arrival order); a document "
        "longer than a row is cut into rows of seq tokens and its remainder opens the next "
        "row; every other document goes into the row with the least free space that holds it "
        "(ties: the row created first), else a new row; rows in order of creation")


def describe(seq: int, window_rows: int = WINDOW_ROWS) -> dict:
    """The manifest's and the fingerprint's record of how a best-fit build packs."""
    return {"packing": "best-fit", "window": {"rows": window_rows, "tokens": window_rows * seq,
                                              "of": "documents whose first token is in "
                                                    "[w * tokens, (w + 1) * tokens) of the "
                                                    "split's concatenated stream"},
            "rule": RULE}


def window_ends(begin: int, lengths: np.ndarray, window: int) -> np.ndarray:
    """Documents laid end to end from stream position `begin`, the first in an open window:
    the index + 1 of each one whose tokens reach its window's end (the window's last), in
    order. The documents after the last of these are in a window still open."""
    ends = begin + np.cumsum(lengths)
    return np.flatnonzero(ends >= ((ends - lengths) // window + 1) * window) + 1


def plan_rows(lengths: np.ndarray, seq: int) -> list[list[tuple[int, int, int]]]:
    """The rule above, on one window's document lengths alone: per row, in order, its pieces
    (document, start in it, length). Only `len` of this is needed to count a window's rows."""
    rows: list[list[tuple[int, int, int]]] = []
    free: list[tuple[int, int]] = []  # (free tokens, row) of the rows with room, sorted
    for i in np.argsort(-np.asarray(lengths), kind="stable").tolist():
        n = int(lengths[i])
        if n > seq:
            whole, rest = divmod(n, seq)
            rows += [[(i, k * seq, seq)] for k in range(whole)]
            if rest:
                rows.append([(i, whole * seq, rest)])
                bisect.insort(free, (seq - rest, len(rows) - 1))
            continue
        at = bisect.bisect_left(free, (n, -1))
        if at == len(free):  # no row holds it: a new row
            rows.append([(i, 0, n)])
            if n < seq:
                bisect.insort(free, (seq - n, len(rows) - 1))
            continue
        room, row = free.pop(at)
        rows[row].append((i, 0, n))
        if room > n:
            bisect.insort(free, (room - n, row))
    return rows


def pack_window(stream: np.ndarray, lengths: np.ndarray, hashes: np.ndarray, seq: int,
                pad_id: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One window's documents (`stream`: their tokens, end to end) -> its rows [n, seq], their
    segments [m, 3] uint64 (row, start, hash) and the padding tokens in them."""
    plan = plan_rows(lengths, seq)
    starts = np.cumsum(lengths) - lengths
    rows = np.full((len(plan), seq), pad_id, stream.dtype)
    used = [sum(n for _, _, n in row) for row in plan]
    segments = np.zeros((sum(map(len, plan)) + sum(u < seq for u in used), 3), np.uint64)
    j = 0
    for r, row in enumerate(plan):
        offset = 0
        for i, start, n in row:
            at = int(starts[i]) + start
            rows[r, offset:offset + n] = stream[at:at + n]
            segments[j, :2] = r, offset
            segments[j, 2] = hashes[i]  # uint64 to uint64: all 64 bits kept
            offset += n
            j += 1
        if offset < seq:
            segments[j, :2] = r, offset  # its hash stays PAD_HASH (0)
            j += 1
    return rows, segments, len(plan) * seq - int(np.sum(lengths))


class BestFitPacker:
    """`carry` / `carry_segments` / `counters`: a checkpoint's `state()` (the open window's
    tokens; each of its documents' (start in carry, hash); the position of carry[0] in the
    split's stream and the padding so far). `window_rows`: WINDOW_ROWS but in tests."""

    def __init__(self, seq: int, dtype: np.dtype, pad_id: int, carry: np.ndarray | None = None,
                 carry_segments: np.ndarray | None = None, counters: np.ndarray | None = None,
                 window_rows: int = WINDOW_ROWS):
        self.seq, self.dtype, self.pad_id = seq, np.dtype(dtype), pad_id
        self.window = window_rows * seq
        carry = np.zeros(0, self.dtype) if carry is None else carry.astype(self.dtype)
        segments = (np.zeros((0, 2), np.uint64) if carry_segments is None
                    else carry_segments.astype(np.uint64).reshape(-1, 2))
        starts = segments[:, 0].astype(np.int64)
        # The open window as the pieces `add` was given, joined only when it is packed: joining
        # at every call would copy up to W tokens per batch.
        self.tokens = [carry] if len(carry) else []
        self.lengths = [np.diff(starts, append=len(carry))] if len(starts) else []
        self.hashes = [segments[:, 1]] if len(starts) else []
        self.held = len(carry)  # tokens in the open window
        position, padding = (0, 0) if counters is None else (int(c) for c in counters)
        self.position = position  # of the open window's first token in the split's stream
        self.padding = padding  # pad tokens in the rows made so far

    def state(self) -> dict[str, np.ndarray]:
        """What a checkpoint saves (BuildState.carries): the open window and the counters."""
        carry, lengths, hashes = self._window()
        self.tokens, self.lengths, self.hashes = (
            ([carry], [lengths], [hashes]) if len(lengths) else ([], [], []))
        starts = (np.cumsum(lengths) - lengths).astype(np.uint64)
        return {"carry": carry, "carry_segments": np.stack([starts, hashes], axis=1),
                "counters": np.array([self.position, self.padding], np.uint64)}

    def add(self, tokens: np.ndarray, doc_lengths: np.ndarray, doc_hashes: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
        """Append whole documents (`tokens` is their concatenation). Returns the rows of every
        window they completed, shape [n, seq], and their segments, shape [m, 3] uint64:
        (row within n, start, hash)."""
        rows, segments, made = [], [], 0
        lengths = np.asarray(doc_lengths, np.int64)
        hashes = np.asarray(doc_hashes).astype(np.uint64)
        tokens = tokens.astype(self.dtype, copy=False)
        ends = np.cumsum(lengths)
        a = 0
        for b in window_ends(self.position + self.held, lengths, self.window).tolist():
            self._hold(tokens, ends, lengths, hashes, a, b)
            r, s = self._pack()
            s[:, 0] += np.uint64(made)
            made += len(r)
            rows.append(r)
            segments.append(s)
            a = b
        self._hold(tokens, ends, lengths, hashes, a, len(lengths))
        if not rows:
            return np.zeros((0, self.seq), self.dtype), np.zeros((0, 3), np.uint64)
        return np.concatenate(rows), np.concatenate(segments)

    def finish(self, last_row: str, pad_id: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Pack the open window (the split's last). Returns (rows, segments, padding_tokens of
        the whole split, dropped_tokens: 0). `last_row` must be "pad" (module docstring)."""
        if last_row != "pad":
            raise ValueError(f"best-fit pads every row: last_row {last_row!r} has no meaning")
        self.pad_id = pad_id
        rows, segments = self._pack()
        return rows, segments, self.padding, 0

    def _hold(self, tokens, ends, lengths, hashes, a: int, b: int) -> None:
        """Documents a..b of a batch join the open window (a copy: the batch is not ours)."""
        if a == b:
            return
        lo, hi = int(ends[a] - lengths[a]), int(ends[b - 1])
        self.tokens.append(tokens[lo:hi].copy())
        self.lengths.append(lengths[a:b])
        self.hashes.append(hashes[a:b])
        self.held += hi - lo

    def _window(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The open window: its tokens, its documents' lengths and hashes."""
        if not self.lengths:
            return np.zeros(0, self.dtype), np.zeros(0, np.int64), np.zeros(0, np.uint64)
        return (np.concatenate(self.tokens) if len(self.tokens) > 1 else self.tokens[0],
                np.concatenate(self.lengths), np.concatenate(self.hashes))

    def _pack(self) -> tuple[np.ndarray, np.ndarray]:
        """The open window packed; the next one opens where it ended."""
        rows, segments, padding = pack_window(*self._window(), self.seq, self.pad_id)
        self.padding += padding
        self.position += self.held
        self.tokens, self.lengths, self.hashes, self.held = [], [], [], 0
        return rows, segments
