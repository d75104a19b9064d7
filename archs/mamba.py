"""Mamba: a selective state-space language model (Mamba-2's block, in plain PyTorch).

Each layer mixes tokens with a state h of H heads x P channels x N state entries, per head
    h_t = exp(dt_t * A) h_{t-1} + dt_t x_t B_t^T,        y_t = h_t C_t + D x_t
where the step dt_t > 0 (softplus), the input and output maps B_t, C_t (N each, shared by the
heads of a group) and x_t come from the token itself ("selective"), and A < 0 is one scalar per
head (Mamba-2's scalar decay). Training uses the chunked ("state space duality") form: within a
chunk of Q tokens, y = (C B^T * L) (dt x) with L[t, s] = exp(sum of dt A over s < r <= t), a
masked Q x Q product like attention's; across chunks, the state at each chunk's end carries
over by the recurrence, one step per chunk. Generation uses the recurrent form, one token at a
time with O(1) state (`decode` with a cache); tests check the two agree (fp32, 1e-5).

A block: x + out(norm(y * silu(z))) with (z, xBC, dt) = in(RMSNorm(x)) and xBC through a short
causal depthwise convolution (width 4) and SiLU first. With `doc_starts` the state and the
convolution restart at each document start: L is zero between documents, a chunk's carried
state reaches only tokens of the document it belongs to, and convolution taps never reach back
past a start. In training a layer keeps only in's input and output and out's input: all between
(the convolution, the scan's chunk decays, products and states, the gated norm) is made again
in backward (`LeanMix`), which costs that part's forward once more and cuts what a layer keeps
to about a fifth (archs/activations.py). The scan is ssd_chunked, or on CUDA
flash-linear-attention's kernel where it is installed (`scan_name`). The last block is followed
by an RMSNorm (`norm_f`, weight only), and embeddings are tied to the output head, as in the
published Mamba-2 models (`tie_embeddings false` gives the head weights of its own, as
transformers' Mamba2ForCausalLM has by default), so the presets' sizes (130m, 370m, 1.3b:
Mamba-2's published widths and depths) are what they say, and a trained model is transformers'
Mamba2ForCausalLM weight for weight (archs/hf/native.py). The gated RMSNorm spans the whole
inner width, as transformers' Mamba2 computes it for any n_groups (mamba_ssm's own module normalizes each
group apart; with one group, every preset's, the two are one).
The mixer (`MambaMixer`) is also the Mamba layer of the MoE family's hybrids (archs/moe.py).
"""

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .documents import Documents, to_device
from .layers import ShortConv, StackedLM
from .limits import CHUNK, EPS, FLAG, SIZE, STD, VOCAB, Range, check_fields


