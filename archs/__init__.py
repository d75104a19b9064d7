"""longpack's model zoo: each architecture in one file, registered here by name with presets.

    archs.list_models(vocab_size=None)  -> [{name, family, vocab_size, params, active_params,
                                            flops_per_token, seq, per_vocab_entry}, ...]
    archs.build("neox-tiny")            -> nn.Module; model(input_ids, doc_starts=None) -> logits
    archs.build("gpt-neox", n_layers=4) -> the family's default config with overrides
    archs.save(model, DIR); archs.load(DIR) -> config.json (family + config) + model.safetensors

Every model has `loss(input_ids, targets, doc_starts=None) -> {"loss", "ce", "aux"}`,
`num_params()`, `flops_per_token(seq)` and `param_roles()` (each parameter's role, which
training/optim.py groups by; MoE also `active_params()`).

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

__main__.py prints the presets (`python -m archs`) and writes presets.json, which torch-free
code (pack stats' recommendations) reads.
"""

import json
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch

from archs import gpt_neox, mamba, moe, resonance

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
    the field's default's type. ValueError naming the key (and, unknown, the valid ones)."""
    defaults = {f.name: getattr(config(name), f.name) for f in fields(config(name))}
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"{pair!r}: give KEY=VALUE")
        if key not in defaults:
            raise ValueError(f"{key!r} is not a setting of {name}; its settings: "
                             f"{', '.join(defaults)}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        out[key] = _typed(key, value, defaults[key])
    return out


def _typed(key: str, value, default):
    """`value` as the field's type (a whole number where a float goes is one)."""
    if isinstance(default, bool) or default is None:
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"{key}: {value!r} is not true or false")
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, type(default)) or isinstance(value, bool):
        raise ValueError(f"{key}: {value!r} is not a {type(default).__name__}")
    return value


def build(name: str, device: str | torch.device | None = None, **overrides) -> torch.nn.Module:
    """`device="meta"` builds without allocating (so a 5B preset can be counted anywhere)."""
    cfg = config(name, **overrides)
    family = name if name in FAMILIES else PRESETS[name]
    with torch.device(device or "cpu"):
        return FAMILIES[family][1](cfg)


def list_models(seq: int = LIST_SEQ, vocab_size: int | None = None) -> list[dict]:
    """Every preset's true size at `vocab_size` (None: each preset's own; a build trains at its
    tokenizer's vocab_size), FLOPs/token at `seq`, and what one more vocabulary entry adds
    (`per_vocab_entry`: the embedding row and the untied head row, as the family counts them),
    measured by building the preset at vocab_size + 1 too. Every size is linear in the
    vocabulary, so torch-free readers of presets.json (`pack stats`) get any vocabulary's sizes
    as size + per_vocab_entry * (V - vocab_size); tests check that against real builds."""
    out = []
    for name, family in PRESETS.items():
        vocab = config(name).vocab_size if vocab_size is None else vocab_size
        sizes, more = _sizes(name, vocab, seq), _sizes(name, vocab + 1, seq)
        out.append({"name": name, "family": family, "vocab_size": vocab, **sizes, "seq": seq,
                    "per_vocab_entry": {k: more[k] - sizes[k] for k in sizes}})
    return out


def _sizes(name: str, vocab_size: int, seq: int) -> dict:
    model = build(name, device="meta", vocab_size=vocab_size)
    params = model.num_params()
    active = model.active_params() if hasattr(model, "active_params") else params
    return {"params": params, "active_params": active, "flops_per_token": model.flops_per_token(seq)}


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
