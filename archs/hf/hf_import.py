"""A model folder as archs' weights: what `train --init-from DIR` starts from when DIR is a
transformers model (training/init_from.py checks it against the run and loads it), the
inverse of hf_export.py.

    folder = read_folder(Path("pythia-160m"))   # config.json and the safetensors' headers only
    folder.family, folder.config                # archs' family and its config's fields
    folder.shapes                               # archs' name -> shape, nothing read yet
    folder.extra                                # the folder's tensors archs has no place for
    folder.weights()                            # archs' name -> tensor (CPU), read now
    tokenizer_json_vocabulary(text)             # id -> token, to hold it to a build's

The folders it reads, by config.json:
- `model_type: gpt_neox` (GPTNeoXForCausalLM: Pythia, GPT-NeoX, longpack's own GPT-NeoX
  exports): archs/hf/native.py's name tables read backwards, the fused qkv laid out back from heads x
  [q, k, v] to [q | k | v] x heads. What archs' GPT-NeoX does not compute is refused, one
  reason at a time: another activation than GELU (erf), a sequential residual, attention
  without biases, a tied head, rope scaling, a rotary share that does not rotate an even
  number of features. The rotary base is `rotary_emb_base` (what transformers 4.x reads) or
  `rope_theta` (later ones); two different values are refused. The attention's masks and
  rotary tables that older saves hold as buffers (`attention.bias`, `masked_bias`,
  `rotary_emb.inv_freq`) are no weights and are passed over.
- `model_type: mamba2` (Mamba2ForCausalLM): mamba2_state_dict read backwards, the
  convolution's taps reversed again; the options archs does not compute are refused
  (projection biases, no convolution bias, a LayerNorm, another activation, a time-step
  limit). `lm_head.weight` is archs' `head.weight`: absent, equal to the embedding (what zoo
  export writes) or with tie_word_embeddings true (transformers then ties it, and so do we)
  the model is tied; a head of its own (transformers' default) gives `tie_embeddings false`.
- `model_type: longpack` (LongpackForCausalLM: MoE, hybrids, resonance): the family and its
  config's fields are config.json's (configuration_longpack's names), the weights archs' own
  names after `model.` (a tied head left out, as remote_weights writes it: the caller fills
  a tied weight from its twin).
- `{"family", "config"}` (`zoo export --to safetensors`, `archs.save`): archs' names as they are.

Only safetensors are read: `model.safetensors`, or the shards `model.safetensors.index.json`
names (plain file names in the folder), through the safetensors library, which parses a JSON
header and copies bytes, so nothing in the folder runs. A folder that holds its weights only
as `pytorch_model.bin` (a pickle) is refused without opening it. Every problem is a ValueError
of one line, which the caller puts after the folder's name.
"""

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from longpack import archs

from .native import NEOX_BLOCK_NAMES, NEOX_NAMES

INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.bin")
# buffers older GPTNeoXForCausalLM saves hold beside the weights: masks and rotary tables
NEOX_BUFFERS = re.compile(r"gpt_neox\.(layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\."
                          r"inv_freq)|rotary_emb\.inv_freq)")


@dataclass
class Folder:
    """A model folder read as far as its headers (read_folder)."""
    path: Path
    kind: str  # the class it is, in words: "GPTNeoXForCausalLM", "LongpackForCausalLM (moe)"
    family: str  # archs' family
    config: dict  # archs config fields the folder gives (vocab_size among them)
    shapes: dict[str, tuple[int, ...]]  # archs' name -> the shape it will have
    extra: list[str] = field(default_factory=list)  # the folder's tensors archs has none of
    sources: dict = field(default_factory=dict)  # archs' name -> (file, their name, convert)

    def weights(self) -> dict[str, torch.Tensor]:
        """Every weight under archs' name, on the CPU, in the dtype it was saved in."""
        from safetensors import safe_open

        out, by_file = {}, {}
        for ours, (file, theirs, convert) in self.sources.items():
            by_file.setdefault(file, []).append((ours, theirs, convert))
        for file, items in sorted(by_file.items()):
            try:
                with safe_open(str(self.path / file), framework="pt") as f:
                    for ours, theirs, convert in items:
                        out[ours] = convert(f.get_tensor(theirs))
            except Exception as e:  # SafetensorError: short or damaged past its header
                raise ValueError(f"{file} cannot be read ({_line(e)})") from None
        return out


