"""A model of a family transformers has its own class for, in that class's layout: config.json
and the weights under its names (GPT-NeoX as GPTNeoXForCausalLM, Mamba as Mamba2ForCausalLM;
the layouts are described in longpack/zoo/hf_export.py, which writes them). hf_import.py reads
these tables backwards. A model only: what a run adds (its tokenizer, the card) is the zoo's.
"""

import torch

from ..gpt_neox import GPTNeoX
from ..mamba import Mamba
from .transformers_compat import import_transformers

# archs' GPT-NeoX names -> GPTNeoXForCausalLM's: the model's own, then a block's (under
# blocks.N. and gpt_neox.layers.N.), each with its weight and bias; the fused qkv is laid out
# anew (qkv_to_hf). archs/hf/hf_import.py reads these tables backwards.
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
    """Mamba weights under transformers' Mamba2ForCausalLM names; the head as lm_head.weight:
    a copy of the embedding where archs ties them (tie_embeddings, the default), else its own
    (docs/ZOO.md)."""
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
NATIVE = {GPTNeoX: (hf_config, hf_state_dict),
          Mamba: (mamba2_config, mamba2_state_dict)}
