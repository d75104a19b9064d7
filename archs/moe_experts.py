"""MoE experts: top-k routing of each token to SwiGLU experts, and its auxiliary losses.

Routing (per token): softmax over `n_experts` router logits, the top `top_k` experts, their
probabilities renormalised as mixing weights. Routing is dropless: every token reaches its
top_k experts, so a token's output depends on its own hidden state alone, never on the other
tokens of its row or batch (documents stay apart; causal without any ordering rule). The B*T*k
(token, expert) pairs are sorted by expert (stable: token order within an expert) and each
expert runs on its contiguous slice; the outputs, weighted, go back to token order through the
inverse permutation and each token's top_k rows are summed. Both moves are gathers, forward and
backward (`dispatch` and `combine`, each the other's adjoint): autograd's index_select and
index_add would make one of them a scatter-add, which runs serially on CPU. Nothing loops
over tokens. In bf16 (autocast on GPUs) the slices go through one grouped GEMM per weight
matrix (`F.grouped_mm`, the experts' offsets on the device), each expert's slice padded to a
multiple of 8 rows (the CUDA kernels' 16-byte alignment; the padding rows are zeros); in fp32
and fp16, where this torch's grouped_mm is not known to have a CUDA kernel, through a loop over
the experts, which reads the experts' sizes on the host (one sync per layer, a graph break
under torch.compile). The CPU takes the same paths as a GPU, so that what it measures (the
memory plan's activations, tests/test_memory_plan.py; the host reads, tests/test_host_reads.py)
is what a GPU run does.

`capacity_factor` (default None: dropless) reproduces capacity-bound routing (GShard, Switch) for
ablations: each document (a whole row without doc_starts) gives each expert
ceil(capacity_factor * top_k * n / n_experts) slots for its n tokens, filled in token order (a
token's first choice before its second); a choice past them is dropped (its token keeps the
residual) and counted in `dropped`. Counted per document, earlier tokens first, a choice's fate
depends only on earlier tokens of its own document and on that document's length. Dropped
choices are still computed, weighted 0: the cost stays the dropless one (top_k expert MLPs per
token, less than a capacity buffer's capacity_factor * top_k) and the shapes static.

Auxiliary losses, over every token of the batch: load balancing (Switch Transformer: n_experts *
sum_e f_e * P_e, with f_e the share of choices routed to e and P_e its mean router probability;
1.0 at uniform routing, its minimum) and the router z-loss (ST-MoE: mean logsumexp(logits)^2).
They shape gradients only; no token's output depends on them.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .documents import Documents


class Experts(nn.Module):
    def __init__(self, cfg):  # a longpack.archs.moe.MoEConfig
        super().__init__()
        E, d, f = cfg.n_experts, cfg.d_model, cfg.expert_width
        self.cfg = cfg
        self.router = nn.Linear(d, E, bias=False)
        self.w_gate = nn.Parameter(torch.empty(E, d, f))  # expert e computes x @ w[e]
        self.w_up = nn.Parameter(torch.empty(E, d, f))
        self.w_down = nn.Parameter(torch.empty(E, f, d))

    def forward(self, x: torch.Tensor, doc_starts=None, real: torch.Tensor | None = None):
        """x (B, T, d) -> (B, T, d), stats. `real` (B, T) bool: the tokens the statistics
        count (None: all)."""
        cfg = self.cfg
        B, T, d = x.shape
        E, k = cfg.n_experts, cfg.top_k
        logits = self.router(x).float()  # (B, T, E)
        probs = logits.softmax(-1)
        top_p, top_e = probs.topk(k, dim=-1)  # (B, T, k)
        weight = (top_p / top_p.sum(-1, keepdim=True)).reshape(-1)  # (B*T*k,) token-major
        choice_e = top_e.reshape(-1)
        dropped = logits.new_zeros(())
        if cfg.capacity_factor is not None:
            kept = within_capacity(choice_e, document_ids(doc_starts, B, T, x.device), cfg)
            weight = weight * kept
            dropped = mean_over((~kept).float().view(B, T, k), real, (0, 1, 2))
        order = choice_e.argsort(stable=True)  # grouped by expert, token order within each
        inverse = torch.empty_like(order).index_copy_(0, order, torch.arange(len(order),
                                                                         device=order.device))
        h = self.expert_mlps(dispatch_rows(x.reshape(B * T, d), order, inverse, k),
                             choice_e[order])  # (B*T*k, d) in expert order
        y = combine_rows(h * weight[order, None].to(h.dtype), order, inverse, k)  # (B*T, d)
        # f_e; one_hot's equal, but one_hot reads its input's range to the host to check it
        routed = (top_e[..., None] == torch.arange(E, device=x.device)).float()  # (B, T, k, E)
        share = mean_over(routed, real, (0, 1, 2))
        stats = {"balance": E * (share * mean_over(probs, real, (0, 1))).sum(),
                 "z": mean_over(torch.logsumexp(logits, -1).pow(2), real, (0, 1)),
                 "dropped": dropped}
        return y.view(B, T, d), stats

    def expert_mlps(self, h: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """SwiGLU of each row of h through its expert; h (n, d) sorted by expert (n,)."""
        E, f = self.cfg.n_experts, self.cfg.expert_width
        device = h.device.type
        # the meta device (FLOPs are counted there, archs/flops.py) has no autocast to ask
        autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else h.dtype
        h = h.to(dtype)
        weights = [w.to(dtype) for w in (self.w_gate, self.w_up, self.w_down)]
        counts = torch.zeros(E, dtype=torch.long, device=h.device).index_add_(
            0, expert, torch.ones_like(expert))
        if h.is_meta:
            # No values, so no sizes to read. The experts' FLOPs (archs/flops.py counts them on
            # meta) depend only on the total rows, which any split keeps: all through the first
            # expert, one step of the loop below (not grouped_mm: FlopCounterMode has no
            # formula for it).
            sizes = [h.shape[0]]
        elif dtype == torch.bfloat16 and h.shape[1] % 8 == 0 and f % 8 == 0:
            return grouped_swiglu(h, expert, counts, *weights)
        else:
            sizes = counts.tolist()  # the slices' sizes, on the host: one sync
        gate_up = torch.cat(weights[:2], -1)  # (E, d, 2f): one matmul per expert for both
        parts = []
        for part, gu, down in zip(h.split(sizes), gate_up.unbind(0), weights[2].unbind(0)):
            gate, up = (part @ gu).chunk(2, -1)  # (n_e, f) each
            parts.append(F.silu(gate) * up @ down)
        return torch.cat(parts)


def grouped_swiglu(h, expert, counts, w_gate, w_up, w_down) -> torch.Tensor:
    """The experts' SwiGLU as three grouped GEMMs, no host sync. Each expert's rows move to a
    slice starting at a multiple of 8 (16 bytes in bf16, what the kernels' loads need, also for
    the weight gradients whose sum runs over the rows); the padding rows are zeros, and the last
    slice runs to the end of the buffer, so every row is in some slice and none is garbage."""
    n, d = h.shape
    E = counts.shape[0]
    padded = (counts + 7) // 8 * 8
    start = padded.cumsum(0) - padded  # where each expert's slice begins
    rows = (n + 7 * E + 7) // 8 * 8  # >= the padded total for any counts: a static size
    shift = start - (counts.cumsum(0) - counts)  # padded start - packed start, per expert
    slot = torch.arange(n, device=h.device) + shift[expert]  # (n,) row of each input
    buf = h.new_zeros(rows, d).index_copy(0, slot, h)
    offs = torch.cat([start[1:], start.new_tensor([rows])]).to(torch.int32)  # slice ends
    a = F.silu(F.grouped_mm(buf, w_gate, offs=offs)) * F.grouped_mm(buf, w_up, offs=offs)
    return F.grouped_mm(a, w_down, offs=offs)[slot]


def mean_over(t: torch.Tensor, real: torch.Tensor | None, dims: tuple) -> torch.Tensor:
    """t's mean over `dims` (the batch and time first), counting only the `real` (B, T) tokens
    when given."""
    if real is None:
        return t.mean(dims)
    w = real.to(t.dtype).view(*real.shape, *[1] * (t.dim() - 2))
    return (t * w).sum(dims) / (w.expand_as(t).sum(dims)).clamp(min=1)


def document_ids(doc_starts, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    """[B, T] number of each token's document, unique across the batch and nondecreasing in
    row-major order (row b's documents are numbered b*T, b*T + 1, ...); a row without
    doc_starts is one document."""
    base = torch.arange(batch, device=device)[:, None] * seq
    if doc_starts is None:
        return base.expand(batch, seq)
    return base + Documents.of(doc_starts, seq).segments()


def document_lengths(doc: torch.Tensor) -> torch.Tensor:
    """The length of each token's document, shaped like `doc` (ids from document_ids)."""
    flat = doc.reshape(-1)
    return torch.zeros_like(flat).index_add_(0, flat, torch.ones_like(flat))[flat].view(doc.shape)


def within_capacity(choice_e: torch.Tensor, doc: torch.Tensor, cfg) -> torch.Tensor:
    """Which of the token-major choices (B*T*k,) fit their expert's capacity in their document:
    ceil(capacity_factor * top_k * n / n_experts) slots for a document of n tokens, taken in
    token order. Sorting by (document, expert), stably, lines each document's choices of one
    expert up in token order; a choice's rank is its distance from the start of its run."""
    E, k = cfg.n_experts, cfg.top_k
    length = document_lengths(doc).reshape(-1)  # (B*T,)
    capacity = torch.ceil(cfg.capacity_factor * k * length.double() / E).repeat_interleave(k)
    key = doc.reshape(-1).repeat_interleave(k) * E + choice_e
    order = key.argsort(stable=True)
    i = torch.arange(len(key), device=key.device)
    run_start = torch.ones_like(key, dtype=torch.bool)
    run_start[1:] = key[order][1:] != key[order][:-1]
    first = torch.where(run_start, i, 0).cummax(0).values
    rank = torch.empty_like(i).index_copy_(0, order, i - first)
    return rank < capacity


def dispatch(x: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    """x (n, d) -> (n*k, d): row i is x[order[i] // k], the token of the i-th choice in expert
    order (`order` sorts the token-major choices)."""
    return x.index_select(0, order // k)


def combine(y: torch.Tensor, inverse: torch.Tensor, k: int) -> torch.Tensor:
    """y (n*k, d) in expert order -> (n, d): each token's k rows, back in token order
    (`inverse` is the inverse permutation of `order`), summed. The adjoint of dispatch."""
    return y.index_select(0, inverse).view(-1, k, y.shape[1]).sum(1)


class _Permute(torch.autograd.Function):
    """dispatch (to_experts=True) or combine, whose backward is the other one, its adjoint: a
    gather both ways, never index_select's backward, a scatter-add that runs serially on CPU."""

    @staticmethod
    def forward(ctx, x, order, inverse, k: int, to_experts: bool):
        ctx.save_for_backward(order, inverse)
        ctx.k, ctx.to_experts = k, to_experts
        return dispatch(x, order, k) if to_experts else combine(x, inverse, k)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        order, inverse = ctx.saved_tensors
        back = combine(grad, inverse, ctx.k) if ctx.to_experts else dispatch(grad, order, ctx.k)
        return back, None, None, None, None


def dispatch_rows(x, order, inverse, k: int):
    """dispatch, differentiable through combine."""
    return _Permute.apply(x, order, inverse, k, True)


def combine_rows(y, order, inverse, k: int):
    """combine, differentiable through dispatch."""
    return _Permute.apply(y, order, inverse, k, False)
