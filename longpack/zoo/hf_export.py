"""`zoo export RUN --to hf`: a folder transformers loads and the Hugging Face hub takes as it
is, for every family. The layouts of transformers' own classes are archs/hf/native.py's.

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
  `from_pretrained(DIR, trust_remote_code=True)` (archs/hf/hf_remote.py).

Every folder also holds the build's tokenizer (longpack/zoo/runs.py loads it from the build's copy;
`zoo export` refuses to write a folder without it unless --no-tokenizer), generation_config.json,
special_tokens_map.json and a model card (README.md); the weights are safetensors, sharded past
`max_shard_size` with an index; files 0644, folders 0755, nothing hidden (archs/hf/
hf_folder.py). `max_position_embeddings` is the model's context: the longer of its `max_seq`
and the rows it trained on (a tiny preset's max_seq is 256; a run may train on 1,024-token
rows). The folder appears whole or not at all.
"""
import json
import re
from pathlib import Path

import torch

from longpack.archs import (
    ARCHS,
    NATIVE,
    layout_problems,
    remote_config,
    remote_weights,
    set_modes,
    ship_code,
    shipped_files,
    special_token_ids,
    staged,
    write_generation_config,
    write_tokenizer,
    write_weights,
)
from longpack.core import TrainingError
from longpack.zoo.model_card import model_card

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
    ids = special_token_ids(trained.tokenizer, trained.trained_on)
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
