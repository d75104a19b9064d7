"""A trained model out of longpack: `zoo export RUN --to hf|safetensors --out DIR`.

    model, tokenizer = load_run(Path("runs/x"), step=None)   # the newest sound checkpoint
    export_hf(model, tokenizer, Path("hf-out"))              # GPT-NeoX only
    archs.save(model, Path("out"))                           # any family: archs.load reads it

`--to hf` writes what `transformers.GPTNeoXForCausalLM.from_pretrained(DIR)` loads with no
missing or unexpected key: config.json (model_type gpt_neox, parallel residual, the rotary
share and base, untied embeddings), model.safetensors, and the build's tokenizer as a fast
tokenizer (a tokenizer.json build: that file; a tiktoken build: converted by transformers'
own tiktoken converter, offline). The one layout that differs is attention's fused qkv:
longpack's rows are [q | k | v], each heads x head_dim; Hugging Face's are heads x [q, k, v].
GPT-NeoX's rotary (pairs i, i + rot/2 of the first rot features of each head), GELU (erf),
LayerNorms and biases are the same computation in both, so the logits agree to float32
rounding (tests/test_export.py: max abs difference <= 1e-4).
"""

import base64
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

import archs
from pipeline import TrainingError
from training import checkpoint
from training.transformers_compat import import_transformers


@dataclass
class TrainedRun:
    """A run's model and what it was trained on (`load_run`)."""
    model: torch.nn.Module  # in eval mode
    tokenizer: object | None  # the build's pipeline Tokenizer, when it loads here
    trained_on: dict | None  # the build manifest's "tokenizer" (None: not recorded, build gone)
    seq: int | None  # the sample length it trained on
    checkpoint: Path


def load_run(run: Path, step: int | None = None, say=checkpoint.warn) -> TrainedRun:
    """RUN's newest sound checkpoint (`say` is told of each one skipped), or step-N's. The
    tokenizer is the one the build's manifest names, when it loads here."""
    if step is None:
        found = checkpoint.load_latest(run, say)
        if found is None:
            raise TrainingError(f"{run}: no complete checkpoint (step-NNNNNNNN/ with COMPLETE); "
                                "pass the --out of a train run")
    else:
        found = checkpoint.load(run / f"step-{step:08d}")
    state, path = found
    weights = state["model"]
    name = state["config"]["model"]
    overrides = state.get("model_config") or {}
    try:
        model = archs.build(name, **{**overrides, "vocab_size": weights["embed.weight"].shape[0]})
    except (KeyError, ValueError, TypeError) as e:
        raise TrainingError(f"{path}: its model ({name}) cannot be built here ({e})") from None
    model.load_state_dict(weights)
    model.eval()
    manifest = _manifest(state["config"].get("shards"))
    # checkpoints record the build's tokenizer; older ones only where the build still is
    trained_on = state.get("tokenizer") or (manifest or {}).get("tokenizer")
    return TrainedRun(model, _tokenizer(manifest), trained_on, state.get("seq"), path)


def _manifest(shards: str | list | None) -> dict | None:
    """The manifest of the run's build (a mixture's first source's: they share the tokenizer),
    or None when it is not here."""
    from pipeline import LongpackError, parse_mixture

    try:
        first = parse_mixture([shards] if isinstance(shards, str) else shards, None, (), ())
        manifest = json.loads((Path(first[0][0][1]) / "manifest.json").read_text())
        return manifest if isinstance(manifest.get("tokenizer"), dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, LongpackError):
        return None


