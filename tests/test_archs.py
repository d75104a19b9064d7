"""The model zoo on CPU with tiny presets: causality, document masking, honest sizes, learning."""

from pathlib import Path

import pytest
import torch

from longpack import archs
from longpack.archs.layers import attention, chunked_cross_entropy, positions, segment_ids

FAMILY_TINY = ["neox-tiny", "resonance-tiny", "moe-tiny", "mamba-tiny", "hybrid-tiny"]


def neox_params(V, d, L, f):
    """Written from the GPT-NeoX layout, independently of the model code."""
    per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d
    return L * per_layer + 2 * V * d + 2 * d


def resonance_params(V, d, L, n, f, k=3):
    per_layer = (2 * d) + (d * 2 * d + 2 * d) + (k * d + d) + (4 * d * n + d) + (d * d + d) \
        + (2 * d) + (d * f + f) + (f * d + d)
    return L * per_layer + 2 * V * d + 2 * d


@pytest.mark.parametrize("name", FAMILY_TINY)
def test_changing_future_tokens_never_changes_past_logits(name):
    torch.manual_seed(0)
    model = archs.build(name).eval()
    x = torch.randint(0, model.cfg.vocab_size, (2, 48))
    y = x.clone()
    y[:, 30:] = torch.randint(0, model.cfg.vocab_size, (2, 18))
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :30], b[:, :30], atol=1e-5)
    assert not torch.allclose(a[:, 30:], b[:, 30:])


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", FAMILY_TINY)
def test_a_packed_row_equals_each_document_on_its_own(name, mode):
    """Each model with its default settings (MoE's other settings: tests/test_moe.py)."""
    torch.manual_seed(0)
    model = archs.build(name).train(mode == "train")
    lengths = [7, 20, 1, 12]
    docs = [torch.randint(0, model.cfg.vocab_size, (n,)) for n in lengths]
    row = torch.cat(docs)[None]
    starts = torch.tensor([[0, 7, 27, 28, -1]])  # padded with -1
    with torch.no_grad():
        packed = model(row, doc_starts=starts)[0]
        alone = torch.cat([model(d[None])[0] for d in docs])
    assert torch.allclose(packed, alone, atol=1e-5)


def test_segments_and_positions_restart_at_each_document():
    starts = torch.tensor([[0, 3, 5, -1], [0, -1, -1, -1]])
    assert segment_ids(starts, 7).tolist() == [[0, 0, 0, 1, 1, 2, 2], [0] * 7]
    assert positions(starts, 2, 7, starts.device).tolist() == [[0, 1, 2, 0, 1, 0, 1],
                                                               list(range(7))]


def test_cpu_document_attention_matches_a_dense_mask():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    starts = torch.tensor([[0, 5, 9, -1], [0, 15, -1, -1]])
    seg = segment_ids(starts, 16)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    mask = causal & (seg[:, :, None] == seg[:, None, :])
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
    assert torch.allclose(attention(q, k, v, starts), dense, atol=1e-6)


def test_chunked_loss_equals_the_full_loss_and_ignores_minus_100():
    torch.manual_seed(0)
    h = torch.randn(2, 10, 8, requires_grad=True)
    w = torch.randn(30, 8, requires_grad=True)
    t = torch.randint(0, 30, (2, 10))
    t[0, 3] = -100
    full = torch.nn.functional.cross_entropy((h @ w.t()).reshape(-1, 30), t.reshape(-1))
    g_full = torch.autograd.grad(full, (h, w))
    for budget in (0, 20 * 30 * 4):  # chunked (past the budget), kept whole (just within it)
        chunked = chunked_cross_entropy(h, w, t, chunk=3, budget=budget)
        assert torch.allclose(full, chunked, atol=1e-6)
        g_chunk = torch.autograd.grad(chunked, (h, w))
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_full, g_chunk))


def test_logits_are_recomputed_only_past_the_budget():
    """Within the budget the head matmul runs once forward and twice backward; past it each
    chunk's logits are recomputed in backward (a checkpoint): once more."""
    h = torch.randn(1, 64, 8, requires_grad=True)
    w = torch.randn(50, 8, requires_grad=True)
    t = torch.randint(0, 50, (1, 64))
    logits_bytes = 64 * 50 * 4
    for budget, head_matmuls in ((logits_bytes, 3), (logits_bytes - 1, 4)):
        with torch.profiler.profile() as prof:
            chunked_cross_entropy(h, w, t, chunk=64, budget=budget).backward()
        assert sum(e.count for e in prof.key_averages() if e.key == "aten::mm") == head_matmuls


