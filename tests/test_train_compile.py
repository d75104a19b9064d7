"""A compiled run compiles its model once: the batch's doc_starts has one shape (the loader's
full_width, model_inputs(..., full=True)), and the padding changes no number of any family."""

import pytest
import torch

from longpack import archs
from longpack.training.config import TrainConfig
from longpack.training.data.loader import full_width, make_batch
from longpack.training.parallel.distributed import Processes
from longpack.training.step import prepare, train_step

CPU = Processes(0, 1, torch.device("cpu"))
TINY = ["neox-tiny", "moe-tiny", "mamba-tiny", "hybrid-tiny", "resonance-tiny"]


def batch_of(width: int, T: int = 48, seed: int = 0) -> dict:
    """Two rows of T; the first holds `width` documents, the second one."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 200, (2, T + 1), generator=g)
    starts = torch.full((2, width), -1)
    starts[:, 0] = 0
    starts[0, 1:] = torch.arange(1, width) * (T // width)
    return {"input_ids": x[:, :-1], "targets": x[:, 1:], "doc_starts": starts}


def test_full_width_pads_with_minus_one_to_the_row():
    starts = torch.tensor([[0, 5, -1], [0, -1, -1]])
    got = full_width(starts, 8)
    assert got.shape == (2, 8)
    assert got[:, :3].equal(starts) and bool((got[:, 3:] == -1).all())
    assert full_width(torch.zeros(2, 8, dtype=torch.long), 8).shape == (2, 8)  # already full


@pytest.mark.parametrize("name", TINY)
def test_full_width_changes_no_loss_and_no_gradient(name):
    torch.manual_seed(0)
    model = archs.build(name, vocab_size=200)
    b = batch_of(3)
    out = []
    for starts in (b["doc_starts"], full_width(b["doc_starts"], b["input_ids"].shape[1])):
        model.zero_grad(set_to_none=True)
        loss = model.loss(b["input_ids"], b["targets"], starts)["loss"]
        loss.backward()
        out.append((loss.detach(), [p.grad.clone() for p in model.parameters()
                                    if p.grad is not None]))
    (l1, g1), (l2, g2) = out
    assert l1.equal(l2)  # bitwise
    assert len(g1) == len(g2) and all(a.equal(b) for a, b in zip(g1, g2))


def test_a_compiled_step_compiles_once_over_batches_of_other_document_counts(monkeypatch):
    """mamba-tiny: a family whose CPU path has no Python loop over documents, so every graph
    compiled after the first step is a recompile. Before full_width, the widths 2, 3, 5, 1
    compiled 3 graphs."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend=counting))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = archs.build("mamba-tiny", vocab_size=200)
    cfg = TrainConfig(shards="x", model="mamba-tiny", compile=True, warmup=0)
    state = prepare(model, cfg, CPU)
    seen = []
    for step, width in enumerate((2, 3, 5, 1)):
        b = batch_of(width, seed=step)  # as the loader gives a compiled run its rows
        rows = [(torch.cat([i[:1], t]).numpy(), s[s >= 0].numpy(), None)
                for i, t, s in zip(b["input_ids"], b["targets"], b["doc_starts"])]
        train_step(state, [make_batch(rows, full=True)], step, cfg, CPU)
        seen.append(len(graphs))
    torch._dynamo.reset()
    assert seen[0] >= 1 and seen == [seen[0]] * 4, seen
