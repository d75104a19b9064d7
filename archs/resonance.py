"""Resonance: an O(L log L) language model whose token mixing is a causal FFT long convolution.

Each channel c of the long convolution has the kernel
    k_c(t) = sum_n a_cn * exp(-alpha_cn * t) * cos(omega_cn * t + phi_cn),   t = 0 .. L-1
a sum of `num_frequencies` damped sinusoids with learned frequency omega, damping alpha > 0,
amplitude a and phase phi (the S4D / H3 / Hyena family). With z = exp(-alpha + i*omega) and
A = a * exp(i*phi), k(t) = Re(sum_n A_n z_n^t). The kernel is generated in time, per step, as a
matrix product: with t = i*S + j (S = ceil(sqrt(L)), i < ceil(L / S), j < S), z^t = z^(iS) z^j,
so a channel's kernel, laid out as a (L/S, S) grid, is Re(P @ Q) with P[i, n] = A_n z_n^(iS) and
Q[n, j] = z_n^j: one real batched matmul over the channels, [Re P, -Im P] (L/S, 2n) @
[Re Q; Im Q] (2n, S). That is the d * n * L multiply-adds of the definition, in BLAS, from
tensors of only d * n * (L/S + S) powers, each computed directly from alpha and omega (angles in
float64, reduced mod 2 pi), never by repeated multiplication, so no error accumulates along t.
The kernel stays in fp32 under autocast (a sum of n terms, each up to |a|). The 2L-point rfft of
the kernel is its spectrum; zero padding to 2L makes the FFT product a linear (not circular)
convolution, so outputs at t only see inputs at <= t.

A block: x + out(gate * (longconv(shortconv(u)) + D * u)) with (u, gate) = in(LN(x)), then
x + MLP(LN(x)). The short causal depthwise convolution (width 3) sharpens local features. With
`doc_starts` every document's convolutions restart: the short one masks taps that would reach
into the previous document; the long one convolves each document apart, in a few batched FFTs:
the documents of all rows are grouped by their FFT length (the smallest 2^a or 3 x 2^a at
least twice the document's length), each group one zero-padded (documents, d, length) tensor
and one rfft/irfft pair, with one kernel spectrum per group. The grouping is made once per
forward from the documents' spans (one read of doc_starts, archs/documents.py) and moves rows
by gathers both ways (`_Regroup`). A group's FFT may be longer than a document's 2n: the
linear convolution of n inputs with the kernel's first L >= n taps is exact for FFT lengths
>= n + L - 1, and the outputs past n are dropped.
"""

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .documents import Documents, to_device
from .layers import ShortConv, StackedLM
from .limits import EPS, FLAG, SIZE, STD, VOCAB, check_fields


@dataclass(frozen=True)
class ResonanceConfig:
    vocab_size: int = 50257
    d_model: int = 768
    n_layers: int = 6
    num_frequencies: int = 64
    d_ff: int | None = None  # MLP width; None = 4 * d_model
    short_conv: int = 3
    max_seq: int = 32768
    norm_eps: float = 1e-5
    init_std: float = 0.02
    checkpointing: bool = False
    tie_embeddings: bool = False  # the output head is the embedding (a model with "tied weights")

    def __post_init__(self):  # each field's range: archs/limits.py
        check_fields(self, vocab_size=VOCAB, d_model=SIZE, n_layers=SIZE, num_frequencies=SIZE,
                     d_ff=SIZE, short_conv=SIZE, max_seq=SIZE, norm_eps=EPS, init_std=STD,
                     checkpointing=FLAG, tie_embeddings=FLAG)

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def repeated(self) -> dict[str, int]:
        """Fields that count identical modules (archs.footprint), as in gpt_neox.py."""
        return {"n_layers": 1}


def kernel_spectrum(log_alpha, omega, amp, phase, L: int) -> torch.Tensor:
    """rfft of each channel's kernel, zero-padded to 2L: complex (d, L + 1). Parameters (d, n)."""
    return torch.fft.rfft(resonance_kernel(log_alpha, omega, amp, phase, L), n=2 * L)