def is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def read_folder(path: Path) -> Folder:
    """The folder's config and its weights' names and shapes (module docstring); ValueError."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"its config.json is not JSON ({_line(e)})") from None
    if not isinstance(config, dict):
        raise ValueError("its config.json is not a JSON object")
    tensors = _headers(path)
    if "family" in config and isinstance(config.get("config"), dict):
        return _archs_folder(path, config, tensors)
    kind = config.get("model_type")
    if kind == "gpt_neox":
        return _neox(path, config, tensors)
    if kind == "mamba2":
        return _mamba2(path, config, tensors)
    if kind == "longpack":
        return _longpack(path, config, tensors)
    arch = ", ".join(config.get("architectures") or []) or f"model_type {kind!r}"
    raise ValueError(f"it holds a {arch}, which longpack does not start from (it reads "
                     "GPTNeoXForCausalLM, Mamba2ForCausalLM and the folders zoo export writes)")


def _headers(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """their name -> (file, shape), from the safetensors headers alone."""
    from safetensors import safe_open

    if (path / INDEX).is_file():
        try:
            weight_map = json.loads((path / INDEX).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError,
                AttributeError) as e:
            raise ValueError(f"its {INDEX} is not a safetensors index ({_line(e)})") from None
        bad = [f for f in files if not isinstance(f, str) or Path(f).name != f
               or f.startswith(".") or not f.endswith(".safetensors")]
        if bad:
            raise ValueError(f"its {INDEX} names {bad[0]!r}, which is not a safetensors file "
                             "of the folder")
    elif (path / "model.safetensors").is_file():
        weight_map, files = None, ["model.safetensors"]
    else:
        pickled = [name for name in PICKLES if (path / name).is_file()]
        if pickled:
            raise ValueError(f"its weights are {pickled[0]}, a pickle, which is never read "
                             "(loading one can run any code): save them as safetensors where "
                             "you trust the file (model.save_pretrained(DIR) writes them)")
        raise ValueError("it holds no model.safetensors (nor an index of shards)")
    out = {}
    for file in files:
        if not (path / file).is_file():
            raise ValueError(f"{file}, which {INDEX} names, is missing")
        try:
            with safe_open(str(path / file), framework="pt") as f:
                for name in f.keys():
                    out[name] = (file, tuple(f.get_slice(name).get_shape()))
        except Exception as e:  # SafetensorError: not safetensors (a pickle), damaged
            raise ValueError(f"{file} is not a safetensors file ({_line(e)}); nothing in it "
                             "was run") from None
    if weight_map is not None:
        lost = sorted(n for n, file in weight_map.items() if out.get(n, (file,))[0] != file)
        if lost:
            raise ValueError(f"{lost[0]} is not in {weight_map[lost[0]]}, where {INDEX} says "
                             "it is")
    return out


def _line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _same(t):
    return t


def _folder(path, kind, family, config, tensors, rename, convert=None, ignored=None) -> Folder:
    """A Folder whose tensors `rename` maps to archs' names (None: none of archs'), each
    through `convert[ours]` where it has one, its shape as that conversion gives it."""
    convert = convert or {}
    folder = Folder(path, kind, family, config, {})
    for theirs, (file, shape) in sorted(tensors.items()):
        ours = rename(theirs)
        if ours is None:
            if not (ignored and ignored.fullmatch(theirs)):
                folder.extra.append(theirs)
            continue
        fn = convert.get(ours, _same)
        folder.sources[ours] = (file, theirs, fn)
        try:  # the layout archs' tensor takes, worked out on a tensor without memory
            folder.shapes[ours] = tuple(fn(torch.empty(shape, device="meta")).shape)
        except (RuntimeError, IndexError) as e:
            raise ValueError(f"its {theirs} has the shape {list(shape)}, from which archs' "
                             f"{ours} cannot be laid out ({_line(e)})") from None
    return folder


def _archs_config(family: str, values: dict) -> dict:
    """The family config's fields among `values` (what a folder gives), checked by the config
    itself (ValueError naming the field)."""
    cls = archs.FAMILIES[family][0]
    known = {f.name for f in fields(cls)}
    given = {k: v for k, v in values.items() if k in known}
    try:
        archs.config(family, **given)
    except (TypeError, ValueError) as e:
        raise ValueError(f"its config.json gives a {family} that archs cannot build "
                         f"({_line(e)})") from None
    return given


def _refuse(config: dict, wanted: dict, kind: str) -> None:
    """ValueError for the first of config.json's settings that archs does not compute as it."""
    for key, (default, good, what) in wanted.items():
        value = config.get(key, default)
        if value not in good:
            raise ValueError(f"its config.json has {key} {json.dumps(value)}: archs' {kind} "
                             f"computes {what} only")


