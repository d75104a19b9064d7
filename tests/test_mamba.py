"""Mamba (archs/mamba.py): the chunked scan equals the recurrence, documents restart the state,
generation decodes recurrently with the full forward's logits, sizes and FLOPs are honest.
Causality, packed rows, bf16, compile and learning are tests/test_archs.py's (FAMILY_TINY)."""

import pytest
import torch

from longpack import archs
from longpack.archs.mamba import MambaMixer, ssd_chunked, ssd_recurrent


def scan_inputs(b=2, T=37, G=2, R=3, P=4, N=5, seed=0):
    # on torch's default device (the GPU suite runs these tests with CUDA as the default)
    g = torch.Generator(torch.get_default_device()).manual_seed(seed)
    return (torch.randn(b, T, G, R, P, generator=g), torch.rand(b, T, G, R, generator=g) * 0.5,
            -torch.rand(G, R, generator=g) * 2 - 0.1, torch.randn(b, T, G, N, generator=g),
            torch.randn(b, T, G, N, generator=g))


@pytest.mark.parametrize("T", [1, 16, 37, 64])
@pytest.mark.parametrize("chunk", [1, 4, 16, 64])
def test_the_chunked_scan_is_the_recurrence(T, chunk):
    x, dt, A, B, C = scan_inputs(T=T)
    start = torch.randn(2, 2, 3, 4, 5)  # a state carried in (generation after a prompt)
    for state in (None, start):
        want, want_h = ssd_recurrent(x, dt, A, B, C, state=state)
        got, got_h = ssd_chunked(x, dt, A, B, C, chunk=chunk, state=state)
        assert (got - want).abs().max() < 1e-5 and (got_h - want_h).abs().max() < 1e-5


@pytest.mark.parametrize("chunk", [3, 8, 64])
def test_documents_restart_the_state_in_both_forms(chunk):
    x, dt, A, B, C = scan_inputs(T=37)
    seg = torch.tensor([[0] * 10 + [1] * 15 + [2] * 12, [0] * 8 + [1] * 29])
    want, _ = ssd_recurrent(x, dt, A, B, C, seg)
    got, _ = ssd_chunked(x, dt, A, B, C, seg, chunk=chunk)
    assert (got - want).abs().max() < 1e-5
    # the second document of row 0 alone gives the same outputs
    alone, _ = ssd_chunked(x[:1, 10:25], dt[:1, 10:25], A, B[:1, 10:25], C[:1, 10:25],
                           chunk=chunk)
    assert (got[:1, 10:25] - alone).abs().max() < 1e-5


@pytest.mark.parametrize("args", [{}, {"chunk": 5}, {"n_groups": 2}])
def test_decoding_recurrently_gives_the_full_forwards_logits(args):
    torch.manual_seed(0)
    model = archs.build("mamba-tiny", **args).eval()
    ids = torch.randint(0, 512, (1, 40))
    cache = model.new_cache()
    with torch.no_grad():
        full = model(ids)
        prompt = model.decode(ids[:, :13], cache)  # chunked into the state at once
        steps = [model.decode(ids[:, t:t + 1], cache) for t in range(13, 40)]  # recurrent
    assert (torch.cat([prompt, *steps], 1) - full).abs().max() < 1e-5
    assert cache[0]["ssm"].shape == (1, model.cfg.n_groups, 64 * 2 // 16 // model.cfg.n_groups,
                                     16, 16)  # O(1) state: (groups, heads/group, P, N)


def test_zoo_generates_with_the_recurrent_form(tmp_path):
    from longpack.archs.generate import generate

    torch.manual_seed(0)
    model = archs.build("mamba-tiny").eval()
    out = generate(model, [5, 6, 7], 6)
    with torch.no_grad():  # each token: the full forward over everything before it
        expect = [int(model(torch.tensor([[5, 6, 7, *out[:i]]]))[0, -1].argmax())
                  for i in range(6)]
    assert out == expect
    archs.save(model, tmp_path / "m")  # tied embeddings survive a round trip
    again = archs.load(tmp_path / "m")
    assert again.head.weight is again.embed.weight
    assert torch.equal(again.embed.weight, model.embed.weight)


