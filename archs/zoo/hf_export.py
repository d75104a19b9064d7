"""`zoo export RUN --to hf`: a folder transformers loads and the Hugging Face hub takes as it
is, for every family.

    notes = export_hf(load_run(run), Path("hf-x"), license="apache-2.0", max_shard_size="5GB")

- GPT-NeoX: transformers' own `GPTNeoXForCausalLM` (`from_pretrained(DIR)`): config.json
  (model_type gpt_neox, parallel residual, the rotary share and base, untied embeddings) and
  the weights under transformers' names. The one layout that differs is attention's fused qkv:
  longpack's rows are [q | k | v], each heads x head_dim; Hugging Face's are heads x [q, k, v].
  GPT-NeoX's rotary (pairs i, i + rot/2 of the first rot features of each head), GELU (erf),
  LayerNorms and biases are the same computation in both, so the logits agree to float32
  rounding.
- Mamba: transformers' own `Mamba2ForCausalLM` (`from_pretrained(DIR)`, no remote code):
  config.json (model_type mamba2: widths, state, heads, groups, kernel, chunk, eps, no
  projection biases, a convolution bias) and the weights under transformers' names. Every
  weight has its place: in_proj's output is [z | x B C | dt] in both; conv1d is the depthwise
  convolution over x B C with its bias, its taps reversed (archs' tap j multiplies the input j
  tokens back, conv1d's kernel runs the other way); dt_bias, A_log and D are per head; the
  gated RMSNorm (the gate before the norm, over the whole inner width, as both compute it for
  any n_groups), the pre-norms and the final norm are RMSNorms of weights only. The chunked
  scan is the same sum in another order: the logits agree to float32 rounding, for any chunk
  and group count. What only initializes (A_log's and dt's starting ranges) does not matter to
  an export; time_step_limit stays transformers' default, no limit, as archs' dt (a softplus,
  unclamped) has none. The head, archs' embedding, is written as `lm_head.weight` beside it,
  untied (tie_word_embeddings false): transformers 4.x's Mamba2ForCausalLM ties a tied head
  when it loads but lists no tied weights, so its save_pretrained refuses the shared tensor
  (tests/test_export_families.py); two equal copies give the same logits and save again.
- MoE (hybrids included) and resonance: archs' own model files under a thin PreTrainedModel,
  `from_pretrained(DIR, trust_remote_code=True)` (archs/zoo/hf_remote.py).

Every folder also holds the build's tokenizer (archs/zoo/runs.py loads it from the build's copy;
`zoo export` refuses to write a folder without it unless --no-tokenizer), generation_config.json,
special_tokens_map.json and a model card (README.md); the weights are safetensors, sharded past
`max_shard_size` with an index; files 0644, folders 0755, nothing hidden (archs/zoo/
hf_folder.py). `max_position_embeddings` is the model's context: the longer of its `max_seq`
and the rows it trained on (a tiny preset's max_seq is 256; a run may train on 1,024-token
rows). The folder appears whole or not at all.
"""

import json
import re
from pathlib import Path

import torch

import archs
from archs.zoo.hf_folder import (
    layout_problems,
    set_modes,
    staged,
    token_ids,
    write_generation_config,
    write_tokenizer,
    write_weights,
)
from archs.zoo.hf_remote import ARCHS, remote_config, remote_weights, ship_code, shipped_files
from archs.zoo.model_card import model_card
from archs.zoo.transformers_compat import import_transformers
from longpack import TrainingError

DEFAULT_LICENSE = "other"  # the weights' terms follow the data's: the user says (--license)
LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]*")  # the hub's license ids: apache-2.0, cc-by-4.0, ...


# zoo export --dtype -> the weights' torch dtype and config.json's torch_dtype
DTYPES = {"fp32": (torch.float32, "float32"), "bf16": (torch.bfloat16, "bfloat16"),
          "fp16": (torch.float16, "float16")}


def export_hf(trained, out: Path, license: str = DEFAULT_LICENSE,
              max_shard_size: int | str = "5GB", dtype: str = "fp32") -> list[str]:
    """Write the folder, its floating-point weights as `dtype` (DTYPES); returns notes for the
    user (what could not be written)."""
    if not LICENSE.fullmatch(license):
        raise TrainingError(f"--license {license!r}: give a license id as the hub lists them "
                            "(apache-2.0, mit, cc-by-4.0, other, ...), lowercase")
    model = trained.model
    context = max(model.cfg.max_seq, trained.seq or 0)
    ids = token_ids(trained.tokenizer, trained.trained_on)
    native = NATIVE.get(type(model))
    with staged(out) as folder:
        if native:
            config_of, weights_of = native
            config, weights, code = config_of(model, ids, context), weights_of(model), []
        else:
            config, weights = remote_config(model, context, ids), remote_weights(model)
            code = sorted(n for n, source in shipped_files().items() if source.parent == ARCHS)
            ship_code(folder)
        torch_dtype, config["torch_dtype"] = DTYPES[dtype]
        weights = {k: v.to(torch_dtype) if v.is_floating_point() else v
                   for k, v in weights.items()}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        write_weights(weights, folder, max_shard_size)
        write_generation_config(folder, ids)
        if trained.tokenizer is not None:
            write_tokenizer(trained.tokenizer, folder, context)
        name = Path(out).absolute().name
        (folder / "README.md").write_text(model_card(trained, name, license, context, code))
        set_modes(folder)
        problems = layout_problems(folder)
        if problems:  # a bug here, not the user's: say what
            raise TrainingError(f"zoo export wrote a folder the hub would not take whole: "
                                f"{'; '.join(problems)}")
    if trained.tokenizer is None:  # asked for (zoo export --no-tokenizer refuses otherwise)
        why = getattr(trained, "tokenizer_problem", None)
        return [f"no tokenizer written{f' ({why})' if why else ''}: copy the build's "
                "tokenizer.json (or convert its .tiktoken file with "
                "transformers.integrations.tiktoken.convert_tiktoken_to_fast) into the folder"]
    return []


