"""Optimizer groups by parameter role: which parameter gets weight decay, Muon or AdamW, for
every zoo preset; Muon on MoE experts, one expert matrix at a time."""

import re

import pytest
import torch
import torch.nn as nn

from longpack import archs
from longpack.training.config import TrainConfig
from longpack.training.optim import Muon, make_optimizers

# Written from the model files' layouts, independently of their PARAM_ROLES tables: each
# parameter name must match exactly one pattern of its family.
EXPECTED_ROLES = {
    "gpt-neox": {
        r"embed\.weight": "embedding",
        r"head\.weight": "head",
        r"(ln_f|blocks\.\d+\.ln[12])\.(weight|bias)": "norm",
        r"blocks\.\d+\.(attn\.qkv|attn\.out|fc_in|fc_out)\.weight": "matrix",
        r"blocks\.\d+\.(attn\.qkv|attn\.out|fc_in|fc_out)\.bias": "bias",
    },
    "resonance": {
        r"embed\.weight": "embedding",
        r"head\.weight": "head",
        r"(ln_f|blocks\.\d+\.ln[12])\.(weight|bias)": "norm",
        r"blocks\.\d+\.(inp|out|fc_in|fc_out)\.weight": "matrix",
        r"blocks\.\d+\.(inp|out|fc_in|fc_out|short)\.bias": "bias",
        r"blocks\.\d+\.(short\.weight|long\.(omega|log_alpha|amp|phase|skip))": "kernel",
    },
    "moe": {
        r"embed\.weight": "embedding",
        r"head\.weight": "head",
        r"(norm_f|blocks\.\d+(\.block)?\.norm[12])\.weight": "norm",
        r"(blocks\.\d+(\.block)?\.attn\.(q|kv|out)|mtp\.\d+)\.weight": "matrix",
        r"blocks\.\d+(\.block)?\.experts\.w_(gate|up|down)": "experts",
        r"blocks\.\d+((\.block)?\.experts)?\.router\.weight": "router",
        r"blocks\.\d+\.predictor\.weight": "router",
        r"blocks\.\d+\.predictor\.bias": "bias",
        # hybrids' Mamba layers
        r"blocks\.\d+(\.block)?\.ssm\.(in_proj|out_proj)\.weight": "matrix",
        r"blocks\.\d+(\.block)?\.ssm\.norm": "norm",
        r"blocks\.\d+(\.block)?\.ssm\.(conv\.(weight|bias)|A_log|D|dt_bias)": "kernel",
    },
    "mamba": {
        r"embed\.weight": "embedding",  # tied: the head is the same parameter
        r"(norm_f\.weight|blocks\.\d+\.norm|blocks\.\d+\.mixer\.norm)": "norm",
        r"blocks\.\d+\.mixer\.(in_proj|out_proj)\.weight": "matrix",
        r"blocks\.\d+\.mixer\.(conv\.(weight|bias)|A_log|D|dt_bias)": "kernel",
    },
}
# What each role gets: (weight decay, optimizer under --optimizer muon); AdamW under adamw.
TREATMENT = {"matrix": (True, "Muon"), "experts": (True, "Muon"), "head": (True, "AdamW"),
             "embedding": (False, "AdamW"), "norm": (False, "AdamW"), "bias": (False, "AdamW"),
             "router": (False, "AdamW"), "kernel": (False, "AdamW")}
# MoE with every optional part: Mixture-of-Depths blocks and multi-token heads.
MODELS = [*((name, {}) for name in archs.PRESETS),
          ("moe-tiny", {"mod_capacity": 0.5, "n_layers": 4, "n_pred_tokens": 3}),
          ("hybrid-tiny", {"mod_capacity": 0.5})]


def expected_role(family: str, name: str) -> str:
    roles = [role for pattern, role in EXPECTED_ROLES[family].items()
             if re.fullmatch(pattern, name)]
    assert len(roles) == 1, f"{name}: {roles}"
    return roles[0]


def train_config(optimizer: str, **kw) -> TrainConfig:
    return TrainConfig(shards="unused", optimizer=optimizer, lr=0.02, weight_decay=0.1, **kw)


@pytest.mark.parametrize("name, overrides", MODELS, ids=[m[0] + ("+options" if m[1] else "")
                                                         for m in MODELS])
def test_every_parameter_has_its_role(name, overrides):
    model = archs.build(name, device="meta", **overrides)
    roles = model.param_roles()
    assert list(roles) == [n for n, _ in model.named_parameters()]
    for pname, role in roles.items():
        assert role == expected_role(archs.PRESETS[name], pname), pname


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("name, overrides", MODELS, ids=[m[0] + ("+options" if m[1] else "")
                                                         for m in MODELS])
@pytest.mark.slow
def test_optimizer_groups_follow_the_roles(name, overrides, optimizer):
    """Every parameter in exactly one group, with the decay and optimizer of its role."""
    model = archs.build(name, device="meta", **overrides)
    family = archs.PRESETS[name]
    cfg = train_config(optimizer)
    placed = {}
    for opt in make_optimizers(model, cfg):
        for group in opt.param_groups:
            for p in group["params"]:
                assert id(p) not in placed, "a parameter in two groups"
                placed[id(p)] = (type(opt).__name__, group["weight_decay"])
    for pname, p in model.named_parameters():
        decayed, muon_opt = TREATMENT[expected_role(family, pname)]
        kind = muon_opt if optimizer == "muon" else "AdamW"
        assert placed.pop(id(p)) == (kind, cfg.weight_decay if decayed else 0.0), pname
    assert not placed, "a group holds something that is not the model's parameter"