def test_the_loss_backward_allocates_no_second_logits_sized_tensor():
    """The gradient of the logits is made in place from the kept log-probabilities, so backward
    allocates less than one (N, V) fp32 tensor (F.cross_entropy's made two: a zero-filled one
    for nll_loss and log_softmax's gradient), and its gradients are still F.cross_entropy's."""
    torch.manual_seed(0)
    N, V, d = 256, 1000, 8
    h = torch.randn(N, d, requires_grad=True)
    w = torch.randn(V, d, requires_grad=True)
    t = torch.randint(0, V, (N,))
    t[::7] = -100
    loss = chunked_cross_entropy(h, w, t)
    with torch.profiler.profile(profile_memory=True) as prof:
        loss.backward()
    allocated = sum(max(e.self_cpu_memory_usage, 0) for e in prof.events())
    assert allocated < N * V * 4
    g = [h.grad, w.grad]
    h.grad = w.grad = None
    torch.nn.functional.cross_entropy(h @ w.t(), t).backward()
    assert torch.allclose(g[0], h.grad, atol=1e-6) and torch.allclose(g[1], w.grad, atol=1e-6)


def test_the_loss_refuses_a_second_backward_and_bad_targets():
    # on the CPU whatever the default device: a bad target is a device-side assert on a GPU,
    # which ends the process's CUDA context rather than raising here
    h = torch.randn(4, 8, requires_grad=True, device="cpu")
    w = torch.randn(10, 8, requires_grad=True, device="cpu")
    loss = chunked_cross_entropy(h, w, torch.tensor([1, 2, -100, 3], device="cpu"))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()
    for bad in (-5, 10):  # neither ignored (-100) nor in the vocabulary: an error, not a zero
        with pytest.raises((RuntimeError, IndexError)):
            chunked_cross_entropy(h, w, torch.tensor([1, bad, 0, 3], device="cpu"))


def test_bf16_loss_matches_the_plain_head_under_autocast():
    torch.manual_seed(0)
    h = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(40, 16, requires_grad=True)
    t = torch.randint(0, 40, (64,))
    grads = []
    for fused in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (chunked_cross_entropy(h, w, t) if fused else
                    torch.nn.functional.cross_entropy((h @ w.t()).float(), t))
        loss.backward()
        grads.append((loss.detach(), h.grad, w.grad))
        h.grad = w.grad = None
    assert grads[0][1].dtype == torch.float32
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=2e-2, atol=2e-2)


def test_rotary_rotates_each_feature_pair_and_leaves_the_rest():
    """(x_i, x_{i+dim/2}) turns by pos * base^(-2i/dim); features past dim are unchanged; q and
    k stacked on a leading axis rotate as each would alone."""
    from longpack.archs.layers import Rotary

    torch.manual_seed(0)
    B, H, T, D, dim = 2, 3, 5, 12, 8
    rotary = Rotary(dim)
    x = torch.randn(2, B, H, T, D)
    pos = torch.tensor([[0, 1, 2, 0, 1], [3, 4, 5, 6, 7]])
    out = rotary(x, pos)
    theta = pos[:, None, :, None] * 10000.0 ** (-torch.arange(0, dim, 2) / dim)  # (B,1,T,4)
    a, b = x[..., :4], x[..., 4:8]
    expected = torch.cat([a * theta.cos() - b * theta.sin(), b * theta.cos() + a * theta.sin(),
                          x[..., 8:]], -1)
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(rotary(x[1], pos), expected[1], atol=1e-6)


def test_neox_attention_makes_its_rotary_tables_once_per_layer():
    """q and k rotate together: one sin per layer (two before), and no pass per feature half."""
    model = archs.build("neox-tiny")
    x = torch.randint(0, 512, (1, 16))
    with torch.profiler.profile() as prof:
        model(x)
    sins = sum(e.count for e in prof.key_averages() if e.key == "aten::sin")
    assert sins == model.cfg.n_layers


@pytest.mark.parametrize("name", list(archs.gpt_neox.PRESETS))
def test_neox_parameter_counts_match_the_formula_on_the_meta_device(name):
    model = archs.build(name, device="meta")
    c = model.cfg
    assert next(model.parameters()).is_meta
    assert model.num_params() == neox_params(c.vocab_size, c.d_model, c.n_layers, c.d_ff)