@dataclass(frozen=True)
class MambaConfig:
    vocab_size: int = 50257
    d_model: int = 768
    n_layers: int = 24
    d_state: int = 128  # N
    expand: int = 2  # inner width = expand x d_model
    head_dim: int = 64  # P; heads H = inner width / P
    n_groups: int = 1  # B and C are shared by the heads of a group
    conv_width: int = 4
    chunk: int = 64  # Q of the chunked form
    dt_min: float = 0.001
    dt_max: float = 0.1
    max_seq: int = 32768
    norm_eps: float = 1e-5
    init_std: float = 0.02
    checkpointing: bool = False
    # the output head is the embedding (Mamba-2's own models); False: a head of its own, as
    # transformers' Mamba2ForCausalLM makes by default (tie_word_embeddings false)
    tie_embeddings: bool = True

    def __post_init__(self):  # each field's range: archs/limits.py
        check_fields(self, vocab_size=VOCAB, d_model=SIZE, n_layers=SIZE, d_state=SIZE,
                     expand=SIZE, head_dim=SIZE, n_groups=SIZE, conv_width=SIZE, chunk=CHUNK,
                     dt_min=Range(0, low_open=True), dt_max=Range(0, low_open=True),
                     max_seq=SIZE, norm_eps=EPS, init_std=STD, checkpointing=FLAG,
                     tie_embeddings=FLAG)
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min {self.dt_min} is above dt_max {self.dt_max}: the steps "
                             "start log-uniform between them")
        inner = self.expand * self.d_model
        if inner % self.head_dim:
            raise ValueError(f"expand x d_model ({inner}) is not a multiple of head_dim "
                             f"{self.head_dim}")
        if (inner // self.head_dim) % self.n_groups:
            raise ValueError(f"the {inner // self.head_dim} heads do not split into n_groups "
                             f"{self.n_groups}")

    @property
    def repeated(self) -> dict[str, int]:
        """Fields that count identical modules (archs.footprint), as in gpt_neox.py."""
        return {"n_layers": 1}


def ssd_chunked(x, dt, A, B, C, seg=None, chunk: int = 64, state=None):
    """The selective scan, chunked. x (b, T, G, R, P); dt (b, T, G, R) > 0; A (G, R) < 0;
    B, C (b, T, G, N); seg (b, T) document ids or None; state (b, G, R, P, N) carried in (the
    tokens before, of the first token's document) or None. Returns y like x, and the state
    after the last token. Work in fp32. The products with B and C are taken per group with
    the heads' channels side by side (a (R P) x Q by Q x N matmul), not with B and C copied
    over the heads; y is summed in the input's layout (b, chunk, Q, G, R, P)."""
    b, T, G, R, P = x.shape
    N = B.shape[-1]
    Q = min(chunk, T)
    pad = -T % Q
    if pad:  # dt = 0 on padding: no decay, no input, so the final state is untouched
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
        if seg is not None:
            seg = torch.cat([seg, seg[:, -1:].expand(b, pad)], 1)
    c = (T + pad) // Q
    dtx = (x * dt[..., None]).reshape(b, c, Q, G, R, P)
    S = torch.cumsum((dt * A).reshape(b, c, Q, G, R), 2)  # log decay from the chunk's start
    S_t = S.permute(0, 1, 3, 4, 2)  # (b, c, G, R, Q)
    Bt = B.reshape(b, c, Q, G, N).transpose(2, 3)  # (b, c, G, Q, N)
    Ct = C.reshape(b, c, Q, G, N).transpose(2, 3)
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    if seg is None:
        same, last_same, carried = causal, None, None
    else:
        seg = seg.reshape(b, c, Q)
        same = causal & (seg[:, :, :, None] == seg[:, :, None, :])[:, :, None, None]
        last_same = (seg == seg[:, :, -1:])  # (b, c, Q): in the chunk's last document
        before = torch.cat([seg[:, :1, :1], seg[:, :-1, -1:]], 1)  # the carried state's document
        carried = (seg == before)  # (b, c, Q): tokens the carried state reaches
    # within the chunk: (C B^T * L) (dt x)
    L = torch.exp(torch.where(same, S_t[..., :, None] - S_t[..., None, :], -math.inf))
    CB = (Ct @ Bt.transpose(-1, -2))[:, :, :, None]  # (b, c, G, 1, Q, Q)
    y = (CB * L) @ dtx.permute(0, 1, 3, 4, 2, 5)  # (b, c, G, R, Q, P)
    # each chunk's own contribution to the state at its end: (dt x decay)^T B, per group
    to_end = torch.exp(S[:, :, -1:] - S)  # (b, c, Q, G, R)
    if last_same is not None:
        to_end = to_end * last_same[..., None, None]
    w = (dtx * to_end[..., None]).reshape(b, c, Q, G, R * P)
    local = (w.permute(0, 1, 3, 4, 2) @ Bt).reshape(b, c, G, R, P, N)
    # across chunks: the recurrence, one step per chunk
    h = x.new_zeros(b, G, R, P, N) if state is None else state
    keep = torch.exp(S[:, :, -1])  # (b, c, G, R): how much of the carried state survives
    if carried is not None:
        keep = keep * carried[:, :, -1, None, None]
    starts = []
    # unbind, not local[:, k]: each indexing's backward would write a whole zero gradient
    # (quadratic in the chunks); unbind's stacks them once
    for own, kept in zip(local.unbind(1), keep.unbind(1)):
        starts.append(h)
        h = torch.addcmul(own, kept[..., None, None], h)
    h_in = torch.stack(starts, 1)  # (b, c, G, R, P, N): the state each chunk starts from
    # the carried state's part of each output: exp(S_t) C_t h_in, per group
    from_state = (Ct @ h_in.reshape(b, c, G, R * P, N).transpose(-1, -2)).reshape(
        b, c, G, Q, R, P).transpose(2, 3)  # (b, c, Q, G, R, P)
    reach = torch.exp(S)  # (b, c, Q, G, R)
    if carried is not None:
        reach = reach * carried[..., None, None]
    y = torch.addcmul(y.permute(0, 1, 4, 2, 3, 5), from_state, reach[..., None])
    y = y.reshape(b, c * Q, G, R, P)[:, :T]
    return y, h


def ssd_recurrent(x, dt, A, B, C, seg=None, state=None):
    """The same scan one token at a time (generation's form; a reference for the chunked one).
    Shapes as ssd_chunked's; a document start (seg changes) empties the state."""
    b, T, G, R, P = x.shape
    h = x.new_zeros(b, G, R, P, B.shape[-1]) if state is None else state
    ys = []
    for t in range(T):
        if seg is not None and t > 0:
            h = h * (seg[:, t] == seg[:, t - 1]).to(h.dtype)[:, None, None, None, None]
        decay = torch.exp(dt[:, t] * A)  # (b, G, R)
        inp = (dt[:, t, ..., None] * x[:, t])[..., None] * B[:, t, :, None, None, :]
        h = decay[..., None, None] * h + inp  # (b, G, R, P, N)
        ys.append((h @ C[:, t, :, None, :, None])[..., 0])  # (b, G, R, P)
    return torch.stack(ys, 1), h


# -- which scan runs: on CUDA with flash-linear-attention's Triton kernels installed (the `gpu`
# extra, fla-core) its chunk_simple_gla, Mamba-2's SSD with one decay per head (q = C, k = B,
# v = dt x, g = dt A, scale 1; documents as cu_seqlens); else ssd_chunked, the reference.
_FLA = []  # chunk_simple_gla once imported, or None when it cannot be


def fla_kernel():
    """flash-linear-attention's chunk_simple_gla, or None when the package is not importable."""
    if not _FLA:
        try:
            from fla.ops.simple_gla import chunk_simple_gla
        except Exception:  # absent, or its Triton cannot load: the PyTorch scan runs
            chunk_simple_gla = None
        _FLA.append(chunk_simple_gla)
    return _FLA[0]


def scan_name(device) -> str:
    """"fla" (CUDA, flash-linear-attention installed) or "pytorch" (ssd_chunked)."""
    cuda = torch.device(device).type == "cuda"
    return "fla" if cuda and torch.cuda.is_available() and fla_kernel() else "pytorch"


def scan_lines(cfg, device) -> list[str]:
    """`train --dry-run`'s line on which scan a model's Mamba layers run (none without any)."""
    if not isinstance(cfg, MambaConfig) and not getattr(cfg, "uses", lambda _: False)("M"):
        return []
    if scan_name(device) == "fla":
        return ["  scan        Mamba layers: flash-linear-attention's chunk_simple_gla (Triton)"]
    why = ("flash-linear-attention is not installed: pip install -e '.[gpu]'"
           if torch.device(device).type == "cuda" else "its GPU kernel runs only on CUDA")
    return [f"  scan        Mamba layers: the PyTorch chunked scan (ssd_chunked; {why})"]


def fla_scan(x, dt, A, B, C, seg=None, cu_seqlens=None):
    """ssd_chunked's output through chunk_simple_gla: the rows end to end, cut at every row and
    document start (cu_seqlens: a model's, made once per forward by `kernel_cu_seqlens`; else
    found from seg here). No state in or out (generation runs ssd_chunked)."""
    b, T, G, R, P = x.shape
    N, H = B.shape[-1], G * R
    heads = (b, T, G, R, N)
    q = C[:, :, :, None].expand(heads).reshape(1, b * T, H, N)
    k = B[:, :, :, None].expand(heads).reshape(1, b * T, H, N)
    v = (x * dt[..., None]).reshape(1, b * T, H, P)
    g = (dt * A).reshape(1, b * T, H)
    if cu_seqlens is None:
        cu_seqlens = kernel_cu_seqlens(None, b, T, x.device) if seg is None else \
            _cu_seqlens_of_segments(seg)
    y, _ = fla_kernel()(q, k, v, g, scale=1.0, cu_seqlens=cu_seqlens)
    return y.reshape(b, T, G, R, P)


def kernel_cu_seqlens(docs: Documents | None, b: int, T: int, device) -> torch.Tensor:
    """The kernel's sequences: b rows of T end to end, cut at every document start. Made once
    per forward from the documents' spans (the kernel reads its cu_seqlens on the host anyway:
    fla caches what it makes of one cu_seqlens tensor, so every layer passes the same one)."""
    if docs is None:
        return torch.arange(0, b * T + 1, T, device=device)
    return docs.once("cu_seqlens", lambda: to_device(
        [r * T + lo for r, row in enumerate(docs.spans()) for lo, _ in row] + [b * T], device))


def _cu_seqlens_of_segments(seg: torch.Tensor) -> torch.Tensor:
    """cu_seqlens from document ids (b, T) (a caller's scan without Documents): one nonzero."""
    b, T = seg.shape
    new = torch.ones(b, T, dtype=torch.bool, device=seg.device)
    new[:, 1:] = seg[:, 1:] != seg[:, :-1]
    starts = new.reshape(-1).nonzero()[:, 0]
    return torch.cat([starts, starts.new_tensor([b * T])])


def scan(x, dt, A, B, C, seg, chunk: int, docs: Documents | None = None):
    """The training scan's output: the kernel's on CUDA where it is installed (scan_name).
    `docs`: the forward's documents, whose cu_seqlens the kernel takes (seg's ids otherwise)."""
    if scan_name(x.device) == "fla":
        cu = None if docs is None else kernel_cu_seqlens(docs, x.shape[0], x.shape[1], x.device)
        return fla_scan(x, dt, A, B, C, seg, cu)
    return ssd_chunked(x, dt, A, B, C, seg, chunk)[0]


class LeanMix(torch.autograd.Function):
    """MambaMixer.mix keeping only in_proj's output u (in the dtype in_proj made it: bf16 under
    autocast) and the documents: forward runs mix without a graph, backward runs it
    again with one under the forward's autocast and differentiates it. The same operations in
    the same order: outputs and gradients are the plain path's (`lean = False`), bit for bit."""

    @staticmethod
    def forward(ctx, mixer, u, doc_starts, dtype, *params):
        ctx.mixer, ctx.dtype, ctx.params = mixer, dtype, params
        device = u.device.type  # (autocast has no meta device; an fp32 dtype raises)
        if not torch.amp.is_autocast_available(device):
            ctx.autocast = contextlib.nullcontext()
        elif torch.is_autocast_enabled(device):
            ctx.autocast = torch.autocast(device, torch.get_autocast_dtype(device))
        else:
            ctx.autocast = torch.autocast(device, enabled=False)
        ctx.save_for_backward(u)
        ctx.docs = doc_starts  # Documents (what they made is kept for backward's mix) or None
        with torch.no_grad():
            return mixer.mix(u.detach(), doc_starts, dtype)

    @staticmethod
    def backward(ctx, grad):
        u, = ctx.saved_tensors
        u = u.detach().requires_grad_(ctx.needs_input_grad[1])
        wrt = [t for t, need in zip((u, *ctx.params), (ctx.needs_input_grad[1],
                                                      *ctx.needs_input_grad[4:])) if need]
        with torch.enable_grad(), ctx.autocast:
            y = ctx.mixer.mix(u, ctx.docs, ctx.dtype)
        got = iter(torch.autograd.grad(y, wrt, grad))
        grads = [next(got) if need else None for need in ctx.needs_input_grad]
        return None, grads[1], None, None, *grads[4:]


class MambaMixer(nn.Module):
    """The token mixer of a Mamba block (no residual, no pre-norm): what a layer adds."""

    lean = True  # backward makes mix's tensors again (LeanMix); False: autograd keeps them

    def __init__(self, d_model: int, d_state: int = 128, expand: int = 2, head_dim: int = 64,
                 n_groups: int = 1, conv_width: int = 4, chunk: int = 64, norm_eps: float = 1e-5,
                 dt_min: float = 0.001, dt_max: float = 0.1):
        super().__init__()
        inner = expand * d_model
        self.heads, self.head_dim, self.groups = inner // head_dim, head_dim, n_groups
        self.d_state, self.chunk, self.inner, self.eps = d_state, chunk, inner, norm_eps
        conv_dim = inner + 2 * n_groups * d_state
        self.in_proj = nn.Linear(d_model, inner + conv_dim + self.heads, bias=False)
        self.conv = ShortConv(conv_dim, conv_width)
        # dt starts log-uniform in [dt_min, dt_max] (its bias is softplus's inverse of that);
        # A = -exp(A_log) starts in [-16, -1], one per head; D (the skip) at 1.
        dt = torch.exp(torch.rand(self.heads) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.heads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = nn.Parameter(torch.ones(inner))  # gated RMSNorm's scale
        self.out_proj = nn.Linear(inner, d_model, bias=False)

    def forward(self, x, pos, doc_starts, cache: dict | None = None):
        """x (b, T, d). `cache` (generation, one document): {} at first; holds the last
        conv_width - 1 inputs of the convolution and the state, updated here."""
        u = self.in_proj(x)  # (b, T, z | x B C | dt)
        doc_starts = Documents.of(doc_starts, x.shape[1])
        if cache is None and self.lean and torch.is_grad_enabled() \
                and not torch.compiler.is_compiling():  # Inductor's partitioner picks its own
            y = LeanMix.apply(self, u, doc_starts, x.dtype, *self.mix_params())
        else:
            y = self.mix(u, doc_starts, x.dtype, cache)
        return self.out_proj(y)

    def mix_params(self) -> tuple:
        """The parameters `mix` reads (LeanMix's inputs, so that their gradients flow)."""
        return self.conv.weight, self.conv.bias, self.dt_bias, self.A_log, self.D, self.norm

    def mix(self, u, doc_starts, dtype: torch.dtype, cache: dict | None = None):
        """in_proj's output u (b, T, 2 inner + 2 G N + H) -> out_proj's input (b, T, inner):
        the convolution, the scan, the skip, the gate (in `dtype`, the layer's input's) and
        the gated RMSNorm."""
        b, T, _ = u.shape
        G, R, P, N = self.groups, self.heads // self.groups, self.head_dim, self.d_state
        z, xBC, dt = u.split([self.inner, self.inner + 2 * G * N, self.heads], -1)
        doc_starts = Documents.of(doc_starts, T)
        if cache is None:
            # taps stop at document starts; positions from doc_starts, not `pos`: a
            # depth-routed block (archs/moe.py) passes its chosen tokens with their places in
            # the whole row, and the convolution runs over the chosen ones
            xBC = self.conv(xBC, None if doc_starts is None else doc_starts.positions())
        else:  # the convolution sees the inputs before these too
            width = self.conv.weight.shape[0] - 1
            past = cache.get("conv", xBC.new_zeros(b, width, xBC.shape[-1]))
            both = torch.cat([past, xBC], 1)
            cache["conv"] = both[:, both.shape[1] - width:]
            xBC = self.conv(both, None)[:, width:]
        xs, Bm, Cm = F.silu(xBC).split([self.inner, G * N, G * N], -1)
        xs = xs.float().view(b, T, G, R, P)
        Bm, Cm = Bm.float().view(b, T, G, N), Cm.float().view(b, T, G, N)
        dt = F.softplus(dt.float() + self.dt_bias).view(b, T, G, R)
        A = -torch.exp(self.A_log.float()).view(G, R)
        seg = None if doc_starts is None else doc_starts.segments()
        if cache is None:
            y = scan(xs, dt, A, Bm, Cm, seg, self.chunk, doc_starts)
        elif T == 1:  # a generated token: the recurrent step
            y, cache["ssm"] = ssd_recurrent(xs, dt, A, Bm, Cm, None, cache.get("ssm"))
        else:  # a prompt: chunked, from (and into) the cached state
            y, cache["ssm"] = ssd_chunked(xs, dt, A, Bm, Cm, None, self.chunk, cache.get("ssm"))
        y = y + xs * self.D.float().view(G, R, 1)
        y = y.reshape(b, T, self.inner).to(dtype) * F.silu(z)
        return F.rms_norm(y, (self.inner,), self.norm, self.eps)

    @property
    def flops_seq_period(self) -> int:
        """For archs/flops.py: this layer's FLOPs are linear in the row's length padded to
        whole chunks, so over the lengths of one residue modulo the chunk, from one chunk on,
        a polynomial in the length (which a few short rows fit exactly)."""
        return self.chunk


class Block(nn.Module):
    def __init__(self, cfg: MambaConfig):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(cfg.d_model))  # RMSNorm before the mixer
        self.eps = cfg.norm_eps
        self.mixer = MambaMixer(cfg.d_model, cfg.d_state, cfg.expand, cfg.head_dim,
                                cfg.n_groups, cfg.conv_width, cfg.chunk, cfg.norm_eps,
                                cfg.dt_min, cfg.dt_max)

    def forward(self, x, pos, doc_starts, cache: dict | None = None):
        h = F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)
        return x + self.mixer(h, pos, doc_starts, cache)


