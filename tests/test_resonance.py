"""Resonance's kernel: the matmul generation equals the damped sinusoids' closed-form spectrum
(values and gradients), keeps its precision at long rows in fp32, and never materialises the
d x n x L terms the closed form did."""

import math

import pytest
import torch

from longpack import archs
from longpack.archs.resonance import kernel_spectrum


def closed_form_spectrum(log_alpha, omega, amp, phase, L: int) -> torch.Tensor:
    """The reference, in complex128: the kernel's 2L-point DFT as a geometric series truncated at
    L, K[f] = 1/2 sum_n [A G(z, f) + conj(A) G(conj(z), f)], G(z, f) = (1 - z^L (-1)^f) /
    (1 - z w^f), w = exp(-2 pi i / 2L), z = exp(-alpha + i omega), A = a exp(i phi): what
    resonance.py computed before, term by term over (d, n, L + 1)."""
    log_alpha, omega, amp, phase = (p.double() for p in (log_alpha, omega, amp, phase))
    f = torch.arange(L + 1, dtype=torch.float64)
    w = torch.polar(torch.ones_like(f), -math.pi * f / L)
    sign = 1 - 2 * (torch.arange(L + 1) % 2)
    z = torch.polar(torch.exp(-log_alpha.exp()), omega)
    A = amp * torch.polar(torch.ones_like(phase), phase)
    spec = 0
    for zz, AA in ((z, A), (z.conj(), A.conj())):
        spec = spec + (AA[..., None] * (1 - zz[..., None] ** L * sign)
                       / (1 - zz[..., None] * w)).sum(1)
    return 0.5 * spec


def kernel_params(d: int, n: int, dtype=torch.float32):
    """As LongConv initializes them: damping from 1e-4 (long memory) to 0.3, any frequency."""
    torch.manual_seed(0)
    log_alpha = torch.log(torch.logspace(-4, -0.5, n)).repeat(d, 1)
    params = (log_alpha, torch.rand(d, n) * math.pi, torch.randn(d, n) / math.sqrt(n),
              torch.rand(d, n) * 2 * math.pi)
    return [p.to(dtype).requires_grad_() for p in params]


@pytest.mark.parametrize("L", [1, 2, 37, 64, 1000])
def test_kernel_spectrum_and_its_gradients_equal_the_closed_form(L):
    """In float64 the two must agree to rounding: values and every parameter's gradient."""
    params = kernel_params(3, 5, torch.float64)
    probe = torch.randn(3, L + 1, dtype=torch.complex128)  # a random linear read-out
    got = kernel_spectrum(*params, L)
    expected = closed_form_spectrum(*params, L)
    scale = expected.abs().max().item()
    assert got.dtype == torch.complex128
    assert torch.allclose(got, expected, rtol=0, atol=1e-10 * scale)
    g_got = torch.autograd.grad((got * probe).real.sum(), params)
    g_expected = torch.autograd.grad((expected * probe).real.sum(), params)
    g_scale = max(g.abs().max().item() for g in g_expected)  # at L = 1 only a and phi matter
    for a, b in zip(g_got, g_expected):
        assert torch.allclose(a, b, rtol=0, atol=1e-9 * g_scale)


def test_fp32_kernel_keeps_its_precision_at_long_rows():
    """At 4k with fp32 parameters the spectrum is within 1e-5 of its largest value; the closed
    form evaluated in fp32 (complex64) was off by ~1e-3 at 1k, its 1 / (1 - z w^f) near-singular
    for slowly decaying z."""
    L = 4096
    params = kernel_params(16, 64)
    expected = closed_form_spectrum(*params, L)
    got = kernel_spectrum(*params, L).to(torch.complex128)
    assert (got - expected).abs().max() < 1e-5 * expected.abs().max()


