"""MoE routing on CPU: dropless experts, capacity per document, grouped GEMM, Mixture-of-Depths
per document, balance and z losses, multi-token heads, honest sizes."""

import math

import pytest
import torch
import torch.nn.functional as F

from longpack import archs
from longpack.archs.moe import MoEConfig, mtp_targets, top_share_per_document
from longpack.archs.moe_experts import Experts, grouped_swiglu

STARTS = torch.tensor([[0, 5, 17, -1], [0, 11, -1, -1]])  # documents of two 24-token rows


def moe_params(c):
    d, hd = c.d_model, c.d_model // c.n_heads
    attention = 2 * d * d + 2 * c.n_kv_heads * hd * d
    inner = c.ssm_expand * d  # a hybrid's Mamba layer, from Mamba-2's layout
    heads, conv = inner // c.ssm_head_dim, inner + 2 * c.ssm_groups * c.ssm_state
    mamba = (d * (inner + conv + heads) + (c.ssm_conv + 1) * conv + 3 * heads + inner
             + inner * d)
    per_layer = 2 * d + d * c.n_experts + 3 * c.n_experts * d * c.d_expert
    mixers = sum(attention if m == "A" else mamba for m in c.mixers)
    return (c.n_layers * per_layer + mixers + 2 * c.vocab_size * d + d
            + (c.n_pred_tokens - 1) * d * d)


@pytest.mark.parametrize("name", list(archs.moe.PRESETS))
def test_moe_total_and_active_parameters(name):
    model = archs.build(name, device="meta")
    c = model.cfg
    assert model.num_params() == moe_params(c)
    unused = c.n_layers * (c.n_experts - c.top_k) * 3 * c.d_model * c.d_expert
    assert model.active_params() == moe_params(c) - unused


def test_moe_presets_have_the_stated_total_sizes():
    for name, size in (("moe-500m", 0.5e9), ("moe-1b", 1e9), ("moe-1.5b", 1.5e9),
                       ("moe-5b", 5e9)):
        assert abs(archs.build(name, device="meta").num_params() / size - 1) < 0.02


def tiny_experts(**overrides) -> Experts:
    cfg = MoEConfig(d_model=16, n_heads=2, n_kv_heads=1, n_experts=4, top_k=2, d_expert=8,
                    **overrides)
    torch.manual_seed(0)
    experts = Experts(cfg)
    for w in (experts.w_gate, experts.w_up, experts.w_down):
        torch.nn.init.normal_(w, std=0.1)
    with torch.no_grad():  # inputs of positive mean (crowded_inputs) all prefer expert 0
        experts.router.weight[0] += 0.5
    return experts


def crowded_inputs(*shape) -> torch.Tensor:
    return torch.randn(*shape) + 1.0


def token_by_token(experts: Experts, x: torch.Tensor, doc_starts=None):
    """The reference, written loop by loop: each token's top-k experts, their probabilities
    renormalised; with a capacity factor, each document's choices counted per expert in token
    order (a token's first choice before its second) and those past the capacity dropped."""
    cfg = experts.cfg
    B, T, _ = x.shape
    top_p, top_e = experts.router(x).float().softmax(-1).topk(cfg.top_k, dim=-1)
    out, dropped = torch.zeros_like(x), 0
    for b in range(B):
        starts = [0] if doc_starts is None else [int(s) for s in doc_starts[b] if s >= 0]
        for lo, hi in zip(starts, starts[1:] + [T]):
            capacity = math.inf if cfg.capacity_factor is None else math.ceil(
                cfg.capacity_factor * cfg.top_k * (hi - lo) / cfg.n_experts)
            used = [0] * cfg.n_experts
            for t in range(lo, hi):
                for j in range(cfg.top_k):
                    e = int(top_e[b, t, j])
                    if used[e] >= capacity:
                        dropped += 1
                        continue
                    used[e] += 1
                    h = x[b, t] @ experts.w_gate[e], x[b, t] @ experts.w_up[e]
                    y = (F.silu(h[0]) * h[1]) @ experts.w_down[e]
                    out[b, t] += y * top_p[b, t, j] / top_p[b, t].sum()
    return out, dropped / (B * T * cfg.top_k)


@pytest.mark.parametrize("capacity_factor", [None, 1.0, 1.25])
@pytest.mark.parametrize("doc_starts", [None, STARTS], ids=["rows", "documents"])
def test_routing_matches_a_token_by_token_reference(capacity_factor, doc_starts):
    experts = tiny_experts(capacity_factor=capacity_factor)
    x = crowded_inputs(2, 24, 16)
    with torch.no_grad():
        y, stats = experts(x, doc_starts)
        expected, dropped = token_by_token(experts, x, doc_starts)
    if capacity_factor is None:
        assert dropped == 0 and stats["dropped"] == 0
    else:
        assert dropped > 0, "the test should exercise the capacity limit"
        assert stats["dropped"].item() == pytest.approx(dropped)
    assert torch.allclose(y, expected, atol=1e-5)