class OutdatedWeights(ValueError):
    """Weights of a Mamba from before it ended in an RMSNorm: they do not load (one line)."""


def refuse_layernorm_weights(names) -> None:
    """OutdatedWeights when `names` (a checkpoint's tensor names, under any prefix: "model.",
    an optimizer state's) are a Mamba's that ends in a LayerNorm (`ln_f.weight`, `ln_f.bias`),
    as every Mamba did before its final norm became Mamba-2's RMSNorm (`norm_f.weight`). No
    weights make one norm the other (a LayerNorm subtracts the mean and adds its bias, an
    RMSNorm neither), so such weights are refused rather than half loaded. Only
    a Mamba has `blocks.N.mixer.A_log` (a hybrid's Mamba layers are `ssm`), and only GPT-NeoX
    and resonance also have an `ln_f`: their checkpoints pass."""
    names = [f".{name}." for name in names]  # whole parts only: "x.ln_f.y", not "xln_f"
    if any(".ln_f." in n for n in names) and any(".mixer.A_log." in n for n in names):
        raise OutdatedWeights(
            "a Mamba that ends in a LayerNorm (ln_f.weight and ln_f.bias): it was trained "
            "before Mamba's final norm became Mamba-2's RMSNorm (norm_f.weight), and no weights "
            "make one the other; train it again with this longpack, or export, generate and "
            "eval it with the longpack that trained it")


