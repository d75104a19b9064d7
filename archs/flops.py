"""Training FLOPs per token, measured: one definition for every family.

    flops_per_token(model, seq)   FLOPs of one training step's forward and backward of a
                                  (1, seq) row, divided by seq (model.flops_per_token(seq))

The model's class is built from its config on the meta device (shapes, no memory, no arithmetic)
and `model.loss` of a (1, seq) row runs forward and backward under
torch.utils.flop_counter.FlopCounterMode, which adds each operator's FLOPs from its shapes. So a
new family, or a change to one, is counted as it runs, with no formula to keep in step.

What the count holds:
- Every matmul: 2 FLOPs per multiply-add, forward and backward, which for a weight matrix is the
  "6 per parameter per token" of the usual estimate. Parameters that multiply nothing (the
  embedding lookup, norms, biases, a tied embedding's input side) add none.
- Attention over the whole row: FlopCounterMode counts a causal attention's full T x T scores
  (SDPA's math path on meta, and its formulas for the fused and flex kernels, all ignore the
  mask), which is the nominal figure MFU is defined with (PaLM, Chowdhery et al. 2022,
  appendix B: 12 * layers * d * seq per token).
- One document per row: on meta there are no document starts to read (documents would shorten
  attention and resonance's convolutions, not the weights' FLOPs), so the row is one document,
  again the nominal figure.
- FFTs, which FlopCounterMode has no formula for: FFT_FLOPS registers the figures FFTW's
  benchmarks count (http://www.fftw.org/speed/method.html): 5 N log2 N real FLOPs for a complex
  transform of length N, 2.5 N log2 N for a real one (an rfft or an irfft).
- No recomputation: what activation checkpointing computes a second time in backward is left
  out, as MFU's definition leaves it out (PaLM, section 4.1: the theoretical throughput counts
  the forward and backward passes, "not rematerialization"). The count turns `checkpointing`
  off, measures vocabularies too small for the loss to chunk its logits (VOCABS), and
  resonance's kernel is not checkpointed on meta; any other checkpoint of plain code is told
  apart by _Recomputed (in backward only a recomputation runs with gradients enabled: the
  autograd engine runs backward formulas without them).

Cost: a step on meta costs about the same per operator whatever the sizes, so the count runs
the fewest operators that give the answer exactly. FLOPs are linear in the layers (of the
config's `repeated` period: the head comes after them, so their share is the same at any
vocabulary) and in the vocabulary (the head's matmuls), so a step is counted at one or two
periods of layers and at two tiny vocabularies and extrapolated. Rows of a Mamba scan, whose
Python loop runs once per chunk, are counted from four short rows from FIT_PERIODS chunks on
(_seq_period). Each (class, config, seq) is counted once per process: the loop asks at every
logged step, the dry-run plan at two lengths, a preset table at every preset and two
vocabularies. Timings: docs/BENCHMARKS.md.
"""

import functools
import math
from dataclasses import replace
from fractions import Fraction

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


def _fft(real_flops_per_point: float, signal_shape, dims) -> float:
    """`real_flops_per_point` * N log2 N for each transform of length N over `dims` (one
    transform over several dimensions has their product's length) of a signal of
    `signal_shape`: its elements / N transforms."""
    n = math.prod(signal_shape[d] for d in dims)
    return real_flops_per_point * math.prod(signal_shape) * math.log2(n) if n > 1 else 0.0


# FlopCounterMode formulas (they get shapes, not tensors): FFTW's counts (module docstring).
# The real signal of an rfft (r2c) is its input; of an irfft (c2r) its output (the input is the
# one-sided N/2 + 1 half); autograd's backward of either is one of the three.
def _r2c_flops(x_shape, dim, *args, out_shape=None, **kwargs) -> float:
    return _fft(2.5, x_shape, dim)


def _c2r_flops(x_shape, dim, *args, out_shape=None, **kwargs) -> float:
    return _fft(2.5, out_shape, dim)


def _c2c_flops(x_shape, dim, *args, out_shape=None, **kwargs) -> float:
    return _fft(5.0, x_shape, dim)


FFT_FLOPS = {aten._fft_r2c: _r2c_flops, aten._fft_c2r: _c2r_flops, aten._fft_c2c: _c2c_flops}


class _Recomputed(TorchDispatchMode):
    """Inside a FlopCounterMode, during backward: the FLOPs of the operators that run with
    gradients enabled, i.e. activation checkpointing's recomputation (the module docstring)."""

    def __init__(self, counter: FlopCounterMode):
        super().__init__()
        self.counter, self.flops = counter, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not torch.is_grad_enabled():
            return func(*args, **(kwargs or {}))
        before = self.counter.get_total_flops()
        out = func(*args, **(kwargs or {}))  # counted by the FlopCounterMode below this mode
        self.flops += self.counter.get_total_flops() - before
        return out


