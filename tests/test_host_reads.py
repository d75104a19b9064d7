"""Host reads in a training step, per family (issue 57).

On a GPU, every read of the device's values to the host (an `.item()`, a `.tolist()`, an `if`
on a tensor) and every operator whose output's shape depends on the values (`nonzero`, a
boolean index, `unique`) waits for the device to finish all it was given: the CPU stops
queueing work. Here, on the CPU, the same calls are seen by name: a TorchFunctionMode sees a
tensor's values leave as Python objects (`tolist`, `numpy`), a TorchDispatchMode sees the
operators (the scalar reads `item`, `bool` and `int` make, the data-dependent shapes, a copy
from a device to the host). Each family's count per step is pinned: where it is not 0 the
reason is beside it, and docs/TRAIN.md lists it.
"""

from collections import Counter

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from longpack import archs

aten = torch.ops.aten

# Operators whose output's shape depends on the input's values, or that read a value.
DATA_DEPENDENT = {aten.nonzero.default, aten._local_scalar_dense.default,
                  aten.masked_select.default, aten._unique.default, aten._unique2.default,
                  aten.unique_consecutive.default, aten.unique_dim.default,
                  aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
VALUES_TO_PYTHON = {torch.Tensor.tolist, torch.Tensor.numpy}


class _Operators(TorchDispatchMode):
    def __init__(self, seen: Counter):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if reads_the_device(func, args, kwargs):
            self.seen[str(func)] += 1
        return func(*args, **kwargs)


def reads_the_device(func, args, kwargs) -> bool:
    if func in DATA_DEPENDENT:
        # repeat_interleave knows its output's size when given it
        return not (func.overloadpacket is aten.repeat_interleave and kwargs.get("output_size"))
    if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
        return any(i is not None and i.dtype == torch.bool for i in args[1])  # a mask's nonzero
    if func is aten.bincount.default:
        return not kwargs.get("minlength", args[2] if len(args) > 2 else 0)
    if func in (aten._to_copy.default, aten.copy_.default):
        src = args[1] if func is aten.copy_.default else args[0]
        dst = args[0].device if func is aten.copy_.default else kwargs.get("device")
        return src.device.type != "cpu" and dst is not None and torch.device(dst).type == "cpu"
    return False


class _Values(TorchFunctionMode):
    def __init__(self, seen: Counter):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in VALUES_TO_PYTHON:
            self.seen[f"Tensor.{func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def host_reads(fn) -> Counter:
    """What `fn()` reads to the host: {operator or method: times}."""
    seen = Counter()
    with _Values(seen), _Operators(seen):
        fn()
    return seen


# Each family at its tiny preset, the MoE family with every feature that touches documents.
FAMILIES = {
    "neox": ("neox-tiny", {}),
    "moe": ("moe-tiny", {"mod_capacity": 0.5, "n_pred_tokens": 2}),
    "mamba": ("mamba-tiny", {}),
    "hybrid": ("hybrid-tiny", {"mod_capacity": 0.5}),
    "resonance": ("resonance-tiny", {}),
}

# Reads per training step on the CPU, pinned. The one read of the families with attention or a
# long convolution is the rows' document starts, read once per forward (archs/documents.py):
# the CPU's attention runs per document and resonance's FFTs group documents by length, both
# sized on the host. Mamba's scan on the CPU needs no sizes: it reads nothing.
EXPECTED = {"neox": 1, "moe": 1, "mamba": 0, "hybrid": 1, "resonance": 1}


def expert_layers(model) -> int:
    """Outside bf16 each MoE layer's experts run as a loop whose slices' sizes are read to the
    host (archs/moe_experts.py: grouped_mm has no fp32 kernel on CUDA, and the CPU takes the
    GPU's path): one read per layer. In bf16 (autocast), grouped GEMMs: none."""
    from longpack.archs.moe_experts import Experts

    return sum(isinstance(m, Experts) for m in model.modules())


def step(model, ids, starts, precision: str = "fp32"):
    def run():
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            out = model.loss(ids, torch.roll(ids, -1, 1), starts)
        out["loss"].backward()
    return run


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_document_masked_step_reads_the_host_only_where_pinned(family):
    name, args = FAMILIES[family]
    torch.manual_seed(0)
    model = archs.build(name, **args).train()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 96))
    starts = torch.tensor([[0, 9, 30, 31, 70, -1], [0, 50, -1, -1, -1, -1]])
    host_reads(step(model, ids, starts))  # a first step: lazy set-up is not the step's
    seen = host_reads(step(model, ids, starts))
    assert sum(seen.values()) == EXPECTED[family] + expert_layers(model), dict(seen)


