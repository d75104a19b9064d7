"""longpack's model zoo: each architecture in one file, registered here by name with presets.

    archs.list_models(vocab_size=None)  -> [{name, family, vocab_size, params, active_params,
                                            flops_per_token, seq, per_vocab_entry}, ...]
    archs.build("neox-tiny")            -> nn.Module; model(input_ids, doc_starts=None) -> logits
    archs.build("gpt-neox", n_layers=4) -> the family's default config with overrides
    archs.save(model, DIR); archs.load(DIR) -> config.json (family + config) + model.safetensors
    archs.footprint("gpt-neox", n_layers=96) -> {"params", "bytes"}, counted on meta, at once
    archs.layout("moe-5b")              -> Layout: each parameter's shape, role and block (the
                                            memory plan's input: memory.py), the same way

Each config checks the type and range of every field (limits.py: ValueError naming the field,
the value and the range); `build` on a real device refuses a model whose weights pass that
device's memory (TooLarge) before it allocates anything.

Every model has `loss(input_ids, targets, doc_starts=None) -> {"loss", "ce", "aux"}`,
`num_params()`, `flops_per_token(seq)` (a training step's FLOPs, measured for every family
alike: flops.py) and `param_roles()` (each parameter's role, which
training/optim/optimizers.py groups by; MoE also `active_params()`).

    input_ids, doc_starts
      |  layers.py      positions and document masks, rotary, attention, the stacked-LM frame
      v
    gpt_neox.py     attention + MLP blocks (parallel residual)
    moe.py          attention + routed experts (moe_experts.py: dispatch, expert MLPs)
    resonance.py    FFT long convolution + MLP blocks
    mamba.py        selective state-space (Mamba-2) blocks, chunked scan; recurrent decoding
      |  layers.py      the loss: logits, cross-entropy (chunked past a memory budget)
      v
    {"loss", "ce", "aux"}

flops.py counts a step's FLOPs with FlopCounterMode on the meta device (model.flops_per_token).
__main__.py prints the presets (`python -m longpack.archs`) and writes presets.json, which torch-free
code (pack stats' recommendations) reads.
"""

import functools
import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from longpack.archs import flops, gpt_neox, layers, mamba, moe, resonance
from longpack.archs.limits import device_memory, typed
from longpack.archs.preset_table import presets_table as presets_table  # as text
from longpack.core import lazy_names

# what model.flops_per_token calls: the model files (layers.py) ship without it
layers.MEASURE_FLOPS = flops.flops_per_token

# family -> (config class, model class, presets)
FAMILIES = {
    "gpt-neox": (gpt_neox.GPTNeoXConfig, gpt_neox.GPTNeoX, gpt_neox.PRESETS),
    "moe": (moe.MoEConfig, moe.MoE, moe.PRESETS),
    "resonance": (resonance.ResonanceConfig, resonance.Resonance, resonance.PRESETS),
    "mamba": (mamba.MambaConfig, mamba.Mamba, mamba.PRESETS),
}
PRESETS = {name: family for family, (_, _, presets) in FAMILIES.items() for name in presets}
LIST_SEQ = 2048  # the sequence length list_models reports FLOPs/token at


def config(name: str, **overrides):
    if name in FAMILIES:
        cfg_cls, _, _ = FAMILIES[name]
        return replace(cfg_cls(), **overrides)
    if name in PRESETS:
        cfg_cls, _, presets = FAMILIES[PRESETS[name]]
        return replace(cfg_cls(**presets[name]), **overrides)
    raise KeyError(f"unknown model {name!r}; choose a family ({', '.join(FAMILIES)}) or a "
                   f"preset ({', '.join(PRESETS)})")