def flops_per_token(model: torch.nn.Module, seq: int) -> float:
    """Training FLOPs (forward + backward, no recomputation) per token of a (1, seq) row of
    `model`'s class and config; measured as the module docstring says."""
    if seq < 1:
        raise ValueError(f"seq must be at least 1, got {seq}")
    return _per_token(type(model), model.cfg, seq)


# The vocabularies measured: two give the FLOPs at every other (they are linear in it). Small,
# so the loss never cuts the logits into chunks recomputed in backward (layers.
# chunked_cross_entropy), which it does inside an autograd Function, whose forward runs without
# gradients, where _Recomputed would not see it; not 1, which could take other kernels.
VOCABS = (2, 3)


@functools.lru_cache(maxsize=1024)
def _per_token(cls, cfg, seq: int) -> float:
    """From steps of one or two periods of layers at VOCABS (the module docstring's Cost)."""
    period, n = cfg.repeated["n_layers"], cfg.n_layers
    small = replace(cfg, n_layers=n if n <= 3 * period else period + n % period,
                    vocab_size=VOCABS[0], checkpointing=False)  # no recomputation: spare it
    base = _measure(cls, small, seq)
    per_entry = _measure(cls, replace(small, vocab_size=VOCABS[1]), seq) - base
    total = base + (cfg.vocab_size - VOCABS[0]) * per_entry
    if n > small.n_layers:  # the layers add the same at any vocabulary: the head is after them
        more = replace(small, n_layers=small.n_layers + period)
        total += (n - small.n_layers) // period * (_measure(cls, more, seq) - base)
    return total / seq


@functools.lru_cache(maxsize=1024)
def _measure(cls, cfg, seq: int) -> float:
    """FLOPs of one training step of a (1, seq) row of a model of `cfg`, less recomputation:
    counted at seq, or fitted exactly from short rows (the module docstring)."""
    model = _model(cls, cfg)
    rows = _rows(model, seq)
    counts = [_step(model, n) for n in rows]
    if rows == [seq]:
        return counts[0]
    if _quadratic(rows[:3], counts[:3], rows[3]) != counts[3]:
        return _step(model, seq)  # no polynomial after all: count the row itself
    return float(_quadratic(rows[:3], counts[:3], seq))


# A row of at least FIT_PERIODS periods (_seq_period) is fitted from rows of FIT_FROM ..
# FIT_FROM + 3 periods plus the row's length modulo the period (three fit a quadratic, the
# fourth checks it). Not from one period: there a chunked scan has a single chunk, and matmul
# folds a size-1 batch dimension into other kernels than it runs at the long length.
FIT_PERIODS = 256
FIT_FROM = 2


def _rows(model: torch.nn.Module, seq: int) -> list[int]:
    """The lengths of the rows a step on a (1, seq) row is counted from: [seq], or the fit's."""
    period = _seq_period(model)
    if period is None or seq < FIT_PERIODS * period:
        return [seq]
    return [seq % period + j * period for j in range(FIT_FROM, FIT_FROM + 4)]


def _seq_period(model: torch.nn.Module) -> int | None:
    """P where the step's cost on meta grows with the row's length (a Python loop over its
    chunks) and its FLOPs are a polynomial of degree <= 2 in the length T over each residue
    of T mod P, from T = 2P on; else None. A module says so in its `flops_seq_period`: Mamba's
    chunked scan its chunk (its rows are padded to whole chunks: matmuls linear in the padded
    length, attention quadratic in T), an FFT or a share of the tokens None (no polynomial).
    Other models are counted at the length itself, at a cost that hardly depends on it."""
    periods = [m.flops_seq_period for m in model.modules() if hasattr(m, "flops_seq_period")]
    return math.lcm(*periods) if periods and None not in periods else None


def _model(cls, cfg) -> torch.nn.Module:
    """A model of `cfg` on the meta device."""
    from longpack.archs import _MetaInitSkipped  # archs/__init__ imports the families, which import this

    with torch.device("meta"), _MetaInitSkipped():
        return cls(cfg)


def _quadratic(xs: list[int], ys: list[float], x: int) -> Fraction:
    """The value at x of the polynomial of degree <= 2 through (xs, ys): Lagrange's form, in
    exact rationals (FLOP counts are whole numbers here, and must extrapolate exactly)."""
    total = Fraction(0)
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        term = Fraction(yi)
        for j, xj in enumerate(xs):
            if j != i:
                term *= Fraction(x - xj, xi - xj)
        total += term
    return total


def _step(model: torch.nn.Module, seq: int) -> float:
    """FLOPs of model.loss's forward and backward on a (1, seq) row, less recomputation."""
    tokens = torch.zeros(1, seq, dtype=torch.long, device="meta")
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False, custom_mapping=FFT_FLOPS) as counter:
        loss = model.loss(tokens, tokens)["loss"]
        with _Recomputed(counter) as recomputed:
            loss.backward()
    return counter.get_total_flops() - recomputed.flops