# -- GPTNeoXForCausalLM --------------------------------------------------------------------

def _neox(path: Path, config: dict, tensors: dict) -> Folder:
    _refuse(config, {"hidden_act": ("gelu", ("gelu",), "GELU (erf), hidden_act gelu"),
                     "use_parallel_residual": (True, (True,), "the parallel residual"),
                     "attention_bias": (True, (True,), "attention with biases"),
                     "tie_word_embeddings": (False, (False,), "a head apart from the "
                                                              "embedding"),
                     "rope_scaling": (None, (None,), "rotary without scaling")}, "GPT-NeoX")
    base = rotary_base(config)
    try:
        d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        pct = float(config.get("rotary_pct", config.get("partial_rotary_factor", 0.25)))
        values = {"vocab_size": config["vocab_size"], "d_model": d,
                  "n_layers": config["num_hidden_layers"], "n_heads": heads,
                  "d_ff": config["intermediate_size"],
                  "max_seq": config.get("max_position_embeddings", 2048),
                  "rotary_pct": pct, "rotary_base": float(base),
                  "norm_eps": float(config.get("layer_norm_eps", 1e-5)),
                  "init_std": float(config.get("initializer_range", 0.02))}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"its config.json is not a GPT-NeoX's ({_line(e)} missing or not a "
                         "number)") from None
    if heads > 0 and d % heads == 0 and int(d // heads * pct) % 2:
        raise ValueError(f"its rotary_pct {pct} rotates {int(d // heads * pct)} features of "
                         "each head, an odd number, which archs' rotary (pairs of features) "
                         "does not do")
    values = _archs_config("gpt-neox", values)
    inverse = {theirs: ours for ours, theirs in NEOX_NAMES.items()}
    block = {theirs: ours for ours, theirs in NEOX_BLOCK_NAMES.items()}

    def rename(theirs):
        if theirs in inverse:
            return inverse[theirs]
        m = re.fullmatch(r"gpt_neox\.layers\.(\d+)\.(.+)\.(weight|bias)", theirs)
        if m and m.group(2) in block:
            return f"blocks.{m.group(1)}.{block[m.group(2)]}.{m.group(3)}"
        return None

    convert = {}
    for i in range(int(values["n_layers"])):
        for kind in ("weight", "bias"):
            convert[f"blocks.{i}.attn.qkv.{kind}"] = lambda t: qkv_from_hf(t, heads)
    return _folder(path, "GPTNeoXForCausalLM", "gpt-neox", values, tensors, rename, convert,
                   NEOX_BUFFERS)


def rotary_base(config: dict) -> float:
    """A GPT-NeoX config.json's rotary base: rotary_emb_base (transformers 4.x) or rope_theta
    (or rope_parameters' rope_theta), the same value where several are given; 10000 where
    none is, transformers' default."""
    given = {k: config[k] for k in ("rotary_emb_base", "rope_theta") if config.get(k) is not None}
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        given["rope_parameters.rope_theta"] = params["rope_theta"]
    if len(set(given.values())) > 1:
        raise ValueError("its config.json gives two rotary bases ("
                         + ", ".join(f"{k} {v}" for k, v in given.items()) + "): make them one")
    return next(iter(given.values()), 10000.0)


def qkv_from_hf(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """hf_export.qkv_to_hf backwards: heads x [q, k, v] x head_dim -> [q | k | v] x heads x
    head_dim."""
    return t.reshape(n_heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


# -- Mamba2ForCausalLM ---------------------------------------------------------------------

MAMBA2_MIXER = ("in_proj.weight", "out_proj.weight", "dt_bias", "A_log", "D", "conv1d.bias")


def _mamba2(path: Path, config: dict, tensors: dict) -> Folder:
    _refuse(config, {"hidden_act": ("silu", ("silu",), "SiLU, hidden_act silu"),
                     "rms_norm": (True, (True,), "RMSNorms, rms_norm true"),
                     "use_bias": (False, (False,), "projections without biases"),
                     "use_conv_bias": (True, (True,), "a convolution with its bias"),
                     "time_step_limit": ([0.0, float("inf")], ([0.0, float("inf")],
                                                               (0.0, float("inf"))),
                                         "an unclamped time step, time_step_limit [0, inf]")},
            "Mamba")
    try:
        d, expand = int(config["hidden_size"]), int(config.get("expand", 2))
        head_dim = int(config.get("head_dim", 64))
        values = {"vocab_size": config["vocab_size"], "d_model": d,
                  "n_layers": config["num_hidden_layers"], "d_state": config["state_size"],
                  "expand": expand, "head_dim": head_dim, "n_groups": config.get("n_groups", 1),
                  "conv_width": config.get("conv_kernel", 4),
                  "chunk": config.get("chunk_size", 256),
                  "max_seq": config.get("max_position_embeddings", 32768),
                  "dt_min": float(config.get("time_step_min", 0.001)),
                  "dt_max": float(config.get("time_step_max", 0.1)),
                  "norm_eps": float(config.get("layer_norm_epsilon", 1e-5)),
                  "init_std": float(config.get("initializer_range", 0.02))}
        heads = config.get("num_heads", expand * d // head_dim)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"its config.json is not a Mamba-2's ({_line(e)} missing or not a "
                         "number)") from None
    if heads * head_dim != expand * d:
        raise ValueError(f"its config.json has num_heads {heads} x head_dim {head_dim}, not "
                         f"expand x hidden_size ({expand * d}): archs' Mamba has heads of the "
                         "whole inner width")
    values["tie_embeddings"] = tied = _mamba2_tied(path, config, tensors)
    if tied and config.get("tie_word_embeddings") is True:  # transformers ties the head to the
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}  # embedding
    values = _archs_config("mamba", values)

    def rename(theirs):
        top = {"backbone.embeddings.weight": "embed.weight",
               "backbone.norm_f.weight": "norm_f.weight", "lm_head.weight": "head.weight"}
        if theirs in top:
            return top[theirs]
        m = re.fullmatch(r"backbone\.layers\.(\d+)\.(.+)", theirs)
        if not m:
            return None
        i, rest = m.groups()
        if rest == "norm.weight":
            return f"blocks.{i}.norm"
        if rest == "mixer.norm.weight":
            return f"blocks.{i}.mixer.norm"
        if rest == "mixer.conv1d.weight":
            return f"blocks.{i}.mixer.conv.weight"
        if rest.startswith("mixer.") and rest[6:] in MAMBA2_MIXER:
            return f"blocks.{i}.mixer.{rest[6:].replace('conv1d', 'conv')}"
        return None

    # (channels, 1, width) -> (width, channels), taps reversed back (mamba2_state_dict)
    convert = {f"blocks.{i}.mixer.conv.weight": lambda t: t[:, 0].t().flip(0).contiguous()
               for i in range(int(values["n_layers"]))}
    return _folder(path, "Mamba2ForCausalLM", "mamba", values, tensors, rename, convert)


def _mamba2_tied(path: Path, config: dict, tensors: dict) -> bool:
    """Whether the folder's output head is its embedding: tie_word_embeddings true, or no
    lm_head.weight, or one equal to the embedding (zoo export writes such a copy with
    tie_word_embeddings false, as transformers cannot save a Mamba2's tied pair); a head of
    its own otherwise (transformers' default Mamba2ForCausalLM). Reads those two tensors."""
    head, embedding = "lm_head.weight", "backbone.embeddings.weight"
    if config.get("tie_word_embeddings") is True or head not in tensors:
        return True
    if embedding not in tensors or tensors[head][1] != tensors[embedding][1]:
        return False
    from safetensors import safe_open

    pair = []
    for name in (head, embedding):
        file = tensors[name][0]
        try:
            with safe_open(str(path / file), framework="pt") as f:
                pair.append(f.get_tensor(name))
        except Exception as e:  # SafetensorError: short or damaged past its header
            raise ValueError(f"{file} cannot be read ({_line(e)})") from None
    return torch.equal(*pair)


# -- longpack's own exports ----------------------------------------------------------------

def _longpack(path: Path, config: dict, tensors: dict) -> Folder:
    """LongpackForCausalLM (hf_remote.py): the family and its fields in config.json."""
    from longpack.archs.hf.transformers_compat import import_transformers

    family = config.get("family")
    if family not in archs.FAMILIES:
        raise ValueError(f"its config.json names the family {family!r}, which archs does not "
                         f"have ({', '.join(archs.FAMILIES)})")
    try:
        import_transformers()
        from longpack.archs.hf.configuration_longpack import CONFIG_NAMES
    except ImportError:  # the stored names are configuration_longpack's, a transformers config
        from longpack.core import install_hint

        raise ValueError(f"reading a LongpackForCausalLM folder needs transformers: "
                         f"{install_hint('export')}") from None
    stored = {CONFIG_NAMES.get(f.name, f.name): f.name
              for f in fields(archs.FAMILIES[family][0])}
    values = _archs_config(family, {stored[k]: v for k, v in config.items() if k in stored})
    return _folder(path, f"LongpackForCausalLM ({family})", family, values, tensors,
                   lambda theirs: theirs[6:] if theirs.startswith("model.") else None)


def _archs_folder(path: Path, config: dict, tensors: dict) -> Folder:
    """`zoo export --to safetensors` (archs.save): archs' names as they are."""
    family = config["family"]
    if family not in archs.FAMILIES:
        raise ValueError(f"its config.json names the family {family!r}, which archs does not "
                         f"have ({', '.join(archs.FAMILIES)})")
    values = _archs_config(family, config["config"])
    return _folder(path, f"archs safetensors ({family})", family, values, tensors,
                   lambda theirs: theirs)


def tokenizer_json_vocabulary(text: str) -> dict[int, str]:
    """id -> token of a tokenizer.json's text: its model's vocabulary (a dict for BPE,
    WordPiece and WordLevel, a list of [piece, score] for Unigram) and its added tokens;
    ValueError when it is not one."""
    try:
        data = json.loads(text)
        vocab = (data.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            out = {int(i): str(t) for t, i in vocab.items()}
        elif isinstance(vocab, list):
            out = {i: str(e[0] if isinstance(e, list) else e) for i, e in enumerate(vocab)}
        else:
            out = {}
        for added in data.get("added_tokens") or ():
            out[int(added["id"])] = str(added["content"])
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{type(e).__name__}: {_line(e)}") from None
    return out
