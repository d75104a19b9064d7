"""Pieces the zoo's models share: rotary, attention, the loss, the optimizer roles of
parameters. Documents (doc_starts, segments, positions, FlexAttention's block mask) are
archs/documents.py's, made once per forward (`Documents`) and handed to every layer.
"""

import math
from fnmatch import fnmatchcase

import torch
import torch.nn as nn
import torch.nn.functional as F

from .documents import (  # noqa: F401  (segment_ids, positions, the block mask: also importable here)
    Documents,
    _eager_document_block_mask,
    document_block_mask,
    document_mask_mod,
    positions,
    segment_ids,
)

# What each parameter is, for the optimizer (training/optim/optimizers.py decides what each role gets).
# Each model file lists its parameters' roles by name; a parameter it does not list is an error.
OPTIMIZER_ROLES = {
    "matrix": "a hidden weight matrix [out, in] (attention, MLP, projections)",
    "experts": "a stack of hidden weight matrices [experts, in, out], one per MoE expert",
    "embedding": "the input embedding",
    "head": "the output unembedding",
    "norm": "a normalization's scale or shift",
    "bias": "a bias",
    "router": "a routing or gating vector (MoE router, MoD router and predictor)",
    "kernel": "a sequence mixer's own parameters: convolution kernels and taps (resonance, "
              "Mamba), a state space's decay, skip and step (Mamba's A_log, D, dt_bias)",
}


def param_roles(model: nn.Module, table: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """{parameter name: role}: each name takes the role of the first (fnmatch pattern, role) in
    `table` that it matches. Raises KeyError for a parameter no pattern matches, so a new
    parameter cannot silently fall out of its optimizer group."""
    roles = {}
    for name, _ in model.named_parameters():
        role = next((r for pattern, r in table if fnmatchcase(name, pattern)), None)
        if role not in OPTIMIZER_ROLES:
            raise KeyError(f"{type(model).__name__} parameter {name!r} has no optimizer role "
                           f"(got {role!r}); list it in its model file's PARAM_ROLES "
                           f"(roles: {', '.join(OPTIMIZER_ROLES)})")
        roles[name] = role
    return roles


class Rotary(torch.nn.Module):
    """Rotary position embedding on the first `dim` features of each head (GPT-NeoX's
    rotary_pct), rotating feature pairs (i, i + dim/2).

    As x * cos + swap(x) * sin, swap exchanging the two halves and sin signed (-sin on the
    first half): four kernels, and the tables computed once per layer for q and k together
    (the per-pair form took ten, each a pass over a strided slice of q or k)."""

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.dim = dim
        inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def tables(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of each position's angles, (B, 1, T, dim), for rotate()."""
        angles = pos[:, None, :, None].float() * self.inv_freq  # (B, 1, T, dim/2)
        angles = torch.cat([angles, angles], -1)  # (B, 1, T, dim)
        sin = angles.sin()
        sin[..., : self.dim // 2].neg_()
        return angles.cos().to(dtype), sin.to(dtype)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x (..., H, T, D) with any leading dims; cos, sin (B, 1, T, dim) from tables()
        h = self.dim // 2
        rot = x[..., : self.dim]
        swapped = torch.cat([rot[..., h:], rot[..., :h]], -1)  # (b, a) for (a, b)
        out = torch.addcmul(rot * cos, swapped, sin)  # (a cos - b sin, b cos + a sin)
        return out if self.dim == x.shape[-1] else torch.cat([out, x[..., self.dim:]], -1)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x (..., B, H, T, D), e.g. q and k stacked; pos (B, T)
        return self.rotate(x, *self.tables(pos, x.dtype))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_starts) -> torch.Tensor:
    """Causal attention that never crosses a document boundary. q, k, v (B, H, T, D); k and v
    may have fewer heads (grouped-query attention); doc_starts: Documents, a (B, K) tensor or
    None.

    Without doc_starts: one causal SDPA call. On CUDA: FlexAttention with a document mask
    (O(T) memory at 32k), the mask made once per forward. On CPU (FlexAttention has no CPU
    backward): causal SDPA per document, which skips the masked blocks a dense [T, T] mask
    would compute; the documents' spans are read to the host once per forward.
    """
    enable_gqa = k.shape[1] != q.shape[1]
    if doc_starts is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
    docs = Documents.of(doc_starts, q.shape[2])
    if q.is_cuda:
        return _flex_document_attention(q, k, v, docs, enable_gqa)
    out = torch.empty_like(q)
    for b, spans in enumerate(docs.spans()):
        for lo, hi in spans:
            out[b:b + 1, :, lo:hi] = F.scaled_dot_product_attention(
                q[b:b + 1, :, lo:hi], k[b:b + 1, :, lo:hi], v[b:b + 1, :, lo:hi],
                is_causal=True, enable_gqa=enable_gqa)
    return out


def _flex_document_attention(q, k, v, doc_starts, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    mask = Documents.of(doc_starts, q.shape[2]).block_mask()
    return flex_attention(q, k, v, block_mask=mask, enable_gqa=enable_gqa)


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: dict
                     ) -> torch.Tensor:
    """Attention of new tokens (q, k, v (B, H, T, D)) over the keys and values `cache` holds
    of the tokens before them, then causally among themselves; appends k and v to the cache.
    One document: generation's incremental form of `attention`."""
    if cache:
        k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
    cache["k"], cache["v"] = k, v
    T, L = q.shape[2], k.shape[2]
    enable_gqa = k.shape[1] != q.shape[1]
    if T == L:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
    # query i is token L - T + i: it sees keys 0 .. L - T + i
    allowed = torch.arange(L, device=q.device) <= torch.arange(L - T, L, device=q.device)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=enable_gqa)


# Full logits up to this size are kept for backward (one head matmul each way); beyond it they are
# computed a chunk at a time and recomputed in backward. A 2k row at vocab 50k is 0.4 GB of fp32
# logits (kept); a 32k row is 6.6 GB (chunked). Recomputing ran the head matmul twice as often as
# needed, the gap to a nanoGPT-shaped step (docs/BENCHMARKS.md, bench_archs.py).
LOGITS_BUDGET_BYTES = 2 << 30


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk: int = 4096, budget: int = LOGITS_BUDGET_BYTES) -> torch.Tensor:
    """Mean next-token loss of `hidden @ weight.T` against `targets` (-100 = ignore). When all
    the fp32 logits would pass `budget` bytes, they are never materialised together: each
    chunk's logits are recomputed in backward (checkpoint) instead of kept."""
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    count = (t != -100).sum().clamp(min=1)
    if h.shape[0] * weight.shape[0] * 4 <= budget:
        return LinearCrossEntropy.apply(h, weight, t) / count
    total = h.new_zeros((), dtype=torch.float32)
    for i in range(0, h.shape[0], chunk):
        total = total + torch.utils.checkpoint.checkpoint(
            LinearCrossEntropy.apply, h[i:i + chunk], weight, t[i:i + chunk], use_reentrant=False)
    return total / count


class LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of the logits h @ weight.T (fp32) against t (-100 = ignored), with
    the head's matmuls, in one function whose backward needs only the fp32 log-probabilities.

    F.cross_entropy's backward writes a zero-filled (N, V) gradient, scatters into it, then
    reads it and the log-probabilities to write a third (N, V) tensor. Here the gradient of
    the logits, softmax - onehot, is made in place from the kept log-probabilities (one exp
    pass) and the per-row scale (upstream gradient, ignored rows) goes on the (N, d) sides of
    the two matmuls, not on the (N, V) matrix, which at a vocabulary of 50k is a visible share of
    a small model's step (tools/bench_archs.py). Memory is the same (N, V) fp32 tensor
    F.cross_entropy keeps.
    Under autocast the matmuls run in the autocast dtype, as the plain head's would. Its
    backward consumes what it kept, so it runs once (no retain_graph)."""

    @staticmethod
    def forward(ctx, h, weight, t):
        logits = h @ weight.t()  # (N, V), in the autocast dtype if any
        logp = torch.log_softmax(logits.float(), -1)
        valid = t != -100
        target = torch.where(valid, t, 0)  # any other negative target still fails in gather
        ctx.save_for_backward(h, weight, logp, target, valid)
        ctx.matmul_dtype, ctx.used = logits.dtype, False
        return -(logp.gather(1, target[:, None])[:, 0] * valid).sum()

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.used:
            raise RuntimeError("LinearCrossEntropy's backward ran twice: it consumes its saved "
                               "log-probabilities (do not use retain_graph through the loss)")
        ctx.used = True
        h, weight, logp, target, valid = ctx.saved_tensors
        grad = logp.exp_()  # softmax, in place: the log-probabilities are not needed again
        grad.scatter_add_(1, target[:, None], grad.new_full((grad.shape[0], 1), -1.0))
        dtype = ctx.matmul_dtype
        grad = grad.to(dtype)
        scale = (grad_loss * valid)[:, None].to(dtype)  # (N, 1): upstream gradient, ignored rows
        grad_h = (grad @ weight.to(dtype)) * scale
        grad_w = grad.t() @ (h.to(dtype) * scale)
        return grad_h.to(h.dtype), grad_w.to(weight.dtype), None


class ShortConv(nn.Module):
    """Causal depthwise convolution of width k; taps never reach into an earlier document."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, d) / math.sqrt(k))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, u: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
        # u (B, T, d); pos (B, T) position within the document, None when a row is one document
        # (then the taps before t = 0 are simply absent, and no mask is needed). Resonance's
        # short convolution and Mamba's.
        T = u.shape[1]
        y = torch.addcmul(self.bias, u, self.weight[0])
        for j in range(1, min(self.weight.shape[0], T)):
            tap = u[:, : T - j]  # u[t - j] for t >= j
            if pos is not None:  # a tap reaching back past the document's start reads zero
                tap = tap * (pos[:, j:, None] >= j)
            y[:, j:] += tap * self.weight[j]
        return y