@pytest.mark.parametrize("name", ["moe-1b", "moe-5b"])
def test_moe_experts_are_decayed_and_muon_s(name):
    """The experts are 75% of moe-1b and 91% of moe-5b: they must not fall out of the groups."""
    model = archs.build(name, device="meta")
    muon, adamw = make_optimizers(model, train_config("muon"))
    in_muon = sum(p.numel() for g in muon.param_groups for p in g["params"])
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts.w_" in n)
    assert experts / model.num_params() > 0.7
    assert in_muon > experts and in_muon / model.num_params() > 0.8


def test_muon_orthogonalizes_each_expert_as_its_own_matrix():
    """Two steps (momentum, decay, lr scaling included) on a stack [experts, in, out] equal
    torch.optim.Muon's on each expert's matrix [out, in] as a separate parameter."""
    torch.manual_seed(0)
    stack = nn.Parameter(torch.randn(3, 16, 8))
    alone = [nn.Parameter(w.detach().mT.clone()) for w in stack]
    settings = dict(lr=0.05, weight_decay=0.1)
    ours, reference = Muon([stack], **settings), torch.optim.Muon(alone, **settings)
    before = stack.detach().clone()
    for _ in range(2):
        grad = torch.randn(3, 16, 8) * torch.tensor([1.0, 100.0, 0.01])[:, None, None]
        stack.grad = grad
        for w, g in zip(alone, grad):
            w.grad = g.mT.clone()
        ours.step()
        reference.step()
    for w_stack, w_alone in zip(stack, alone):
        assert torch.allclose(w_stack.detach().mT, w_alone.detach(), atol=1e-6)
    # Each expert's step is orthogonalized on its own: similar singular values whatever the
    # scale of its gradient (expert 1's is 10^4 times expert 2's).
    for delta in (stack.detach() - before * (1 - 0.05 * 0.1) ** 2):
        sv = torch.linalg.svdvals(delta)
        assert sv.max() / sv.min() < 3 and 0.03 < sv.max() < 0.3


def test_muon_refuses_what_is_not_a_matrix():
    with pytest.raises(ValueError, match="matrices or stacks"):
        Muon([nn.Parameter(torch.zeros(4))])


def test_one_muon_step_moves_every_expert_as_muon_would():
    torch.manual_seed(0)
    model = archs.build("moe-tiny")
    x = torch.randint(0, 512, (4, 64))
    model.loss(x, torch.roll(x, -1, 1))["loss"].backward()
    experts = {n: p for n, p in model.named_parameters() if ".experts.w_" in n}
    assert len(experts) == 6
    before = {n: (p.detach().clone(), p.grad.clone()) for n, p in experts.items()}
    cfg = train_config("muon")
    muon = make_optimizers(model, cfg)[0]
    assert isinstance(muon, Muon)
    assert {id(p) for g in muon.param_groups for p in g["params"]} >= {id(p) for p in
                                                                       experts.values()}
    muon.step()
    for n, p in experts.items():
        w, g = before[n]
        alone = [nn.Parameter(e.mT.clone()) for e in w]
        for a, ge in zip(alone, g):
            a.grad = ge.mT.clone()
        torch.optim.Muon(alone, lr=cfg.lr, weight_decay=cfg.weight_decay).step()
        assert not torch.allclose(p.detach(), w), n
        assert torch.allclose(p.detach(), torch.stack([a.detach().mT for a in alone]),
                              atol=1e-6), n


def test_onecycle_and_cosine_with_warm_restarts_shapes():
    import pytest

    from longpack import SettingsError
    from longpack.training.config import TrainConfig
    from longpack.training.optim import lr_at

    one = TrainConfig(shards="x", max_steps=100, warmup=0, lr=1.0, min_lr=0.01,
                      schedule="onecycle")
    lrs = [lr_at(s, one) for s in range(100)]
    assert lrs[0] > 1.0 / 25 and lrs[0] < 0.05 and abs(lrs[29] - 1.0) < 1e-12  # 30% rise
    assert all(a < b for a, b in zip(lrs[:30], lrs[1:30]))  # up, then down
    assert all(a > b for a, b in zip(lrs[29:], lrs[30:])) and abs(lrs[-1] - 0.01) < 1e-12
    sgdr = TrainConfig(shards="x", max_steps=100, warmup=10, lr=1.0, min_lr=0.0,
                       schedule="cosine-restarts", restart_every=30)
    lrs = [lr_at(s, sgdr) for s in range(100)]
    assert lrs[9] == 1.0 and lrs[10] == lrs[40] == lrs[70] == 1.0  # each cycle starts at lr
    assert lrs[25] == pytest.approx(0.5) and lrs[39] < 0.01  # half way, the end of a cycle
    with pytest.raises(SettingsError, match="takes --restart-every"):
        TrainConfig(shards="x", schedule="cosine-restarts")


def test_adamw_s_betas_and_epsilon_are_settings():
    from longpack.core.errors import SettingsError

    model = archs.build("neox-tiny", vocab_size=300)
    cfg = TrainConfig(shards="x", adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6)
    (adamw,) = make_optimizers(model, cfg)
    assert all(g["betas"] == (0.8, 0.99) and g["eps"] == 1e-6 for g in adamw.param_groups)
    with pytest.raises(SettingsError, match=r"--adam-beta2 must be in \[0, 1\)"):
        TrainConfig(shards="x", adam_beta2=1.0)
