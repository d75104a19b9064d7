"""Mamba's lean scan (archs/mamba.py LeanMix): a layer keeps only in_proj's input and output
and out_proj's input, and backward recomputes the rest; its outputs and gradients are the
plain autograd path's, the memory plan follows it, and the scan that runs is chosen clearly
(flash-linear-attention's kernel on CUDA where installed, the PyTorch reference otherwise)."""

import pytest
import torch

from longpack import archs
from longpack.archs import activations, mamba, memory
from longpack.archs.mamba import Block, MambaConfig, MambaMixer, ssd_chunked


def saved_bytes(module, run) -> int:
    """Bytes of the storages autograd saves in `run()`, each once, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        run()
    return sum(seen.values())


@pytest.mark.parametrize("docs", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_a_layer_keeps_at_most_63_kb_a_token_at_d1024_in_bf16_and_the_plan_says_so(docs):
    """One Mamba layer (pre-norm and mixer), d 1024, one row of 512 tokens, bf16 autocast (the
    plain path's figure: docs/BENCHMARKS.md)."""
    torch.manual_seed(0)
    cfg = MambaConfig(d_model=1024, n_layers=1)
    block, T = Block(cfg), 512
    x = torch.randn(1, T, 1024, requires_grad=True)
    starts = torch.tensor([[0, 100, 300]]) if docs else None
    got = saved_bytes(block, lambda: block(x, None, starts))
    assert got / T <= 63_000
    t = activations.Tokens(1, T, 2, docs, True)
    kept, _, _ = activations.blocks_and_remade(cfg, t)[0]
    copies = 2 * sum(p.numel() for p in (block.mixer.in_proj.weight, block.mixer.out_proj.weight))
    assert kept + copies == pytest.approx(got, rel=0.02)


def run(model, ids, starts, lean: bool, bf16: bool):
    model.zero_grad(set_to_none=True)
    MambaMixer.lean = lean
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model.loss(ids[:, :-1], ids[:, 1:], starts)["loss"]
        loss.backward()
    finally:
        MambaMixer.lean = True
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("name, args", [("mamba-tiny", {}), ("hybrid-tiny", {}),
                                        ("hybrid-tiny", {"mod_capacity": 0.5})])
def test_lean_and_plain_give_the_same_loss_and_gradients(name, args, bf16):
    """The same operations in the same order: equal bit for bit, documents and padded chunks
    included, fp32 and bf16 autocast, Mamba and the MoE family's hybrids (one depth-routed)."""
    torch.manual_seed(0)
    model = archs.build(name, vocab_size=300, **args).train()
    ids = torch.randint(0, 300, (2, 42))
    starts = torch.tensor([[0, 10, 30], [0, 5, -1]])
    lean, plain = run(model, ids, starts, True, bf16), run(model, ids, starts, False, bf16)
    assert lean[0].equal(plain[0])
    assert lean[1].keys() == plain[1].keys() and len(lean[1]) == len(list(model.parameters()))
    assert all(lean[1][k].equal(plain[1][k]) for k in lean[1])


def test_bf16_stays_near_fp32():
    torch.manual_seed(0)
    model = archs.build("mamba-tiny").train()
    ids = torch.randint(0, 512, (2, 65))
    starts = torch.tensor([[0, 20, -1], [0, 7, 50]])
    (l32, g32), (l16, g16) = run(model, ids, starts, True, False), run(model, ids, starts, True,
                                                                        True)
    assert (l16 - l32).abs() < 0.02 * l32
    for k in g32:
        assert (g16[k] - g32[k]).norm() <= 0.1 * g32[k].norm() + 1e-6, k


def test_the_lean_path_runs_only_where_a_graph_is_made():
    """No graph (eval, generation's cache): the plain mix; a graph: LeanMix."""
    torch.manual_seed(0)
    model = archs.build("mamba-tiny")
    ids = torch.randint(0, 512, (1, 20))
    out = model(ids)
    assert out.grad_fn is not None
    names, seen, todo = set(), set(), [out.grad_fn]
    while todo:  # every node of the graph once
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            names.add(fn.name())
            todo.extend(nxt for nxt, _ in fn.next_functions)
    assert "LeanMixBackward" in names
    with torch.no_grad():
        assert torch.equal(model(ids), out.detach())


def test_mamba_13b_plans_at_most_twice_neox_12b_at_8_rows_of_2k_in_bf16():
    """`train --dry-run`'s activations (memory_plan), one process, no checkpointing."""
    def acts(name):
        plan = memory.memory_plan(archs.layout(name), archs.config(name), 8, 2048, "bf16")
        return plan["activations"]

    assert acts("mamba-1.3b") <= 2 * acts("neox-1.2b")


# -- which scan runs -------------------------------------------------------------------------

def test_the_pytorch_scan_runs_without_cuda_or_without_the_kernels(monkeypatch):
    assert mamba.scan_name("cpu") == "pytorch"
    monkeypatch.setattr(mamba, "_FLA", [None])  # the package absent
    assert mamba.scan_name("cuda") == "pytorch"
    monkeypatch.setattr(mamba, "_FLA", [lambda *a, **k: None])  # installed, but no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert mamba.scan_name("cuda") == "fla" and mamba.scan_name("cpu") == "pytorch"


def test_the_scan_goes_to_the_kernel_with_rows_and_documents_as_cu_seqlens(monkeypatch):
    """A stand-in for chunk_simple_gla (the recurrence per sequence, what the kernel computes)
    receives the rows end to end cut at each row and document start, and gives back
    ssd_chunked's output."""
    calls = []

    def kernel(q, k, v, g, scale, cu_seqlens):
        calls.append(cu_seqlens.tolist())
        out = torch.zeros_like(v)
        for s, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
            h = torch.zeros(q.shape[2], q.shape[3], v.shape[3])
            for t in range(s, e):
                h = torch.exp(g[0, t])[:, None, None] * h + k[0, t, :, :, None] * v[0, t, :, None]
                out[0, t] = scale * (q[0, t, :, None, :] @ h)[:, 0]
        return out, None

    monkeypatch.setattr(mamba, "_FLA", [kernel])
    monkeypatch.setattr(mamba, "scan_name", lambda device: "fla")
    g = torch.Generator().manual_seed(0)
    x, B, C = (torch.randn(2, 19, 2, *s, generator=g) for s in ((3, 4), (), ()))
    B, C = B[..., None].expand(2, 19, 2, 5).contiguous(), C[..., None].repeat(1, 1, 1, 5)
    dt = torch.rand(2, 19, 2, 3, generator=g) * 0.5
    A = -torch.rand(2, 3, generator=g) - 0.1
    seg = torch.tensor([[0] * 7 + [1] * 12, [0] * 19])
    got = mamba.scan(x, dt, A, B, C, seg, 8)
    assert calls == [[0, 7, 19, 38]]
    want, _ = ssd_chunked(x, dt, A, B, C, seg, 8)
    assert (got - want).abs().max() < 1e-5


@pytest.mark.slow  # two dry runs, each probing a step
def test_the_dry_run_says_which_scan_runs(shards):
    from click.testing import CliRunner

    from longpack.training.cli import train

    def dry_run(*args):
        r = CliRunner().invoke(train, ["--shards", str(shards), "--dry-run", "--batch-size", "2",
                                       "--max-steps", "10", *args])
        assert r.exit_code == 0, r.output
        return r.output

    out = dry_run("--model", "hybrid-tiny")
    assert "scan        Mamba layers: the PyTorch chunked scan (ssd_chunked; its GPU kernel " \
           "runs only on CUDA)" in out
    assert "scan " not in dry_run("--model", "neox-tiny")