# archs' GPT-NeoX names -> GPTNeoXForCausalLM's: the model's own, then a block's (under
# blocks.N. and gpt_neox.layers.N.), each with its weight and bias; the fused qkv is laid out
# anew (qkv_to_hf). archs/zoo/hf_import.py reads these tables backwards.
NEOX_NAMES = {"embed.weight": "gpt_neox.embed_in.weight",
              "ln_f.weight": "gpt_neox.final_layer_norm.weight",
              "ln_f.bias": "gpt_neox.final_layer_norm.bias", "head.weight": "embed_out.weight"}
NEOX_BLOCK_NAMES = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
                    "attn.qkv": "attention.query_key_value", "attn.out": "attention.dense",
                    "fc_in": "mlp.dense_h_to_4h", "fc_out": "mlp.dense_4h_to_h"}


def qkv_to_hf(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The fused qkv weight (3 d, d) or bias (3 d): [q | k | v] x heads x head_dim (archs) ->
    heads x [q, k, v] x head_dim (transformers)."""
    return t.reshape(3, n_heads, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """GPT-NeoX weights under transformers' GPTNeoXForCausalLM names."""
    cfg = model.cfg
    ours = model.state_dict()
    out = {theirs: ours[name] for name, theirs in NEOX_NAMES.items()}
    for i in range(cfg.n_layers):
        for ours_name, theirs in NEOX_BLOCK_NAMES.items():
            for kind in ("weight", "bias"):
                t = ours[f"blocks.{i}.{ours_name}.{kind}"]
                if ours_name == "attn.qkv":
                    t = qkv_to_hf(t, cfg.n_heads)
                out[f"gpt_neox.layers.{i}.{theirs}.{kind}"] = t
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def hf_config(model, ids: dict, context: int) -> dict:
    cfg = model.cfg
    head_dim = cfg.d_model // cfg.n_heads
    rotary = int(head_dim * cfg.rotary_pct) // 2 * 2  # what archs/gpt_neox.py rotates
    return {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff, "hidden_act": "gelu",
            # the base under both names: transformers 4.x reads rotary_emb_base (and sets
            # rope_theta from it), later versions rope_theta
            "rotary_pct": rotary / head_dim, "rotary_emb_base": cfg.rotary_base,
            "rope_theta": cfg.rotary_base,
            "max_position_embeddings": context, "layer_norm_eps": cfg.norm_eps,
            "use_parallel_residual": True, "tie_word_embeddings": False,
            "attention_bias": True, "initializer_range": cfg.init_std, "use_cache": True,
            **ids, "torch_dtype": "float32",
            "transformers_version": import_transformers().__version__}


def mamba2_state_dict(model) -> dict[str, torch.Tensor]:
    """Mamba weights under transformers' Mamba2ForCausalLM names; the head, archs' embedding,
    as a copy of its own (module docstring)."""
    ours = model.state_dict()
    out = {"backbone.embeddings.weight": ours["embed.weight"],
           "backbone.norm_f.weight": ours["norm_f.weight"], "lm_head.weight": ours["head.weight"]}
    for i in range(model.cfg.n_layers):
        a, b = f"blocks.{i}.", f"backbone.layers.{i}."
        out[b + "norm.weight"] = ours[a + "norm"]
        out[b + "mixer.norm.weight"] = ours[a + "mixer.norm"]
        # (width, channels) -> (channels, 1, width), taps reversed: archs' tap j multiplies the
        # input j tokens back, conv1d's last tap the current one
        out[b + "mixer.conv1d.weight"] = ours[a + "mixer.conv.weight"].flip(0).t()[:, None]
        out[b + "mixer.conv1d.bias"] = ours[a + "mixer.conv.bias"]
        for name in ("in_proj.weight", "out_proj.weight", "dt_bias", "A_log", "D"):
            out[b + "mixer." + name] = ours[a + "mixer." + name]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def mamba2_config(model, ids: dict, context: int) -> dict:
    """config.json of transformers' Mamba2ForCausalLM. `max_position_embeddings` is not a
    bound of Mamba's (its state has one size however long the text), but the context it
    trained for, as for the other families (the tokenizer's model_max_length too)."""
    cfg = model.cfg
    inner = cfg.expand * cfg.d_model
    return {"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers, "state_size": cfg.d_state, "expand": cfg.expand,
            "head_dim": cfg.head_dim, "num_heads": inner // cfg.head_dim,
            "n_groups": cfg.n_groups, "conv_kernel": cfg.conv_width, "chunk_size": cfg.chunk,
            "layer_norm_epsilon": cfg.norm_eps, "rms_norm": True, "hidden_act": "silu",
            "use_bias": False, "use_conv_bias": True, "residual_in_fp32": True,
            "time_step_min": cfg.dt_min, "time_step_max": cfg.dt_max,
            "initializer_range": cfg.init_std, "tie_word_embeddings": False,
            "max_position_embeddings": context, "use_cache": True, **ids,
            "torch_dtype": "float32", "transformers_version": import_transformers().__version__}


# model class -> (its config.json, its weights) for the families transformers has a class of
NATIVE = {archs.gpt_neox.GPTNeoX: (hf_config, hf_state_dict),
          archs.mamba.Mamba: (mamba2_config, mamba2_state_dict)}
