"""FLOPs per token, measured (archs/flops.py), held against the formulas each family wrote by hand
before: every difference is named and computed here, and the rest agrees to rounding.

The formulas (`todays`) counted 6 per parameter per token, attention over the whole row
(PaLM's 12 x layers x d x seq), Mamba's scan at 3x its forward FLOPs and resonance's FFTs at
9 transforms a layer. The measurement counts what runs, so it differs by:
- 6 x each parameter that no matmul uses (the embedding lookup, norms, biases, Mamba's and
  resonance's kernel parameters), every family: `unmultiplied`;
- Mamba's scan over the row padded to whole chunks (the formula counted the row): `padding`;
- resonance's FFTs as autograd runs them (3 real transforms forward; backward the irfft's an
  rfft, each rfft's a complex transform) and its kernel's matmul, per step: `resonance_extra`;
- MoE's multi-token heads each run the shared unembedding (the formula counted it once):
  `extra_heads`;
- Mixture-of-Depths: only the routed share of the tokens goes through a routed block, and its
  predictor's input gets no gradient (the formula sent every token through).
"""

import math
from dataclasses import dataclass

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from longpack import archs
from longpack.archs import flops
from longpack.archs.gpt_neox import GPTNeoX
from longpack.archs.mamba import Mamba, MambaMixer
from longpack.archs.moe import MoE
from longpack.archs.moe_experts import Experts
from longpack.archs.resonance import Resonance

# ---- the formulas before the measurement, as each family's flops_per_token wrote them ----

def todays_scan_flops(mixer: MambaMixer, seq: int) -> float:
    Q = min(mixer.chunk, seq)
    return 2 * Q * mixer.d_state * mixer.groups + mixer.heads * (
        2 * Q * mixer.head_dim + 4 * mixer.head_dim * mixer.d_state)


def mamba_mixers(model) -> list[MambaMixer]:
    return [m for m in model.modules() if isinstance(m, MambaMixer)]


def todays(model, seq: int) -> float:
    c = model.cfg
    if isinstance(model, GPTNeoX):
        return 6 * model.num_params() + 12 * c.n_layers * c.d_model * seq
    if isinstance(model, Mamba):
        return 6 * model.num_params() + 3 * sum(todays_scan_flops(b.mixer, seq)
                                                for b in model.blocks)
    if isinstance(model, Resonance):
        fft = 3 * 2.5 * 2 * math.log2(2 * seq) * c.d_model
        return 6 * model.num_params() + 3 * c.n_layers * fft
    assert isinstance(model, MoE)
    scan = sum(todays_scan_flops(m, seq) for m in mamba_mixers(model))
    return (6 * model.active_params() + 12 * c.mixers.count("A") * c.d_model * seq
            + 3 * scan)


# ---- the differences, each counted from the model's modules ----

def matmul_weights(model) -> int:
    """Parameters a token's matmuls use: every Linear's weight (a tied head once) and the
    top_k experts' three matrices."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    experts = sum(e.cfg.top_k * (e.w_gate[0].numel() + e.w_up[0].numel() + e.w_down[0].numel())
                  for e in model.modules() if isinstance(e, Experts))
    return linear + experts


def unmultiplied(model) -> float:
    counted = model.active_params() if hasattr(model, "active_params") else model.num_params()
    return 6 * (counted - matmul_weights(model))


def padding(model, seq: int) -> float:
    """The scan's FLOPs on the padding of the row to whole chunks, per token."""
    return sum(3 * todays_scan_flops(m, seq) * (-seq % m.chunk) / seq
               for m in mamba_mixers(model))