# archs/flops.py's flops_per_token, which archs/__init__.py plugs in: longpack's, not one of the
# model files an exported folder ships (archs/hf/hf_remote.py), whose code imports nothing of
# longpack. StackedLM.flops_per_token (MoE's too) calls it.
MEASURE_FLOPS = None


class StackedLM(nn.Module):
    """embed -> blocks(x, pos, documents) -> final norm -> head, the part gpt_neox, resonance
    and mamba share: a subclass passes its config and block class, then initializes the
    weights.

    The final norm is FINAL_NORM = (its name, its class, built as cls(d_model, eps=norm_eps)):
    a LayerNorm `ln_f` (weight and bias) unless the subclass names another. Mamba's is Mamba-2's
    RMSNorm `norm_f` (weight only): under a name of its own, so that the weights of one never
    load into the other."""

    FINAL_NORM = ("ln_f", nn.LayerNorm)

    def __init__(self, cfg, block):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(block(cfg) for _ in range(cfg.n_layers))
        name, norm = self.FINAL_NORM
        self.add_module(name, norm(cfg.d_model, eps=cfg.norm_eps))
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.FINAL_NORM[0])(x)

    def hidden(self, input_ids: torch.Tensor, doc_starts: torch.Tensor | None = None):
        B, T = input_ids.shape
        docs = Documents.of(doc_starts, T)  # once per forward: every layer reads the same
        pos = positions(None, B, T, input_ids.device) if docs is None else docs.positions()
        x = self.embed(input_ids)  # (B, T, d)
        for block in self.blocks:
            if self.cfg.checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, pos, docs, use_reentrant=False)
            else:
                x = block(x, pos, docs)
        return self.final_norm(x)

    def forward(self, input_ids: torch.Tensor, doc_starts: torch.Tensor | None = None):
        """Logits (B, T, vocab). For training use `loss`, which never holds them all."""
        return self.head(self.hidden(input_ids, doc_starts))

    def loss(self, input_ids, targets, doc_starts=None) -> dict:
        """{'loss': mean next-token loss (targets -100 are ignored), 'ce', 'aux': 0}."""
        ce = chunked_cross_entropy(self.hidden(input_ids, doc_starts), self.head.weight, targets)
        return {"loss": ce, "ce": ce, "aux": ce.new_zeros(())}

    def param_roles(self) -> dict[str, str]:
        """{parameter name: optimizer role}, from the subclass's PARAM_ROLES table."""
        return param_roles(self, self.PARAM_ROLES)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token of a row of `seq` tokens, measured: MEASURE_FLOPS."""
        if MEASURE_FLOPS is None:
            raise RuntimeError("flops_per_token is longpack's measurement (archs/flops.py), "
                               "which this copy of the model files does not carry")
        return MEASURE_FLOPS(self, seq)