def parse_args(name: str, pairs: list[str]) -> dict:
    """KEY=VALUE strings (`train --model-arg`) -> overrides of the model's config dataclass,
    each value read as JSON (numbers, true/false, null) else as a string, and checked against
    the field's type (limits.typed; the ranges are the config's own check). ValueError naming
    the key (and, unknown, the valid ones)."""
    types = {f.name: f.type for f in fields(config(name))}
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"{pair!r}: give KEY=VALUE")
        if key not in types:  # the nearest by spelling, as for the commands' settings
            from longpack.core import suggest

            near = suggest(key, types)
            raise ValueError(f"{name}: unknown setting {key}"
                             + (f" (did you mean {near}?)" if near else "")
                             + f" (its settings: {', '.join(types)})")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        out[key] = typed(key, value, types[key])
    return out


class TooLarge(ValueError):
    """A model that does not fit the memory of the device it is for."""


def build(name: str, device: str | torch.device | None = None, **overrides) -> torch.nn.Module:
    """On `device`, or torch's default device (`torch.set_default_device`) when none is named.
    `device="meta"` builds without allocating (so a 5B preset can be counted anywhere).
    On any other device the weights are sized first (`footprint`, on meta) and a model whose
    weights the device's memory cannot hold is refused (TooLarge) before anything is
    allocated."""
    cfg = config(name, **overrides)
    family = name if name in FAMILIES else PRESETS[name]
    where = torch.device(device) if device is not None else torch.get_default_device()
    if where.type == "meta":
        with where, _MetaInitSkipped():
            return FAMILIES[family][1](cfg)
    size = footprint(name, **overrides)
    refuse_unfit(name, overrides, size["params"], size["bytes"], "its weights", where)
    with where:
        return FAMILIES[family][1](cfg)


class _MetaInitSkipped(TorchDispatchMode):
    """A weight on the meta device has no values, so initializing it computes nothing; but
    torch runs each in-place random or fill op on meta through its Python reference kernels,
    most of the time of building a model there. This skips those ops for meta tensors only
    (this thread's, while the mode is on)."""

    SKIPPED = {torch.ops.aten.normal_.default, torch.ops.aten.uniform_.default,
               torch.ops.aten.zero_.default, torch.ops.aten.fill_.Scalar,
               torch.ops.aten.fill_.Tensor}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SKIPPED and args[0].is_meta:
            return args[0]
        return func(*args, **(kwargs or {}))


def footprint(name: str, **overrides) -> dict:
    """{"params", "bytes"}: the parameters of the model `build` would make and the bytes of its
    weights and buffers, counted on the meta device without building every layer (a deep
    model takes seconds to build even there). The size is linear along each of the config's
    `repeated` fields (n_layers, MoE's n_pred_tokens), so it is measured at a few periods of
    each and extrapolated. A weight past what a tensor can describe (int64 elements) is
    TooLarge."""
    cfg = config(name, **overrides)
    small, periods = _periods(cfg)
    try:
        base = _measure(name, {**overrides, **small})
        total = dict(base)
        for field, k in periods.items():
            if k:
                more = _measure(name, {**overrides, **small,
                                       field: small[field] + cfg.repeated[field]})
                total = {key: total[key] + k * (more[key] - base[key]) for key in total}
    except (RuntimeError, TypeError) as e:
        # "Storage size calculation overflowed with sizes=[...]"; a size past int64 is a
        # TypeError ("Overflow when unpacking long long")
        if "overflow" not in str(e).lower():
            raise
        raise TooLarge(f"{_described(name, overrides)}: a weight has more elements than a "
                       f"tensor can hold ({str(e).splitlines()[0]})") from None
    return total


def _periods(cfg) -> tuple[dict, dict]:
    """({field: the small value a model is measured at}, {field: the periods beyond it}) for
    each of the config's `repeated` fields: a few periods are built, the rest extrapolated."""
    small, periods = {}, {}
    for field, period in cfg.repeated.items():
        n = getattr(cfg, field)
        small[field] = n if n <= 3 * period else period + n % period
        periods[field] = (n - small[field]) // period
    return small, periods


