"""Concatenate documents into rows of exactly `seq` tokens (pure: no I/O): `--packing concat`.

Each document arrives as its tokens followed by EOS (BOS first when asked). Documents are laid
end to end; a document that reaches a row's end continues at the start of the next row, so no
token is dropped. Only the final partial row of a split is special, and `finish` makes that
explicit: `pad` fills it with `pad_id` (counted as padding tokens) or `drop` discards it
(counted as dropped tokens).

Alongside the tokens, every row gets its segments: (start offset in the row, document hash)
pairs, in order. The first segment always starts at 0: either a document begins there, or the
row opens with the rest of a document from the previous row (and carries that document's hash).
Padding is a segment with hash 0. Attention masking needs exactly these starts; the hashes let
`pack stats` prove the splits share no document. Segments are uint64 throughout, so a hash
leaves the packer exactly as it came in (all 64 bits; a float64 step would keep only 53).

Cost: one copy of each token (carry + batch concatenation) and O(documents) numpy work per batch.
"""

import numpy as np

from longpack.pipeline.tokenize.split import PAD_HASH


class RowPacker:
    def __init__(self, seq: int, dtype: np.dtype, carry: np.ndarray | None = None,
                 carry_segments: np.ndarray | None = None):
        self.seq, self.dtype = seq, np.dtype(dtype)
        self.carry = np.zeros(0, self.dtype) if carry is None else carry.astype(self.dtype)
        # (start, hash) pairs of the unfinished row; starts with offset 0 whenever carry is non-empty
        self.carry_segments = (np.zeros((0, 2), np.uint64) if carry_segments is None
                               else carry_segments.astype(np.uint64).reshape(-1, 2))

    def state(self) -> dict[str, np.ndarray]:
        """What a checkpoint saves (BuildState.carries); RowPacker(seq, dtype, **state) goes on."""
        return {"carry": self.carry, "carry_segments": self.carry_segments}

    def add(self, tokens: np.ndarray, doc_lengths: np.ndarray, doc_hashes: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
        """Append whole documents (`tokens` is their concatenation). Returns the rows completed,
        shape [n, seq], and their segments, shape [m, 3] uint64: (row within n, start, hash)."""
        seq = self.seq
        if len(doc_lengths) == 0:
            return np.zeros((0, seq), self.dtype), np.zeros((0, 3), np.uint64)
        stream = np.concatenate([self.carry, tokens.astype(self.dtype, copy=False)])
        doc_pos = len(self.carry) + np.concatenate([[0], np.cumsum(doc_lengths[:-1])])
        starts = np.concatenate([self.carry_segments[:, 0].astype(np.int64), doc_pos])
        hashes = np.concatenate([self.carry_segments[:, 1], doc_hashes.astype(np.uint64)])
        n_full = len(stream) // seq
        row_starts = np.arange(-(-len(stream) // seq), dtype=np.int64) * seq
        covering = np.searchsorted(starts, row_starts, side="right") - 1
        opens_mid_doc = starts[covering] != row_starts  # row begins with a continued document
        pos = np.concatenate([starts, row_starts[opens_mid_doc]])
        hsh = np.concatenate([hashes, hashes[covering[opens_mid_doc]]])
        order = np.argsort(pos, kind="stable")
        pos, hsh = pos[order], hsh[order]
        row, offset = pos // seq, pos % seq
        done = row < n_full
        segments = np.stack([row[done].astype(np.uint64), offset[done].astype(np.uint64),
                             hsh[done]], axis=1)
        rows = stream[: n_full * seq].reshape(n_full, seq)
        self.carry = stream[n_full * seq:].copy()
        self.carry_segments = np.stack([offset[~done].astype(np.uint64), hsh[~done]], axis=1)
        return rows, segments

    def finish(self, last_row: str, pad_id: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Flush the final partial row. Returns (rows, segments, padding_tokens, dropped_tokens)."""
        n = len(self.carry)
        empty = (np.zeros((0, self.seq), self.dtype), np.zeros((0, 3), np.uint64))
        if n == 0:
            return (*empty, 0, 0)
        if last_row == "drop":
            self.carry = self.carry[:0]
            self.carry_segments = self.carry_segments[:0]
            return (*empty, 0, n)
        row = np.full((1, self.seq), pad_id, self.dtype)
        row[0, :n] = self.carry
        # Every array here is uint64: concatenating a uint64 array with a Python list (int64)
        # promotes to float64, which rounds each 64-bit hash to 53 bits.
        padding = np.array([[n, PAD_HASH]], np.uint64)
        segs = np.concatenate([self.carry_segments, padding])
        segments = np.concatenate([np.zeros((len(segs), 1), np.uint64), segs], axis=1)
        self.carry = self.carry[:0]
        self.carry_segments = self.carry_segments[:0]
        return row, segments, self.seq - n, 0