@pytest.mark.parametrize("name", list(archs.resonance.PRESETS))
def test_resonance_parameter_counts_match_the_formula_on_the_meta_device(name):
    model = archs.build(name, device="meta")
    c = model.cfg
    assert model.num_params() == resonance_params(c.vocab_size, c.d_model, c.n_layers,
                                                  c.num_frequencies, c.ff)


def test_resonance_kernel_spectrum_is_the_fft_of_the_damped_sinusoids():
    from longpack.archs.resonance import kernel_spectrum

    torch.manual_seed(0)
    d, n, L = 4, 6, 33
    log_alpha, omega = torch.randn(d, n) - 2, torch.rand(d, n) * 3
    amp, phase = torch.randn(d, n), torch.rand(d, n) * 6
    t = torch.arange(L, dtype=torch.float64)
    kernel = (amp[..., None].double() * torch.exp(-log_alpha.double().exp()[..., None] * t)
              * torch.cos(omega[..., None].double() * t + phase[..., None].double())).sum(1)
    expected = torch.fft.rfft(kernel, n=2 * L)
    got = kernel_spectrum(log_alpha, omega, amp, phase, L)
    assert torch.allclose(got.to(torch.complex128), expected, atol=1e-4)


def test_resonance_long_convolution_is_linear_not_circular():
    from longpack.archs.resonance import fft_causal_conv, kernel_spectrum

    torch.manual_seed(0)
    d, n, L = 2, 4, 16
    params = (torch.randn(d, n) - 1, torch.rand(d, n), torch.randn(d, n), torch.rand(d, n))
    spec = kernel_spectrum(*params, L)
    x = torch.zeros(1, d, L)
    x[..., -1] = 1.0  # an impulse at the last step must not wrap around to the start
    assert fft_causal_conv(x, spec, L)[..., :-1].abs().max() < 1e-5


def mod_model():
    from longpack.archs.moe import DepthRouted

    torch.manual_seed(0)
    model = archs.build("moe-tiny", mod_capacity=0.25, n_layers=2, vocab_size=256)
    routed = model.blocks[1]
    assert isinstance(routed, DepthRouted)
    return model, routed


def test_mixture_of_depths_routes_its_share_of_each_sequence():
    _, routed = mod_model()
    x = torch.randn(3, 32, 64)
    pos = torch.arange(32).expand(3, 32)
    out, stats = routed(x, pos, None)
    changed = (out != x).any(-1)
    assert changed.sum(1).tolist() == [8, 8, 8]  # exactly a quarter of each sequence


@pytest.mark.slow  # 120 training steps
def test_mixture_of_depths_trains_its_share_and_its_predictor():
    model, _ = mod_model()
    data = real_text_bytes()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    bce = []
    for _ in range(120):
        i = torch.randint(0, len(data) - 65, (8,))
        xb = torch.stack([data[j:j + 64] for j in i])
        yb = torch.stack([data[j + 1:j + 65] for j in i])
        out = model.loss(xb, yb)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        bce.append(out["mod_predictor"].item())
    assert sum(bce[-10:]) / 10 < 0.8 * sum(bce[:10]) / 10  # it learns what the top-k picks