def _measure(name: str, overrides: dict) -> dict:
    model = build(name, device="meta", **overrides)
    params = list(model.parameters())  # a tied weight once
    return {"params": sum(p.numel() for p in params),
            "bytes": sum(t.numel() * t.element_size() for t in [*params, *model.buffers()])}


@dataclass(frozen=True)
class Param:
    """One parameter tensor: its shape, optimizer role, and the block it is in (None: the root
    module's own: embedding, head, final norm, multi-token heads)."""
    shape: tuple[int, ...]
    role: str
    block: int | None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Layout:
    """A model's parameters and buffers as the meta device sizes them."""
    params: tuple[Param, ...]
    buffer_bytes: int

    @property
    def count(self) -> int:
        return sum(p.numel for p in self.params)


MAX_BLOCKS = 100_000


def layout(name: str, **overrides) -> Layout:
    """The parameters `build(name, **overrides)` makes, counted on the meta device without
    building every layer (as footprint does): along each `repeated` field of the config the
    model is built at a few periods and the parameters one period adds are repeated, so a deep
    model is sized at once. Raises TooLarge for a weight no tensor can hold."""
    cfg = config(name, **overrides)
    small, periods = _periods(cfg)
    base, buffers = _params(name, {**overrides, **small})
    params = list(base.values())
    next_block = 1 + max((p.block for p in params if p.block is not None), default=-1)
    for name_, k in periods.items():
        if not k:
            continue
        more, more_buffers = _params(name, {**overrides, **small,
                                           name_: small[name_] + cfg.repeated[name_]})
        added = [p for key, p in more.items() if key not in base]
        added_blocks = sorted({p.block for p in added if p.block is not None})
        blocks = next_block + k * len(added_blocks)
        if blocks > MAX_BLOCKS:  # each block is laid out: a bound on the time, not the memory
            raise TooLarge(f"{name_}={getattr(cfg, name_):,}: {blocks:,} blocks, past the "
                           f"{MAX_BLOCKS:,} the memory plan lays out (the deepest models "
                           "trained have a few hundred)")
        for _ in range(k):
            renumber = {b: next_block + j for j, b in enumerate(added_blocks)}
            params += [Param(p.shape, p.role, renumber.get(p.block)) for p in added]
            next_block += len(added_blocks)
        buffers += k * (more_buffers - buffers)
    return Layout(tuple(params), buffers)


def _params(name: str, overrides: dict) -> tuple[dict, int]:
    try:
        model = build(name, device="meta", **overrides)
    except (RuntimeError, TypeError) as e:
        # "Storage size calculation overflowed with sizes=[...]"; a size past int64 is a
        # TypeError ("Overflow when unpacking long long")
        if "overflow" not in str(e).lower():
            raise
        raise TooLarge(f"{name}: a weight has more elements than a tensor can hold "
                       f"({str(e).splitlines()[0]})") from None
    roles = model.param_roles()
    out = {}
    for key, p in model.named_parameters():  # a tied weight once
        parts = key.split(".")
        block = int(parts[1]) if parts[0] == "blocks" else None
        out[key] = Param(tuple(p.shape), roles[key], block)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return out, buffers


def refuse_unfit(name: str, overrides: dict, params: int, needed: int, what: str,
                 device, note: str = "") -> None:
    """TooLarge, one line, when `needed` bytes (`what`: what they hold) pass the memory of
    `device` (longpack.archs.limits.device_memory; an unknown one is not checked)."""
    have = device_memory(device)
    if have is not None and needed > have:
        raise TooLarge(f"{_described(name, overrides)}: {params:,} parameters; {what} need "
                       f"{needed / 2**30:,.1f} GiB and {torch.device(device or 'cpu')} has "
                       f"{have / 2**30:,.1f} GiB of memory{note}")


def _described(name: str, overrides: dict) -> str:
    return name + "".join(f" {k}={v}" for k, v in overrides.items())