def test_dropless_expert_output_of_a_token_ignores_every_other_token():
    experts = tiny_experts()
    x = torch.randn(3, 20, 16)
    perm = torch.randperm(60)  # tokens shuffled across positions and rows
    with torch.no_grad():
        y = experts(x)[0].reshape(60, 16)
        shuffled = experts(x.reshape(60, 16)[perm].reshape(3, 20, 16))[0].reshape(60, 16)
    assert torch.allclose(shuffled, y[perm], atol=1e-6)


def test_grouped_gemm_path_matches_the_expert_loop_with_its_gradients():
    """bf16 takes F.grouped_mm (each expert's rows padded to 8); expert 1 gets no token."""
    torch.manual_seed(0)
    expert = torch.tensor([0] * 5 + [2] * 9 + [3] * 7)
    counts = torch.tensor([5, 0, 9, 7])
    h = torch.randn(21, 16).bfloat16().requires_grad_()
    weights = [(torch.randn(4, *s) * 0.3).bfloat16().requires_grad_()
               for s in ((16, 8), (16, 8), (8, 16))]
    grouped = grouped_swiglu(h, expert, counts, *weights)
    loop = torch.cat([F.silu(h[i:i + 1] @ weights[0][e]) * (h[i:i + 1] @ weights[1][e])
                      @ weights[2][e] for i, e in enumerate(expert.tolist())])
    assert grouped.dtype == torch.bfloat16
    assert torch.allclose(grouped.float(), loop.float(), atol=2e-2, rtol=2e-2)
    g = torch.randn_like(loop)
    ours = torch.autograd.grad(grouped, [h, *weights], g)
    theirs = torch.autograd.grad(loop, [h, *weights], g)
    for a, b in zip(ours, theirs):
        assert torch.isfinite(a).all()
        assert torch.allclose(a.float(), b.float(), atol=5e-2, rtol=5e-2)


def test_experts_under_bf16_autocast_match_fp32():
    experts = tiny_experts(capacity_factor=1.0)
    x = crowded_inputs(2, 24, 16)
    with torch.no_grad():
        y32, s32 = experts(x, STARTS)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y16, s16 = experts(x, STARTS)
    assert y16.dtype == torch.bfloat16 and s16["dropped"] == s32["dropped"]
    assert torch.allclose(y16.float(), y32, atol=3e-2, rtol=3e-2)


def test_load_balance_loss_is_minimal_for_uniform_routing():
    experts = tiny_experts()
    x = torch.randn(2, 24, 16)
    with torch.no_grad():
        experts.router.weight.zero_()
        _, uniform = experts(x)
        experts.router.weight[0, 0] = 20.0
        _, skewed = experts(x.abs())  # expert 0 first for every token
    assert uniform["balance"].item() == pytest.approx(1.0, abs=1e-6)
    assert skewed["balance"] > 1.05
    assert uniform["z"].item() == pytest.approx(torch.log(torch.tensor(4.0)).item() ** 2, rel=1e-5)


def test_balance_and_z_losses_train_the_router():
    """They are the router's only signal here: one step on them alone must change it."""
    model = archs.build("moe-tiny")
    x = torch.randint(0, 512, (2, 32))
    out = model.loss(x, torch.roll(x, -1, 1), torch.tensor([[0, 9, -1], [0, -1, -1]]))
    out["aux"].backward()
    router = model.blocks[0].experts.router.weight
    assert router.grad is not None and router.grad.abs().sum() > 0


def test_the_documents_top_share_is_chosen_within_each_document():
    # Row 0: documents of 5 and 3 tokens; row 1 one document of 8. Share 0.5: 2, 1 and 4 picks.
    score = torch.tensor([[0.1, 0.9, 0.3, 0.8, 0.2, 5.0, 4.0, 3.0],
                          [8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0]])
    starts = torch.tensor([[0, 5], [0, -1]])
    from longpack.archs.layers import positions
    from longpack.archs.moe_experts import document_ids

    doc = document_ids(starts, 2, 8, score.device)
    chosen = top_share_per_document(score, doc, positions(starts, 2, 8, score.device), 0.5)
    assert chosen.int().tolist() == [[0, 1, 0, 1, 0, 1, 0, 0], [1, 0, 1, 0, 1, 0, 1, 0]]