@pytest.mark.slow
def test_flex_attention_path_matches_the_cpu_path():
    """The CUDA path (FlexAttention) runs forward on CPU too: check its document mask here."""
    import warnings

    from longpack.archs.layers import _flex_document_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 16) for _ in range(3))
    starts = torch.tensor([[0, 50, 90, -1], [0, 127, -1, -1]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex = _flex_document_attention(q, k, v, starts, False)
    assert torch.allclose(flex, attention(q, k, v, starts), atol=1e-5)


@pytest.mark.slow
def test_compiled_flex_makes_the_block_mask_outside_the_graph_without_gradients():
    """Without gradients the block mask is made eagerly (Inductor's fused mask-and-flex kernel
    crashed on a GPU there); with gradients it stays in the one graph that trains fast. Seen
    here by what dynamo hands the backend: the mask's sort is in a graph or it is not."""
    import warnings

    from longpack.archs.layers import _flex_document_attention

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    q = torch.randn(2, 4, 128, 16)  # no gradient of q: Flex has no backward on a CPU
    starts = torch.tensor([[0, 50, 90, -1], [0, 127, -1, -1]])
    fn = torch.compile(lambda q, s: _flex_document_attention(q, q, q, s, False), backend=keep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            out = fn(q, starts)
        inference = list(graphs)
        graphs.clear()
        fn(q, starts)  # grad mode on
    assert inference and not any("sort" in g for g in inference)
    assert any("sort" in g for g in graphs)
    assert torch.allclose(out, attention(q, q, q, starts), atol=1e-5)


@pytest.mark.parametrize("name", FAMILY_TINY)
def test_bf16_autocast_forward_and_backward(name):
    torch.manual_seed(0)
    model = archs.build(name)
    x = torch.randint(0, 512, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.loss(x, torch.roll(x, -1, 1), torch.tensor([[0, 9, -1], [0, -1, -1]]))
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and all(
        p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_build_puts_the_model_on_torchs_default_device():
    torch.set_default_device("meta")
    try:
        model = archs.build("neox-tiny")
    finally:
        torch.set_default_device(None)
    assert all(p.is_meta for p in model.parameters())
    assert all(not p.is_meta for p in archs.build("neox-tiny").parameters())


def test_neox_1_2b_is_1_414_billion_parameters():
    assert archs.build("neox-1.2b", device="meta").num_params() == 1_414_455_296


@pytest.mark.slow
def test_registry_lists_presets_and_names_the_choices():
    names = [m["name"] for m in archs.list_models()]
    assert "neox-tiny" in names and "neox-1.2b" in names
    with pytest.raises(KeyError, match="unknown model 'nope'.*gpt-neox"):
        archs.build("nope")
    assert archs.build("gpt-neox", device="meta", n_layers=2).cfg.n_layers == 2


def real_text_bytes() -> torch.Tensor:
    """Real English text: this repository's own documentation, as bytes."""
    root = Path(__file__).resolve().parents[1]
    text = "".join((root / p).read_text() for p in ("README.md", "docs/FORMAT.md"))
    return torch.tensor(list(text.encode()), dtype=torch.long)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY_TINY)
def test_loss_falls_clearly_on_real_text(name):
    torch.manual_seed(0)
    data = real_text_bytes()
    model = archs.build(name, vocab_size=256)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    seq, batch = 64, 16
    losses = []
    for _ in range(200):
        i = torch.randint(0, len(data) - seq - 1, (batch,))
        x = torch.stack([data[j:j + seq] for j in i])
        y = torch.stack([data[j + 1:j + seq + 1] for j in i])
        loss = model.loss(x, y)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    last = sum(losses[-10:]) / 10
    assert losses[0] > 5.0  # ~ln(256): uniform over bytes at initialization
    assert last < 0.5 * losses[0], (losses[0], last)


@pytest.mark.slow
def test_presets_json_is_what_python_m_archs_prints():
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "longpack.archs", "--json"], capture_output=True,
                         text=True, check=True).stdout
    table = Path(archs.__file__).with_name("presets.json").read_text()
    assert json.loads(out) == json.loads(table), (
        "re-run: python -m longpack.archs --json > archs/presets.json")


@pytest.mark.slow
def test_train_list_models_prints_the_presets():
    from click.testing import CliRunner

    from longpack.training.cli import train

    r = CliRunner().invoke(train, ["--list-models"])
    assert r.exit_code == 0 and "neox-1.2b" in r.output and "1,414,455,296" in r.output


@pytest.mark.parametrize("name", ["neox-tiny", "resonance-tiny", "moe-tiny", "mamba-tiny",
                                  "hybrid-tiny"])
@pytest.mark.slow  # graph capture takes 2-4 s a family
def test_models_run_under_torch_compile(name):
    import warnings

    torch.manual_seed(0)
    model = archs.build(name).eval()
    x = torch.randint(0, 512, (2, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(model, backend="aot_eager")  # graph capture, no C++ build
        with torch.no_grad():
            assert torch.allclose(compiled(x), model(x), atol=1e-5)


@pytest.mark.parametrize("name", FAMILY_TINY)
def test_activation_checkpointing_changes_nothing_but_memory(name):
    x = torch.randint(0, 512, (2, 24))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = archs.build(name, checkpointing=checkpointing)
        model.loss(x, torch.roll(x, -1, 1))["loss"].backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