def resonance_extra(model, seq: int) -> float:
    if not isinstance(model, Resonance):
        return 0.0
    c = model.cfg
    N = 2 * seq  # the transforms' length: zero-padded to 2L for a linear convolution
    ffts = (4 * 2.5 + 2 * 5) * N * math.log2(N) * c.d_model  # a layer's step: 4 real, 2 complex
    S = math.isqrt(seq - 1) + 1  # the kernel's grid: rows x S, each channel's (rows, 2n) @ (2n, S)
    kernel = 3 * 2 * (-(-seq // S)) * S * 2 * c.num_frequencies * c.d_model
    todays_ffts = 3 * 3 * 2.5 * 2 * math.log2(2 * seq) * c.d_model  # per token
    return c.n_layers * ((ffts + kernel) / seq - todays_ffts)


def extra_heads(model) -> float:
    c = model.cfg
    return 6 * c.d_model * c.vocab_size * (getattr(c, "n_pred_tokens", 1) - 1)


def expected(model, seq: int) -> float:
    return (todays(model, seq) - unmultiplied(model) + padding(model, seq)
            + resonance_extra(model, seq) + extra_heads(model))


CASES = [  # (preset, seq, overrides); seqs off the chunk multiple pad Mamba's rows
    ("neox-tiny", 256, {}), ("neox-tiny", 255, {}),
    ("neox-tiny", 16384, {"vocab_size": 50257}),  # logits the loss would chunk and recompute
    ("moe-tiny", 256, {}), ("moe-tiny", 100, {"n_pred_tokens": 3, "capacity_factor": 1.0}),
    ("hybrid-tiny", 256, {}), ("hybrid-tiny", 250, {}),
    ("mamba-tiny", 256, {}), ("mamba-tiny", 250, {}),
    ("resonance-tiny", 256, {}), ("resonance-tiny", 250, {}),
]


@pytest.mark.parametrize("name,seq,overrides", CASES, ids=[
    "-".join([name, str(seq), *overrides]) for name, seq, overrides in CASES])
def test_the_measurement_is_todays_formula_less_what_never_ran(name, seq, overrides):
    model = archs.build(name, device="meta", **overrides)
    assert model.flops_per_token(seq) == pytest.approx(expected(model, seq), rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["neox-1.2b", "moe-5b", "hybrid-5b", "mamba-1.3b",
                                  "resonance-large"])
def test_the_big_presets_at_the_length_a_32k_build_trains(name):
    model = archs.build(name, device="meta")
    assert model.flops_per_token(32767) == pytest.approx(expected(model, 32767), rel=1e-12)


@pytest.mark.parametrize("capacity", [0.5, 0.3])
def test_mixture_of_depths_counts_only_the_routed_share(capacity):
    model = archs.build("moe-tiny", device="meta", mod_capacity=capacity)
    c, seq = model.cfg, 255
    chosen = max(1, math.floor(capacity * seq))  # of a row of one document
    routed = [b.block for i, b in enumerate(model.blocks) if i % 2]
    assert routed and all(type(b).__name__ == "Block" for b in routed)
    skipped = sum(6 * matmul_weights(b) * (seq - chosen) / seq  # the tokens that skip it
                  + 12 * c.d_model * (seq * seq - chosen * chosen) / seq  # its attention
                  + 2 * c.d_model  # the predictor reads a detached input: no input gradient
                  for b in routed)
    got = model.flops_per_token(seq)
    assert got == pytest.approx(expected(model, seq) - skipped, rel=1e-12)


def test_ffts_are_counted_as_fftw_counts_them():
    x = torch.empty(3, 8, device="meta")
    with FlopCounterMode(display=False, custom_mapping=flops.FFT_FLOPS) as counter:
        spectrum = torch.fft.rfft(x)  # 3 real transforms of 8
        torch.fft.irfft(spectrum, n=8)  # 3 more, from the one-sided half
        torch.fft.fft(spectrum.new_empty(3, 8))  # 3 complex ones
    got = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    real = 3 * 2.5 * 8 * math.log2(8)
    assert got == {"aten._fft_r2c": real, "aten._fft_c2r": real, "aten._fft_c2c": 2 * real}


def test_recomputation_is_not_counted():
    # a training step with activation checkpointing runs each block's forward twice; the
    # second, in backward, is not the model's FLOPs
    plain = flops._model(GPTNeoX, archs.config("neox-tiny"))
    again = flops._model(GPTNeoX, archs.config("neox-tiny", checkpointing=True))
    assert again.training and again.cfg.checkpointing
    with FlopCounterMode(display=False) as all_of_it:
        again.loss(*[torch.zeros(1, 64, dtype=torch.long, device="meta")] * 2)["loss"].backward()
    assert flops._step(again, 64) == flops._step(plain, 64) < all_of_it.get_total_flops()


@pytest.mark.slow
@pytest.mark.parametrize("name,seq", [("mamba-tiny", 4096), ("mamba-tiny", 4100),
                                      ("hybrid-tiny", 4099)])
def test_long_rows_of_a_chunked_scan_are_fitted_exactly(name, seq):
    # from 256 chunks on, rows are fitted from four short ones: the row itself agrees
    model = archs.build(name, device="meta")
    assert flops._rows(model, seq) != [seq]
    direct = flops._step(flops._model(type(model), model.cfg), seq) / seq
    assert model.flops_per_token(seq) == pytest.approx(direct, rel=1e-12)


@dataclass(frozen=True)
class ToyConfig:
    vocab_size: int = 5
    n_layers: int = 1
    checkpointing: bool = False

    @property
    def repeated(self) -> dict:
        return {"n_layers": 1}


class Toy(torch.nn.Module):
    """Claims FLOPs polynomial in the row's length (period 1), and has T.bit_length()."""
    flops_seq_period = 1

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = torch.nn.Parameter(torch.empty(cfg.vocab_size, 4))

    def loss(self, input_ids, targets, doc_starts=None) -> dict:
        x = self.w.new_ones(input_ids.shape[1].bit_length(), self.cfg.vocab_size)
        return {"loss": (x @ self.w).sum()}


def test_a_cost_the_fit_does_not_hold_is_counted_at_the_row_itself():
    seq = 1000  # fitted from rows of 2..5 tokens, whose bit lengths no quadratic extends
    assert flops._rows(Toy(ToyConfig()), seq) == [2, 3, 4, 5]
    got = flops.flops_per_token(Toy(ToyConfig()), seq)
    # (bits, 5) @ (5, 4) forward, and the weight's gradient: the same again
    assert got == 2 * 2 * seq.bit_length() * 5 * 4 / seq


def test_each_model_and_length_is_measured_once():
    model = archs.build("neox-tiny", device="meta")
    before = flops._per_token.cache_info()
    first = model.flops_per_token(123)
    assert archs.build("neox-tiny", device="meta").flops_per_token(123) == first
    after = flops._per_token.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)


def test_a_row_has_at_least_one_token():
    with pytest.raises(ValueError, match="at least 1"):
        archs.build("neox-tiny", device="meta").flops_per_token(0)


def test_the_model_files_alone_carry_no_measurement(monkeypatch):
    # an exported folder ships archs' model files without archs/flops.py (zoo/hf_remote.py)
    from longpack.archs import layers

    monkeypatch.setattr(layers, "MEASURE_FLOPS", None)
    with pytest.raises(RuntimeError, match="longpack's measurement"):
        archs.build("moe-tiny", device="meta").flops_per_token(8)