MOE_SETTINGS = {
    "dropless": {},
    "capacity-1.0": {"capacity_factor": 1.0},
    "capacity-1.25": {"capacity_factor": 1.25},
    "mod": {"mod_capacity": 0.5, "n_layers": 4},
    "mod-capacity-1.0": {"mod_capacity": 0.5, "n_layers": 4, "capacity_factor": 1.0},
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("setting", list(MOE_SETTINGS))
def test_a_packed_moe_row_equals_each_document_on_its_own(setting, mode):
    """Routing, capacity and depth choices all stay inside their document (train mode picks
    MoD's top share per document; eval mode lets the predictor decide token by token)."""
    torch.manual_seed(0)
    model = archs.build("moe-tiny", **MOE_SETTINGS[setting]).train(mode == "train")
    with torch.no_grad():  # hidden states of positive mean all prefer expert 0: it overflows
        model.embed.weight += 1.0
        for block in model.modules():
            if isinstance(block, Experts):
                block.router.weight[0] += 0.5
    lengths = [7, 20, 1, 12]
    docs = [torch.randint(0, model.cfg.vocab_size, (n,)) for n in lengths]
    row = torch.cat(docs)[None]
    starts = torch.tensor([[0, 7, 27, 28, -1]])
    with torch.no_grad():
        packed = model(row, doc_starts=starts)[0]
        alone = torch.cat([model(d[None])[0] for d in docs])
        dropped = torch.stack([s["dropped"] for s in model.hidden(row, starts)[1]]).mean()
    if model.cfg.capacity_factor is not None:
        assert dropped > 0, "the test should exercise the capacity limit"
    assert torch.allclose(packed, alone, atol=1e-5)


def test_multi_token_targets_never_cross_a_document():
    ids = torch.arange(10)[None]
    starts = torch.tensor([[0, 4, 7, -1]])  # documents 0-3, 4-6, 7-9
    t = mtp_targets(ids, starts, 1).tolist()[0]  # predicts token t + 2
    assert t == [2, 3, -100, -100, 6, -100, -100, 9, -100, -100]


def test_moe_with_multi_token_heads_trains():
    torch.manual_seed(0)
    model = archs.build("moe-tiny", n_pred_tokens=3)
    x = torch.randint(0, 512, (2, 32))
    out = model.loss(x, torch.roll(x, -1, 1), torch.tensor([[0, 10, -1], [0, -1, -1]]))
    assert set(out) >= {"loss", "ce", "aux", "mtp", "balance", "z_loss", "dropped"}
    out["loss"].backward()
    assert all(p.grad is not None for p in model.mtp.parameters())


def test_mixture_of_depths_is_causal_at_inference():
    torch.manual_seed(0)
    model = archs.build("moe-tiny", mod_capacity=0.5, n_layers=4).eval()
    x = torch.randint(0, 512, (2, 40))
    y = x.clone()
    y[:, 25:] = torch.randint(0, 512, (2, 15))
    starts = torch.tensor([[0, 12, -1], [0, -1, -1]])
    with torch.no_grad():
        a, b = model(x, starts), model(y, starts)
    assert torch.allclose(a[:, :25], b[:, :25], atol=1e-5)


def test_a_depth_routed_block_returns_no_view():
    """FSDP2 hooks each block's output for its backward all-gather; a view's hook is lost to an
    in-place op after it, which torch warns of on every rank ("returned a view tensor", issue 44).
    The block's output is a tensor of its own, in training and at inference alike."""
    torch.manual_seed(0)
    model = archs.build("hybrid-tiny", mod_capacity=0.5, n_pred_tokens=2)
    block = next(b for b in model.blocks if type(b).__name__ == "DepthRouted")
    x = torch.randn(2, 24, model.cfg.d_model, requires_grad=True)
    pos = torch.arange(24).expand(2, 24)
    starts = torch.tensor([[0, 9, -1], [0, -1, -1]])
    for training in (True, False):
        block.train(training)
        out, _ = block(x * 1.0, pos, starts)
        assert out._base is None and out.shape == x.shape


def test_capacity_factor_must_be_positive():
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        MoEConfig(capacity_factor=0.0)


def test_dispatch_and_combine_gradients_are_exact():
    """The two row moves are each other's adjoint: gradcheck in float64 against finite
    differences, and the routed output of every token equals its weighted experts' sum."""
    from longpack.archs.moe_experts import combine_rows, dispatch_rows

    torch.manual_seed(0)
    n, k, d = 7, 2, 3
    choice = torch.randint(0, 4, (n * k,))
    order = choice.argsort(stable=True)
    inverse = torch.empty_like(order).index_copy_(0, order, torch.arange(n * k))
    x = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    y = torch.randn(n * k, d, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: dispatch_rows(x, order, inverse, k), (x,))
    assert torch.autograd.gradcheck(lambda y: combine_rows(y, order, inverse, k), (y,))
    rows = dispatch_rows(x, order, inverse, k)
    assert torch.equal(rows, x[order // k])
    back = combine_rows(rows, order, inverse, k)
    assert torch.allclose(back, k * x)  # each token's k copies, summed


def test_expert_routing_scatters_no_rows():
    """Forward and backward move rows by gathers: no index_add / scatter_add over (tokens, d)
    (serial on CPU); the per-expert counts (1-D) may still use one."""
    experts = tiny_experts()
    x = crowded_inputs(2, 24, 16).requires_grad_()
    with torch.profiler.profile(record_shapes=True) as prof:
        y, _ = experts(x)
        y.sum().backward()
    scatters = [e for e in prof.events() if e.name in ("aten::index_add_", "aten::index_add",
                                                      "aten::scatter_add_", "aten::scatter_add")
                and any(len(shape) == 2 for shape in e.input_shapes if isinstance(shape, list))]
    assert scatters == []