def _refuse_layernorm_state(module, state_dict, prefix, *args) -> None:
    # load_state_dict's pre-hook: the old LayerNorm's weights would otherwise be "unexpected
    # keys" in a message of many lines (or, with strict=False, left out silently)
    refuse_layernorm_weights(name[len(prefix):] for name in state_dict if name.startswith(prefix))


class Mamba(StackedLM):
    # Mamba-2's final norm (module docstring), under a name of its own: the LayerNorm `ln_f`
    # it ended in before never loads into it
    FINAL_NORM = ("norm_f", nn.RMSNorm)
    PARAM_ROLES = (  # each parameter's optimizer role (longpack.archs.layers.OPTIMIZER_ROLES), by name
        ("embed.weight", "embedding"),  # tied (tie_embeddings): also the output head
        ("head.weight", "head"),  # a head of its own (tie_embeddings false)
        ("norm_f.weight", "norm"), ("blocks.*.norm", "norm"), ("blocks.*.mixer.norm", "norm"),
        ("blocks.*.mixer.in_proj.weight", "matrix"), ("blocks.*.mixer.out_proj.weight", "matrix"),
        ("blocks.*.mixer.conv.*", "kernel"), ("blocks.*.mixer.A_log", "kernel"),
        ("blocks.*.mixer.D", "kernel"), ("blocks.*.mixer.dt_bias", "kernel"),
    )

    def __init__(self, cfg: MambaConfig):
        super().__init__(cfg, Block)
        nn.init.normal_(self.embed.weight, std=cfg.init_std)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        else:
            nn.init.normal_(self.head.weight, std=cfg.init_std)
        self.register_load_state_dict_pre_hook(_refuse_layernorm_state)
        for block in self.blocks:
            nn.init.normal_(block.mixer.in_proj.weight, std=cfg.init_std)
            # scaled residual init on the branch's last projection, as in gpt_neox.py
            nn.init.normal_(block.mixer.out_proj.weight,
                            std=cfg.init_std / math.sqrt(2 * cfg.n_layers))

    def new_cache(self) -> list[dict]:
        """An empty state for `decode`: one dict per layer."""
        return [{} for _ in self.blocks]

    def decode(self, input_ids, cache: list[dict]):
        """Logits (B, T, vocab) of tokens that follow those `cache` holds (one document):
        generation's recurrent form (a prompt chunked into the state at once, then a step per
        token), equal to the full forward's logits."""
        x = self.embed(input_ids)
        for block, layer_cache in zip(self.blocks, cache):
            x = block(x, None, None, layer_cache)
        return self.head(self.final_norm(x))


# Widths and depths of the published Mamba-2 models (state 128, expand 2, head 64, tied
# embeddings); the tiny one is for tests.
PRESETS = {
    "mamba-tiny": dict(vocab_size=512, d_model=64, n_layers=2, d_state=16, head_dim=16,
                       chunk=16, max_seq=256),
    "mamba-130m": dict(d_model=768, n_layers=24),
    "mamba-370m": dict(d_model=1024, n_layers=48),
    "mamba-1.3b": dict(d_model=2048, n_layers=48),
}