def test_presets_are_the_published_sizes_and_flops_grow_linearly_past_a_chunk():
    sizes = {n: archs.build(n, device="meta", vocab_size=50277).num_params()
             for n in ("mamba-130m", "mamba-370m", "mamba-1.3b")}
    # the published Mamba-2 checkpoints: 130M, 370M, 1.3B (GPT-NeoX's 50,277 tokens, tied)
    assert 125e6 < sizes["mamba-130m"] < 135e6
    assert 360e6 < sizes["mamba-370m"] < 380e6
    assert 1.3e9 < sizes["mamba-1.3b"] < 1.4e9
    # FLOPs are measured (archs/flops.py; tests/test_flops.py holds them to the formula): linear
    # in the length, so beyond the chunk a token's cost does not grow
    model = archs.build("mamba-tiny", device="meta")
    assert model.flops_per_token(4 * 64) == pytest.approx(model.flops_per_token(2 * 64),
                                                          rel=1e-9)
    assert model.flops_per_token(16) < model.flops_per_token(2 * 64)


def test_the_mixer_refuses_widths_that_do_not_split():
    with pytest.raises(ValueError, match="not a multiple of head_dim"):
        archs.build("mamba-tiny", head_dim=48)
    with pytest.raises(ValueError, match="do not split into n_groups"):
        archs.build("mamba-tiny", n_groups=3)
    assert isinstance(archs.build("mamba-tiny").blocks[0].mixer, MambaMixer)


@pytest.mark.parametrize("args", [{}, {"mod_capacity": 0.5, "n_pred_tokens": 2},
                                  {"layers": None, "attention_every": 3, "n_layers": 6}])
def test_a_hybrid_decodes_with_its_caches_and_keeps_documents_apart(args):
    torch.manual_seed(0)
    model = archs.build("hybrid-tiny", vocab_size=300, **args).eval()
    for block in model.blocks:  # a predictor that sends about half the tokens through
        if hasattr(block, "predictor"):
            torch.nn.init.normal_(block.predictor.weight, std=1.0)
    kinds = [type((b.block if hasattr(b, "block") else b).mixer).__name__ for b in model.blocks]
    assert kinds == ["MambaMixer" if c == "M" else "Attention" for c in model.cfg.mixers]
    assert "MambaMixer" in kinds and "Attention" in kinds
    ids = torch.randint(0, 300, (1, 30))
    cache = model.new_cache()
    with torch.no_grad():
        full = model(ids)
        got = torch.cat([model.decode(ids[:, :9], cache)]
                        + [model.decode(ids[:, t:t + 1], cache) for t in range(9, 30)], 1)
        assert (got - full).abs().max() < 1e-5
        docs = [torch.randint(0, 300, (n,)) for n in (7, 20, 3)]
        packed = model(torch.cat(docs)[None], doc_starts=torch.tensor([[0, 7, 27]]))[0]
        alone = torch.cat([model(d[None])[0] for d in docs])
    assert (packed - alone).abs().max() < 1e-5


def test_hybrid_layer_patterns_and_the_5b_design():
    cfg = archs.config("moe", n_layers=8, attention_every=4)
    assert cfg.mixers == "MMMAMMMA"
    assert archs.config("moe", n_layers=6, layers="MMA").mixers == "MMAMMA"
    assert archs.config("moe", n_layers=3).mixers == "AAA"  # attention throughout by default
    for bad, says in [({"layers": "MX"}, "one letter per layer"),
                      ({"layers": "MMA", "n_layers": 4}, "must divide n_layers"),
                      ({"layers": "MA", "attention_every": 2}, "not both")]:
        with pytest.raises(ValueError, match=says):
            archs.config("moe", **bad)
    model = archs.build("hybrid-5b", device="meta")
    params, active = model.num_params(), model.active_params()
    assert 4.8e9 < params < 5.2e9 and active < 0.3 * params
    assert model.cfg.mixers.count("A") == 6  # attention in 6 layers of 24 (FLOPs: test_flops)
