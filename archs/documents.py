"""The documents of a micro-batch's rows: made once per forward, read by every layer.

`doc_starts` is a LongTensor [B, K]: the offsets where documents start in each row, the first
0, padded at the end with -1 (what the loader builds from a row's `doc_starts` column). A
model wraps it once per forward in `Documents`, hands that to every layer, and each thing a
layer needs from it is made on first use and kept for the other layers and the backward:

    segments, positions   (B, T) on the device, from doc_starts by scatter and cumsum: no read
    block_mask            FlexAttention's (CUDA attention): made on the device, no read
    spans                 each row's (start, end) pairs on the host: one read of doc_starts,
                          for what is sized on the host (the CPU's attention per document,
                          resonance's FFT groups, Mamba's kernel's cu_seqlens)
    once(key, make)       what one family makes of them (resonance's FFT plan, Mamba's
                          cu_seqlens), in that family's file

So a step reads the device at most once per forward (docs/TRAIN.md lists which families do),
where the layers used to read each row's starts in every layer. Whoever has the starts on the
host already (`spans=`) saves even that read.
"""

import torch


def segment_ids(doc_starts: torch.Tensor, seq: int) -> torch.Tensor:
    """[B, T] index of the document each position belongs to (0, 0, 1, 1, 1, 2, ...)."""
    marks = torch.zeros(doc_starts.shape[0], seq + 1, dtype=torch.long, device=doc_starts.device)
    starts = doc_starts.clamp(min=0)
    marks.scatter_add_(1, starts, (doc_starts > 0).long())  # a start at 0 opens segment 0
    return marks[:, :seq].cumsum(1)


def positions(doc_starts: torch.Tensor | None, batch: int, seq: int,
              device: torch.device) -> torch.Tensor:
    """[B, T] position of each token within its document: rotary restarts at each start."""
    pos = torch.arange(seq, device=device).expand(batch, seq)
    if doc_starts is None:
        return pos
    seg = segment_ids(doc_starts, seq)
    first = torch.where(doc_starts >= 0, doc_starts, seq)  # -1 padding never matches
    start_of_seg = first.gather(1, seg.clamp(max=first.shape[1] - 1))
    return pos - start_of_seg


def document_mask_mod(segments: torch.Tensor):
    """FlexAttention mask_mod: causal, and key in the query's document (segments (B, T))."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (segments[b, q_idx] == segments[b, kv_idx])
    return mask_mod


def document_block_mask(doc_starts: torch.Tensor, seq: int):
    """The FlexAttention block mask of rows whose documents start at doc_starts (B, K)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(document_mask_mod(segment_ids(doc_starts, seq)), doc_starts.shape[0],
                             None, seq, seq, device=doc_starts.device)


# Outside any compiled graph: without gradients, Inductor fuses the mask's making (its sort) into
# the flex kernel, and that kernel read out of bounds on a GPU ("an illegal memory access" at
# every shape tried; docs/BENCHMARKS.md). With gradients the fused graph is correct and fast, so
# training keeps it; a graph break per forward costs inference little.
_eager_document_block_mask = torch.compiler.disable(document_block_mask)


class Documents:
    """The documents of rows of `seq` tokens that start at `starts` (B, K), see above. `spans`:
    a function that tells the rows' spans on the host without reading the device, where the
    caller can (then `spans()` calls it, when first asked, instead of reading starts)."""

    def __init__(self, starts: torch.Tensor, seq: int, spans=None):
        self.starts, self.seq = starts, seq
        self._made = {}
        self._spans = spans or (lambda: spans_of(self.starts.tolist(), self.seq))

    @classmethod
    def of(cls, doc_starts, seq: int) -> "Documents | None":
        """None for None, Documents as they are, a doc_starts tensor wrapped: what a layer
        does with what it is given (a model's Documents, or a caller's bare doc_starts)."""
        if doc_starts is None or isinstance(doc_starts, Documents):
            return doc_starts
        return cls(doc_starts, seq)

    def once(self, key: str, make):
        """make(), the first time `key` is asked for; what it made, after."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    @property
    def batch(self) -> int:
        return self.starts.shape[0]

    def segments(self) -> torch.Tensor:
        return self.once("segments", lambda: segment_ids(self.starts, self.seq))

    def positions(self) -> torch.Tensor:
        return self.once("positions", lambda: positions(self.starts, self.batch, self.seq,
                                                        self.starts.device))

    def spans(self) -> list[list[tuple[int, int]]]:
        """Each row's (start, end) per document, empty ones left out: the one read of
        doc_starts to the host (a compiled run's doc_starts is as wide as the row, so read
        whole, not entry by entry)."""
        return self.once("spans", self._spans)

    def block_mask(self):
        """FlexAttention's block mask (see _eager_document_block_mask for when it is eager)."""
        make = document_block_mask if torch.is_grad_enabled() else _eager_document_block_mask
        return self.once("block_mask", lambda: make(self.starts, self.seq))


def spans_of(rows: list[list[int]], seq: int) -> list[list[tuple[int, int]]]:
    """(start, end) of each nonempty document of each row of doc_starts (host lists)."""
    out = []
    for row in rows:
        starts = [s for s in row if s >= 0] + [seq]
        out.append([(lo, hi) for lo, hi in zip(starts, starts[1:]) if hi > lo])
    return out


def to_device(values, device: torch.device) -> torch.Tensor:
    """An int64 tensor of host `values` (a list or numpy array) on `device`: on a GPU through
    pinned memory without waiting, where a plain copy from pageable memory would wait for all
    the work queued before it (a sync per forward)."""
    t = torch.as_tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