def test_the_counter_sees_each_kind_of_read():
    t = torch.tensor([3, 0, 5])
    seen = host_reads(lambda: (t.tolist(), t.nonzero(), t[t > 1], bool(t[0]), t.numpy(),
                               torch.bincount(t), torch.bincount(t, minlength=8),
                               t.repeat_interleave(t), t.repeat_interleave(2)))
    assert seen == Counter({"Tensor.tolist": 1, "Tensor.numpy": 1, "aten.nonzero.default": 1,
                            "aten.index.Tensor": 1, "aten._local_scalar_dense.default": 1,
                            "aten.bincount.default": 1, "aten.repeat_interleave.Tensor": 1})


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_documents_told_from_the_host_make_a_step_read_nothing(family, precision):
    """The loader has every row's starts on the host: Documents given their spans from there
    (archs/documents.py) leave the step nothing to read, whichever family (outside bf16, but
    the experts' sizes)."""
    from longpack.archs.documents import Documents, spans_of

    name, args = FAMILIES[family]
    torch.manual_seed(0)
    model = archs.build(name, **args).train()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 96))
    host = [[0, 9, 30, 31, 70, -1], [0, 50, -1, -1, -1, -1]]

    def documents():  # a new micro-batch's, as the step would get them
        return Documents(torch.tensor(host), 96, lambda: spans_of(host, 96))

    host_reads(step(model, ids, documents(), precision))
    seen = host_reads(step(model, ids, documents(), precision))
    experts = expert_layers(model) if precision == "fp32" else 0
    assert seen == (Counter({"Tensor.tolist": experts}) if experts else Counter())


@pytest.mark.parametrize("optimizer, precision", [("muon", "bf16"), ("adamw", "fp16"),
                                                  ("muon", "fp16")])
def test_muon_and_fp16_steps_read_nothing_either(optimizer, precision):
    """The skip of a non-finite step (issue 52) is decided on the device for every optimizer:
    Muon keeps its update where the flag says, fp16's scaler is lowered without a read."""
    from longpack.training import TrainConfig
    from longpack.training.data.loader import make_batch
    from longpack.training.parallel.distributed import launched
    from longpack.training.step import prepare, train_step

    name, args = FAMILIES["neox"]
    torch.manual_seed(0)
    model = archs.build(name, **args)
    cfg = TrainConfig(shards="x", model=name, lr=1e-3, warmup=0, precision=precision,
                      optimizer=optimizer)
    procs = launched()
    state = prepare(model, cfg, procs)
    rng = np.random.default_rng(0)

    def micro_batch():
        return make_batch([(rng.integers(0, model.cfg.vocab_size, 97), np.array([0, 40]), None)
                           for _ in range(2)])

    train_step(state, [micro_batch()], 0, cfg, procs)  # the first: lazy set-up
    seen = host_reads(lambda: train_step(state, [micro_batch()], 1, cfg, procs))
    assert seen == Counter()


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_trainer_step_reads_nothing_for_any_family(family, precision):
    """The trainer's own path: the loader's batches (their documents told from the host's
    starts), training/step.py's train_step (forward and backward of two micro-batches, the
    clipping norm, the update) read nothing of the device, whichever family, in bf16; in fp32
    the MoE layers' experts read their sizes (one per layer and micro-batch)."""
    from longpack.training import TrainConfig
    from longpack.training.data.loader import make_batch
    from longpack.training.parallel.distributed import launched
    from longpack.training.step import prepare, train_step

    name, args = FAMILIES[family]
    torch.manual_seed(0)
    model = archs.build(name, **args)
    cfg = TrainConfig(shards="x", model=name, lr=1e-3, warmup=0, precision=precision)
    procs = launched()
    state = prepare(model, cfg, procs)
    rng = np.random.default_rng(0)

    def micro_batch():  # rows as the build's reader gives them: tokens, document starts
        return make_batch([(rng.integers(0, model.cfg.vocab_size, 97), np.array(starts), None)
                           for starts in ([0, 9, 30, 31, 70], [0, 50])])

    train_step(state, [micro_batch()], 0, cfg, procs)  # the first: lazy set-up
    batches = [micro_batch(), micro_batch()]
    seen = host_reads(lambda: train_step(state, batches, 1, cfg, procs))
    experts = 2 * expert_layers(model) if precision == "fp32" else 0  # 2 micro-batches
    assert seen == (Counter({"Tensor.tolist": experts}) if experts else Counter())