def resonance_kernel(log_alpha, omega, amp, phase, L: int) -> torch.Tensor:
    """Each channel's kernel k(t), t < L: real (d, L), in the parameters' dtype. Parameters (d, n).

    Cost: d * n * L multiply-adds in one batched matmul. Channels go in slices of ~2^24 powers
    (n x (L/S + S) each), each recomputed in backward rather than kept, so memory is the (d, L)
    kernel, not the slices' powers (at 32k, d 2048, n 256 they would be GBs per layer)."""
    d, n = omega.shape
    S = math.isqrt(max(L - 1, 0)) + 1  # ceil(sqrt(L)) for L >= 1
    rows = -(-L // S)
    # On meta (archs/flops.py counts FLOPs there) nothing is stored: one slice, not recomputed,
    # the same matmul FLOPs in a few operators
    step = d if omega.is_meta else max(1, (1 << 24) // (n * (rows + S)))
    slices = []
    device = omega.device.type
    # the meta device (FLOPs are counted there, archs/flops.py) has no autocast to turn off
    with (torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device)
          else contextlib.nullcontext()):
        for c in range(0, d, step):
            args = (log_alpha[c:c + step], omega[c:c + step], amp[c:c + step],
                    phase[c:c + step], L, S)
            if torch.is_grad_enabled() and omega.requires_grad and not omega.is_meta:
                slices.append(torch.utils.checkpoint.checkpoint(_kernel, *args,
                                                                use_reentrant=False))
            else:
                slices.append(_kernel(*args))
    return torch.cat(slices)


def _kernel(log_alpha, omega, amp, phase, L: int, S: int) -> torch.Tensor:
    s, n = omega.shape
    rows = -(-L // S)
    wide = torch.float64
    i = torch.arange(rows, device=omega.device, dtype=wide) * S  # (rows,) t at each grid row
    j = torch.arange(S, device=omega.device, dtype=wide)  # (S,) t within a row
    P_re, P_im = _powers(log_alpha, omega, i, phase.to(wide)[..., None])  # (s, n, rows)
    Q_re, Q_im = _powers(log_alpha, omega, j, 0.0)  # (s, n, S)
    left = torch.cat([amp[..., None] * P_re, -amp[..., None] * P_im], 1)  # (s, 2n, rows)
    right = torch.cat([Q_re, Q_im], 1)  # (s, 2n, S)
    grid = torch.bmm(left.transpose(1, 2), right)  # (s, rows, S): Re(P @ Q)
    return grid.reshape(s, rows * S)[:, :L]


def _powers(log_alpha, omega, t, shift):
    """Re and Im of z^t * exp(i * shift), (s, n, len(t)), from alpha and omega directly: the
    angle omega * t + shift is formed in float64 and reduced mod 2 pi before it is rounded (at
    t = 32k an fp32 product would be off by ~0.01 rad)."""
    angle = torch.remainder(omega.to(t.dtype)[..., None] * t + shift, 2 * math.pi)
    angle = angle.to(omega.dtype)
    decay = torch.exp(-log_alpha.exp()[..., None] * t.to(omega.dtype))
    return decay * angle.cos(), decay * angle.sin()


def fft_causal_conv(x: torch.Tensor, spectrum: torch.Tensor, L: int) -> torch.Tensor:
    """x (B, d, T) fp32 with T <= L, spectrum (d, L + 1) of the 2L-padded kernel -> (B, d, T)."""
    T = x.shape[-1]
    return torch.fft.irfft(torch.fft.rfft(x, n=2 * L) * spectrum, n=2 * L)[..., :T]


class LongConv(nn.Module):
    # archs/flops.py: its FFTs' N log N FLOPs are no polynomial in the row's length
    flops_seq_period = None

    def __init__(self, cfg: ResonanceConfig):
        super().__init__()
        d, n = cfg.d_model, cfg.num_frequencies
        # Frequencies spread over (0, pi); damping from slow (long memory) to fast.
        self.omega = nn.Parameter(torch.rand(d, n) * math.pi)
        self.log_alpha = nn.Parameter(torch.log(torch.logspace(-4, -0.5, n)).repeat(d, 1))
        self.amp = nn.Parameter(torch.randn(d, n) / math.sqrt(n))
        self.phase = nn.Parameter(torch.rand(d, n) * 2 * math.pi)
        self.skip = nn.Parameter(torch.ones(d))

    def forward(self, u: torch.Tensor, doc_starts) -> torch.Tensor:
        # u (B, T, d); doc_starts: Documents, a (B, K) tensor or None
        B, T, d = u.shape
        kernel = resonance_kernel(self.log_alpha, self.omega, self.amp, self.phase, T)  # (d, T)
        if doc_starts is None:
            # The FFTs run in fp32 along time, on a contiguous (B, d, T) copy: one copy does the
            # cast and the layout (an FFT over a strided axis is slower, backward most).
            x = u.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
            y = fft_causal_conv(x, torch.fft.rfft(kernel, n=2 * T), T).transpose(1, 2)
        else:
            y = grouped_document_conv(u, kernel, Documents.of(doc_starts, T))
        return (y + u * self.skip).to(u.dtype)  # (B, T, d)


def grouped_document_conv(u: torch.Tensor, kernel: torch.Tensor, docs: Documents) -> torch.Tensor:
    """Each document of u (B, T, d) convolved causally with the kernel (d, T) on its own, by
    FFT groups (module docstring): (B, T, d) fp32."""
    B, T, d = u.shape
    groups, into, back = docs.once("resonance_fft", lambda: fft_plan(docs.spans(), T, u.device))
    slots = _Regroup.apply(u.reshape(B * T, d).float(), into, back)  # (S, d), groups in turn
    outs = []
    for (count, length, n_fft), part in zip(groups, slots.split([c * n for c, n, _ in groups])):
        x = part.view(count, length, d).transpose(1, 2).contiguous()  # (count, d, length)
        spectrum = torch.fft.rfft(kernel[:, :length], n=n_fft)
        y = torch.fft.irfft(torch.fft.rfft(x, n=n_fft) * spectrum, n=n_fft)[..., :length]
        outs.append(y.transpose(1, 2).reshape(count * length, d))
    return _Regroup.apply(torch.cat(outs), back, into).view(B, T, d)


def fft_size(n: int) -> int:
    """The smallest 2^a or 3 x 2^a >= n: FFT lengths within 4/3 of n that the FFT libraries
    run at full speed."""
    power = 1 << max(n - 1, 0).bit_length()
    return 3 * power // 4 if 3 * power // 4 >= n else power


def fft_plan(spans: list[list[tuple[int, int]]], seq: int, device: torch.device):
    """The FFT groups of the rows' documents, made on the host: [(documents, their longest
    length L, FFT length)], `into` (S,) the row position (of B * seq; B * seq: a zero) of each
    slot of the groups' (documents, L) buffers laid end to end, and `back` (B * seq,) the slot
    of each row position."""
    by_size = {}
    for b, row in enumerate(spans):
        for lo, hi in row:
            by_size.setdefault(fft_size(2 * (hi - lo)), []).append((b * seq + lo, hi - lo))
    total = len(spans) * seq
    groups, into, back, slot = [], [], np.empty(total, dtype=np.int64), 0
    for n_fft in sorted(by_size):
        first, length = np.array(by_size[n_fft]).T
        longest = int(length.max())
        t = np.arange(longest)
        where = first[:, None] + t  # (documents, L): the row position of each slot
        real = t < length[:, None]
        back[where[real]] = slot + np.flatnonzero(real)
        into.append(np.where(real, where, total).ravel())
        groups.append((len(first), longest, n_fft))
        slot += where.size
    return groups, to_device(np.concatenate(into), device), to_device(back, device)


class _Regroup(torch.autograd.Function):
    """rows (n, d) -> rows[index] (a zero row where index is n), whose backward is the same
    gather by `inverse` (index's inverse map): a gather both ways, never index_select's
    scatter-add backward, which runs serially on CPU."""

    @staticmethod
    def forward(ctx, rows, index, inverse):
        ctx.save_for_backward(index, inverse)
        return F.pad(rows, (0, 0, 0, 1)).index_select(0, index)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        index, inverse = ctx.saved_tensors
        return F.pad(grad, (0, 0, 0, 1)).index_select(0, inverse), None, None


class Block(nn.Module):
    def __init__(self, cfg: ResonanceConfig):
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.inp = nn.Linear(d, 2 * d)
        self.short = ShortConv(d, cfg.short_conv)
        self.long = LongConv(cfg)
        self.out = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.fc_in = nn.Linear(d, cfg.ff)
        self.fc_out = nn.Linear(cfg.ff, d)

    def forward(self, x, pos, doc_starts):
        u, gate = self.inp(self.ln1(x)).chunk(2, dim=-1)  # (B, T, d) each
        y = self.long(self.short(u, None if doc_starts is None else pos), doc_starts)
        x = x + self.out(y * F.silu(gate))
        return x + self.fc_out(F.gelu(self.fc_in(self.ln2(x))))


class Resonance(StackedLM):
    PARAM_ROLES = (  # each parameter's optimizer role (longpack.archs.layers.OPTIMIZER_ROLES), by name
        ("embed.weight", "embedding"),
        ("head.weight", "head"),
        ("ln_f.*", "norm"), ("blocks.*.ln1.*", "norm"), ("blocks.*.ln2.*", "norm"),
        ("blocks.*.long.*", "kernel"), ("blocks.*.short.weight", "kernel"),
        ("blocks.*.bias", "bias"),
        ("blocks.*.inp.weight", "matrix"), ("blocks.*.out.weight", "matrix"),
        ("blocks.*.fc_in.weight", "matrix"), ("blocks.*.fc_out.weight", "matrix"),
    )

    def __init__(self, cfg: ResonanceConfig):
        super().__init__(cfg, Block)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=cfg.init_std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for block in self.blocks:  # scaled residual init, as in gpt_neox.py
            for proj in (block.out, block.fc_out):
                nn.init.normal_(proj.weight, std=cfg.init_std / math.sqrt(2 * cfg.n_layers))
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight


PRESETS = {
    "resonance-tiny": dict(vocab_size=512, d_model=64, n_layers=2, num_frequencies=16,
                           max_seq=256),
    "resonance-small": dict(d_model=768, n_layers=6, num_frequencies=64),
    "resonance-medium": dict(d_model=1024, n_layers=12, num_frequencies=128),
    "resonance-large": dict(d_model=2048, n_layers=16, num_frequencies=256),
    "resonance-xlarge": dict(d_model=4096, n_layers=24, num_frequencies=512),
}
