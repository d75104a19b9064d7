"""Resonance: an O(L log L) language model whose token mixing is a causal FFT long convolution.

Each channel c of the long convolution has the kernel
    k_c(t) = sum_n a_cn * exp(-alpha_cn * t) * cos(omega_cn * t + phi_cn),   t = 0 .. L-1
a sum of `num_frequencies` damped sinusoids with learned frequency omega, damping alpha > 0,
amplitude a and phase phi (the S4D / H3 / Hyena family). With z = exp(-alpha + i*omega) and
A = a * exp(i*phi), k(t) = Re(sum_n A_n z_n^t), so its length-2L DFT is, in closed form,
    K[f] = 1/2 sum_n [A_n G(z_n, f) + conj(A_n) G(conj(z_n), f)],
    G(z, f) = (1 - z^L (-1)^f) / (1 - z w^f),  w = exp(-2 pi i / 2L)
(a geometric series truncated at L). The kernel is generated there directly and never
materialised in time. Zero padding to 2L makes the FFT product a linear (not circular)
convolution, so outputs at t only see inputs at <= t.

A block: x + out(gate * (longconv(shortconv(u)) + D * u)) with (u, gate) = in(LN(x)), then
x + MLP(LN(x)). The short causal depthwise convolution (width 3) sharpens local features. With
`doc_starts` every document's convolutions restart: the long one runs per document, the short
one masks taps that would reach into the previous document.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from archs.layers import StackedLM


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

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model


def kernel_spectrum(log_alpha, omega, amp, phase, L: int) -> torch.Tensor:
    """rfft of each channel's kernel, zero-padded to 2L: complex (d, L + 1). Parameters (d, n).

    Cost O(d * n * L), the same as writing the kernel in time, but without the (d, L) kernel or
    its FFT. Channels go in slices of ~2^24 (n x frequency) terms, each recomputed in backward
    rather than kept, so memory is the (d, L + 1) result, not (d, n, L + 1)."""
    d, n = omega.shape
    step = max(1, (1 << 24) // max(1, n * (L + 1)))
    slices = []
    for i in range(0, d, step):
        args = (log_alpha[i:i + step], omega[i:i + step], amp[i:i + step], phase[i:i + step])
        if torch.is_grad_enabled() and omega.requires_grad:
            slices.append(torch.utils.checkpoint.checkpoint(_spectrum, *args, L,
                                                            use_reentrant=False))
        else:
            slices.append(_spectrum(*args, L))
    return torch.cat(slices)


def _spectrum(log_alpha, omega, amp, phase, L: int) -> torch.Tensor:
    f = torch.arange(L + 1, device=omega.device)
    w = torch.polar(torch.ones(L + 1, device=omega.device), -math.pi * f.float() / L)  # (F,)
    sign = 1 - 2 * (f % 2)  # (-1)^f
    z = torch.polar(torch.exp(-log_alpha.exp()), omega)  # (s, n): decay and rotation per step
    A = amp * torch.polar(torch.ones_like(phase), phase)  # (s, n)
    spec = 0
    for zz, AA in ((z, A), (z.conj(), A.conj())):
        num = 1 - zz[..., None] ** L * sign  # (s, n, F)
        spec = spec + (AA[..., None] * num / (1 - zz[..., None] * w)).sum(1)
    return 0.5 * spec


def fft_causal_conv(u: torch.Tensor, spectrum: torch.Tensor, L: int) -> torch.Tensor:
    """u (B, d, T) with T <= L, spectrum (d, L + 1) of the 2L-padded kernel -> (B, d, T)."""
    T = u.shape[-1]
    U = torch.fft.rfft(u.float(), n=2 * L)
    return torch.fft.irfft(U * spectrum, n=2 * L)[..., :T].to(u.dtype)


class LongConv(nn.Module):
    def __init__(self, cfg: ResonanceConfig):
        super().__init__()
        d, n = cfg.d_model, cfg.num_frequencies
        # Frequencies spread over (0, pi); damping from slow (long memory) to fast.
        self.omega = nn.Parameter(torch.rand(d, n) * math.pi)
        self.log_alpha = nn.Parameter(torch.log(torch.logspace(-4, -0.5, n)).repeat(d, 1))
        self.amp = nn.Parameter(torch.randn(d, n) / math.sqrt(n))
        self.phase = nn.Parameter(torch.rand(d, n) * 2 * math.pi)
        self.skip = nn.Parameter(torch.ones(d))

    def forward(self, u: torch.Tensor, doc_starts: torch.Tensor | None) -> torch.Tensor:
        # u (B, T, d)
        B, T, d = u.shape
        x = u.transpose(1, 2)  # (B, d, T)
        if doc_starts is None:
            spec = kernel_spectrum(self.log_alpha, self.omega, self.amp, self.phase, T)
            y = fft_causal_conv(x, spec, T)
        else:  # each document's convolution restarts: convolve document by document
            # The closed form runs once, at the row length; a document of length m needs only the
            # kernel's first m taps, whose 2m-point spectrum is one small FFT (not d*n*m work).
            kernel = torch.fft.irfft(
                kernel_spectrum(self.log_alpha, self.omega, self.amp, self.phase, T), n=2 * T)
            y = torch.empty_like(x)
            spectra = {}
            for b in range(B):
                starts = [int(s) for s in doc_starts[b] if s >= 0] + [T]
                for lo, hi in zip(starts, starts[1:]):
                    n = hi - lo
                    if n not in spectra:
                        spectra[n] = torch.fft.rfft(kernel[:, :n], n=2 * n)
                    y[b:b + 1, :, lo:hi] = fft_causal_conv(x[b:b + 1, :, lo:hi], spectra[n], n)
        return y.transpose(1, 2) + u * self.skip


class ShortConv(nn.Module):
    """Causal depthwise convolution of width k; taps never reach into an earlier document."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, d) / math.sqrt(k))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, u: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # u (B, T, d); pos (B, T) position within the document
        y = u * self.weight[0] + self.bias
        for j in range(1, self.weight.shape[0]):
            shifted = F.pad(u, (0, 0, j, 0))[:, : u.shape[1]]  # u[t - j], zeros before 0
            y = y + shifted * self.weight[j] * (pos >= j)[..., None]
        return y


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
        y = self.long(self.short(u, pos), doc_starts)
        x = x + self.out(y * F.silu(gate))
        return x + self.fc_out(F.gelu(self.fc_in(self.ln2(x))))


class Resonance(StackedLM):
    PARAM_ROLES = (  # each parameter's optimizer role (archs.layers.OPTIMIZER_ROLES), by name
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

    def flops_per_token(self, seq: int) -> float:
        """Nominal training FLOPs per token: 6N for the weights, plus per layer the FFT
        convolution: three real FFTs of length 2*seq (~2.5 N log2 N flops each) per channel,
        x3 for forward and backward. Kernel generation is per step, not per token: left out."""
        fft = 3 * 2.5 * 2 * math.log2(2 * seq) * self.cfg.d_model
        return 6 * self.num_params() + 3 * self.cfg.n_layers * fft


PRESETS = {
    "resonance-tiny": dict(vocab_size=512, d_model=64, n_layers=2, num_frequencies=16,
                           max_seq=256),
    "resonance-small": dict(d_model=768, n_layers=6, num_frequencies=64),
    "resonance-medium": dict(d_model=1024, n_layers=12, num_frequencies=128),
    "resonance-large": dict(d_model=2048, n_layers=16, num_frequencies=256),
    "resonance-xlarge": dict(d_model=4096, n_layers=24, num_frequencies=512),
}