def test_kernel_generation_never_materialises_d_n_L_terms():
    """The powers are (d, n, ~sqrt L) and the matmul's output (d, L): no tensor of the forward or
    backward holds d * n * L / 8 elements (the closed form held (d, n, L + 1) several times)."""
    d, n, L = 8, 64, 1024
    params = kernel_params(d, n)
    with torch.profiler.profile(record_shapes=True) as prof:
        spectrum = kernel_spectrum(*params, L)
        spectrum.abs().sum().backward()
    largest = max(math.prod(shape) for e in prof.events() for shape in e.input_shapes
                  if shape and all(isinstance(s, int) for s in shape))
    assert d * L <= largest < d * n * L / 8  # the (d, L) kernel is seen, nothing d*n*L


def test_resonance_bf16_autocast_keeps_the_kernel_in_fp32():
    """Autocast must not round the kernel's matmul to bf16 (its terms would keep ~3 digits)."""
    params = kernel_params(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = kernel_spectrum(*params, 256)
    assert got.dtype == torch.complex64
    assert torch.allclose(got, kernel_spectrum(*params, 256), rtol=0, atol=0)


def test_a_row_without_documents_equals_a_row_of_one_document():
    """Without doc_starts the short convolution skips its masks: the answer must not change."""
    torch.manual_seed(0)
    model = archs.build("resonance-tiny").eval()
    x = torch.randint(0, model.cfg.vocab_size, (2, 40))
    with torch.no_grad():
        plain = model(x)
        one_doc = model(x, doc_starts=torch.tensor([[0, -1], [0, -1]]))
    assert torch.allclose(plain, one_doc, atol=1e-5)


def per_document_long_conv(long, u: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """The long convolution as it ran before issue 57: each document of each row on its own,
    through the 2n-point FFT of its n tokens and of the kernel's first n taps."""
    from longpack.archs.resonance import fft_causal_conv, resonance_kernel

    B, T, d = u.shape
    x = u.transpose(1, 2).float()
    kernel = resonance_kernel(long.log_alpha, long.omega, long.amp, long.phase, T)
    rows = []
    for b in range(B):
        cuts = [s for s in starts[b].tolist() if s >= 0] + [T]
        rows.append(torch.cat([fft_causal_conv(x[b:b + 1, :, lo:hi],
                                               torch.fft.rfft(kernel[:, :hi - lo], n=2 * (hi - lo)),
                                               hi - lo)
                               for lo, hi in zip(cuts, cuts[1:])], -1))
    return torch.cat(rows).transpose(1, 2) + u * long.skip


def test_the_grouped_ffts_equal_one_fft_per_document_with_their_gradients():
    """Documents of 1 to 160 tokens in rows of 192 share a few FFT lengths (up to 4/3 x 2n
    long): outputs and every gradient as the per-document FFTs gave them, to fp32's rounding."""
    torch.manual_seed(0)
    long = archs.build("resonance-tiny").blocks[0].long
    starts = torch.tensor([[0, 1, 2, 5, 12, 30, 31, 96, -1], [0, 160, 191, -1, -1, -1, -1, -1, -1],
                           [0, -1, -1, -1, -1, -1, -1, -1, -1]])
    u = torch.randn(3, 192, 64, requires_grad=True)
    grad = torch.randn(3, 192, 64)
    wrt = [u, *long.parameters()]
    ours = long(u, starts)
    theirs = per_document_long_conv(long, u, starts)
    assert (ours - theirs).abs().max() < 1e-5 * theirs.abs().max()
    for a, b in zip(torch.autograd.grad(ours, wrt, grad), torch.autograd.grad(theirs, wrt, grad)):
        assert (a - b).abs().max() < 1e-5 * b.abs().max()


def test_fft_lengths_are_the_next_power_of_two_or_three_times_one():
    from longpack.archs.resonance import fft_size

    assert [fft_size(n) for n in (1, 2, 3, 4, 5, 6, 7, 13, 24, 25, 33, 4096, 4097)] == \
        [1, 2, 3, 4, 6, 6, 8, 16, 24, 32, 48, 4096, 6144]