def list_models(seq: int = LIST_SEQ, vocab_size: int | None = None,
                per_vocab: bool = True) -> list[dict]:
    """Every preset's true size at `vocab_size` (None: each preset's own; a build trains at its
    tokenizer's vocab_size), FLOPs/token at `seq`, and what one more vocabulary entry adds
    (`per_vocab_entry`: the embedding row and the untied head row, as the family counts them),
    measured by building the preset at vocab_size + 1 too. Every size is linear in the
    vocabulary, so torch-free readers of presets.json (`pack stats`) get any vocabulary's sizes
    as size + per_vocab_entry * (V - vocab_size); tests check that against real builds."""
    out = []
    for name, family in PRESETS.items():
        vocab = config(name).vocab_size if vocab_size is None else vocab_size
        sizes = _sizes(name, vocab, seq)
        out.append({"name": name, "family": family, "vocab_size": vocab, **sizes, "seq": seq})
        if per_vocab:  # `per_vocab=False`: a table's sizes only, half the measuring
            more = _sizes(name, vocab + 1, seq)
            out[-1]["per_vocab_entry"] = {k: more[k] - sizes[k] for k in sizes}
    return out


def _sizes(name: str, vocab_size: int, seq: int) -> dict:
    return dict(_sizes_once(name, vocab_size, seq))


@functools.lru_cache(maxsize=1024)
def _sizes_once(name: str, vocab_size: int, seq: int) -> tuple:
    """A preset's sizes, counted once per process: a table is ~30 of them, and zoo list,
    train --list-models and the plan ask again."""
    model = build(name, device="meta", vocab_size=vocab_size)
    params = model.num_params()
    active = model.active_params() if hasattr(model, "active_params") else params
    return (("params", params), ("active_params", active),
            ("flops_per_token", model.flops_per_token(seq)))


def save(model: torch.nn.Module, folder: Path) -> None:
    """FOLDER/config.json ({"family", "config"}: the family's config dataclass, every field) and
    FOLDER/model.safetensors: what `load` reads, for any family."""
    from safetensors.torch import save_file

    family = next(f for f, (_, model_cls, _) in FAMILIES.items() if isinstance(model, model_cls))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(
        {"family": family, "config": asdict(model.cfg)}, indent=2) + "\n")
    weights = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


def load(folder: Path, device: str | torch.device | None = None) -> torch.nn.Module:
    """The model `save` wrote, its weights loaded, in eval mode."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = json.loads((folder / "config.json").read_text())
    model = build(meta["family"], device=device, **meta["config"])
    model.load_state_dict(load_file(str(folder / "model.safetensors"),
                                    device=str(device or "cpu")))
    return model.eval()


# Names of archs' other modules, loaded on first use: what the trainer and the zoo take from
# here (never from the modules): the memory plan, generation, transformers' forms.
_ELSEWHERE = {
    "Documents": "documents", "spans_of": "documents",  # a batch's documents, once per forward
    "GIB": "memory", "Sharding": "memory", "memory_plan": "memory", "bytes_text": "memory",
    "TextStream": "generate", "context": "generate", "stream": "generate",
    "NATIVE": "hf.native",  # transformers' own classes: config.json and weights of a model
    "ARCHS": "hf.hf_remote", "remote_config": "hf.hf_remote", "remote_weights": "hf.hf_remote",
    "ship_code": "hf.hf_remote", "shipped_files": "hf.hf_remote",  # the code other families ship
    "staged": "hf.hf_folder", "refuse_taken": "hf.hf_folder", "set_modes": "hf.hf_folder",
    "layout_problems": "hf.hf_folder", "special_token_ids": "hf.hf_folder",
    "write_weights": "hf.hf_folder", "write_tokenizer": "hf.hf_folder",
    "write_generation_config": "hf.hf_folder", "converted_tiktoken": "hf.hf_folder",
    "read_folder": "hf.hf_import", "is_model_folder": "hf.hf_import",  # a transformers folder in
    "tokenizer_json_vocabulary": "hf.hf_import",
}

__getattr__ = lazy_names(__name__, _ELSEWHERE)