def _tokenizer(manifest: dict | None):
    """The build's tokenizer (pipeline.tokenizer.Tokenizer), or None when its file is not
    here (or the build records none: pack import without --tokenizer)."""
    from pipeline import LongpackError, load_tokenizer

    source = (manifest or {}).get("tokenizer", {}).get("source")
    if source is None:
        return None
    try:
        return load_tokenizer(source)
    except (OSError, ValueError, LongpackError):
        return None


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """GPT-NeoX weights under transformers' GPTNeoXForCausalLM names."""
    cfg = model.cfg
    nh, hs = cfg.n_heads, cfg.d_model // cfg.n_heads
    ours = model.state_dict()
    out = {"gpt_neox.embed_in.weight": ours["embed.weight"],
           "gpt_neox.final_layer_norm.weight": ours["ln_f.weight"],
           "gpt_neox.final_layer_norm.bias": ours["ln_f.bias"],
           "embed_out.weight": ours["head.weight"]}
    names = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
             "attn.out": "attention.dense", "fc_in": "mlp.dense_h_to_4h",
             "fc_out": "mlp.dense_4h_to_h"}
    for i in range(cfg.n_layers):
        for ours_name, theirs in names.items():
            for kind in ("weight", "bias"):
                out[f"gpt_neox.layers.{i}.{theirs}.{kind}"] = ours[f"blocks.{i}.{ours_name}.{kind}"]
        w, b = ours[f"blocks.{i}.attn.qkv.weight"], ours[f"blocks.{i}.attn.qkv.bias"]
        # [q | k | v] x heads x head_dim  ->  heads x [q, k, v] x head_dim
        out[f"gpt_neox.layers.{i}.attention.query_key_value.weight"] = (
            w.view(3, nh, hs, -1).transpose(0, 1).reshape(3 * cfg.d_model, -1))
        out[f"gpt_neox.layers.{i}.attention.query_key_value.bias"] = (
            b.view(3, nh, hs).transpose(0, 1).reshape(-1))
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def hf_config(model, eos_id: int | None) -> dict:
    cfg = model.cfg
    head_dim = cfg.d_model // cfg.n_heads
    rotary = int(head_dim * cfg.rotary_pct) // 2 * 2  # what archs/gpt_neox.py rotates
    return {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff, "hidden_act": "gelu",
            "rotary_pct": rotary / head_dim, "rotary_emb_base": cfg.rotary_base,
            "max_position_embeddings": cfg.max_seq, "layer_norm_eps": cfg.norm_eps,
            "use_parallel_residual": True, "tie_word_embeddings": False,
            "attention_bias": True, "initializer_range": cfg.init_std,
            "bos_token_id": eos_id, "eos_token_id": eos_id, "torch_dtype": "float32"}


def export_hf(model, tokenizer, out: Path) -> list[str]:
    """Write the Hugging Face directory; returns notes for the user (what was not written)."""
    from safetensors.torch import save_file

    if not isinstance(model, archs.gpt_neox.GPTNeoX):
        raise TrainingError(f"--to hf writes GPT-NeoX models; this run's is "
                            f"{type(model).__name__}: use --to safetensors (archs.load reads it)")
    out.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.eos_id if tokenizer is not None else None
    (out / "config.json").write_text(json.dumps(hf_config(model, eos), indent=2) + "\n")
    save_file(hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is None:
        return ["no tokenizer written: the build's manifest or tokenizer file is not here; copy "
                "the build's tokenizer.json (or convert its .tiktoken file with "
                "transformers.integrations.tiktoken.convert_tiktoken_to_fast) into the folder"]
    _write_tokenizer(tokenizer, out)
    return []


def _write_tokenizer(tokenizer, out: Path) -> None:
    if tokenizer.kind == "huggingface":
        shutil.copyfile(tokenizer.source, out / "tokenizer.json")
    else:  # transformers' converter of tiktoken's ranks, fed a ranks file written here
        import_transformers()
        from transformers.convert_slow_tokenizer import TikTokenConverter

        enc = tokenizer.reference.impl
        with tempfile.TemporaryDirectory() as tmp:
            ranks = Path(tmp) / "ranks.tiktoken"
            ranks.write_bytes(b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank
                                       in sorted(enc._mergeable_ranks.items(),
                                                 key=lambda kv: kv[1])))
            converted = TikTokenConverter(vocab_file=str(ranks), pattern=enc._pat_str,
                                          additional_special_tokens=enc._special_tokens
                                          ).converted()
        # The converter numbers special tokens after the ranks; tiktoken's own ids may leave
        # a gap (cl100k_base: <|endoftext|> is 100257, its last rank 100255). tokenizers keeps
        # an added token's id only when the model's vocabulary holds it: put them there.
        data = json.loads(converted.to_str())
        for added in data["added_tokens"]:
            added["id"] = enc._special_tokens.get(added["content"], added["id"])
            data["model"]["vocab"][added["content"]] = added["id"]
        (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    end = "<|endoftext|>"
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": end, "bos_token": end,
         "unk_token": end, "model_max_length": 1 << 30}, indent=2) + "\n")
