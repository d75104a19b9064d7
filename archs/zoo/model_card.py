"""README.md of an exported folder: the model card the Hugging Face hub shows.

    model_card(trained, "hf-x", license="apache-2.0", context=1024, code=["moe.py", ...]) -> str

YAML front matter as the hub reads it (license, library_name, pipeline_tag, tags; the tag
custom_code where the folder carries its own modeling code), then what the model is and where it
came from, each read from the run rather than restated: the family and its sizes (parameters,
and active parameters per token for MoE) from the model; the tokens it trained on from the run's
metrics.jsonl (the record of the checkpoint's last step); the build's fingerprint from the
checkpoint; each build's inputs and counts from its manifest (a build no longer where the run
read it is named, without counts); the command that trained it from the run's settings as the
checkpoint holds them (the flags that differ from `train`'s defaults); how to load it.
"""

import dataclasses
import json
import shlex
from pathlib import Path

INPUTS_LISTED = 10  # a build of thousands of files lists its first few and a count


def model_card(trained, name: str, license: str, context: int, code: list[str]) -> str:
    """`name`: the folder's (the repository's); `code`: the archs files the folder carries
    (none: transformers has the class)."""
    model = trained.model
    family = _family(model)
    settings = trained.train_config or {}
    preset = settings.get("model", family)
    params = model.num_params()
    active = model.active_params() if hasattr(model, "active_params") else params
    tokens = trained_tokens(trained.checkpoint.parent, trained.step)
    tags = ["longpack", family] + (["custom_code"] if code else [])
    lines = ["---", f"license: {license}", "library_name: transformers",
             "pipeline_tag: text-generation", "tags:", *(f"- {t}" for t in tags), "---", "",
             f"# {name}", "",
             f"A {_describe(model)} language model trained with longpack and exported by "
             f"`zoo export --to hf` from `{trained.checkpoint}`.", "",
             "| | |", "|---|---|",
             f"| family | {family} |", f"| preset | `{preset}`"
             + "".join(f" `--model-arg {a}`" for a in settings.get("model_args", ())) + " |",
             f"| parameters | {params:,} |"]
    if active != params:
        lines.append(f"| active parameters | {active:,} per token |")
    lines += [f"| context | {context:,} tokens (max_position_embeddings; trained on rows of "
              f"{trained.seq or 'an unrecorded number of'} tokens"
              + ("; the recurrent state has one size however long the text" if family == "mamba"
                 else "") + ") |",
              "| tokens trained | " + (f"{tokens:,}" if tokens is not None else
                                       "not recorded (the run's metrics.jsonl is not here)")
              + (f" ({trained.step:,} steps)" if trained.step is not None else "") + " |",
              f"| build fingerprint | `{trained.fingerprint or 'not recorded'}` |",
              f"| tokenizer | {_tokenizer(trained.trained_on)} |",
              f"| license | {license} |", "", "## Training data", ""]
    for source, path, manifest in _builds(settings.get("shards") or ()):
        lines += _build(source, path, manifest)
    lines += ["## Training", "", "```bash", train_command(settings), "```", "",
              "## Use", "", "```python", "from transformers import AutoModelForCausalLM, "
              "AutoTokenizer", "", f'folder = "{name}"  # or its hub repository, "user/{name}"',
              "tok = AutoTokenizer.from_pretrained(folder)",
              "model = AutoModelForCausalLM.from_pretrained(folder"
              + (", trust_remote_code=True)" if code else ")"),
              'out = model.generate(**tok(["The"], return_tensors="pt"), max_new_tokens=50)',
              "print(tok.decode(out[0], skip_special_tokens=True))", "```", ""]
    if code:
        lines += ["The modeling code is longpack's own model files, unchanged ("
                  + ", ".join(f"`{file}`" for file in code) + "), under a thin transformers "
                  "wrapper (`modeling_longpack.py`, `configuration_longpack.py`); it needs "
                  "only torch and transformers.", ""]
    return "\n".join(lines)


def trained_tokens(run: Path, step: int | None) -> int | None:
    """The tokens the run had trained on when it wrote the checkpoint of `step`: the "tokens"
    of metrics.jsonl's record of step - 1 (the last step it holds)."""
    if step is None:
        return None
    try:
        for line in reversed((run / "metrics.jsonl").read_text().splitlines()):
            record = json.loads(line)
            if record.get("step") == step - 1 and "tokens" in record:
                return int(record["tokens"])
    except (OSError, ValueError):
        pass
    return None


def train_command(settings: dict) -> str:
    """`train` with the flags of every setting that differs from its default (shards and the
    model always), one flag a line."""
    from training.config import TrainConfig

    parts = []
    for f in dataclasses.fields(TrainConfig):
        if f.name not in settings:
            continue
        value = settings[f.name]
        value = tuple(value) if isinstance(value, list) else value
        default = (f.default_factory() if f.default is dataclasses.MISSING
                   and f.default_factory is not dataclasses.MISSING else f.default)
        if value is None or (value == default and f.name != "model"):
            continue
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, tuple) and f.metadata.get("multiple"):
            parts += [f"{flag} {shlex.quote(str(v))}" for v in value]
        elif isinstance(value, tuple):
            parts.append(f"{flag} {shlex.quote(','.join(map(str, value)))}")
        else:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return " \\\n  ".join(["train", *parts])


def _family(model) -> str:
    import archs

    return next(f for f, (_, cls, _) in archs.FAMILIES.items() if isinstance(model, cls))


def _describe(model) -> str:
    family, c = _family(model), model.cfg
    if family == "gpt-neox":
        return f"GPT-NeoX ({c.n_layers} layers, width {c.d_model}, {c.n_heads} heads)"
    if family == "mamba":
        return f"Mamba-2 ({c.n_layers} layers, width {c.d_model}, state {c.d_state})"
    if family == "resonance":
        return (f"resonance (FFT long convolution; {c.n_layers} layers, width {c.d_model}, "
                f"{c.num_frequencies} frequencies)")
    mixers = c.mixers
    kind = (f"hybrid MoE ({mixers.count('M')} Mamba-2 and {mixers.count('A')} attention "
            "layers" if "M" in mixers else f"MoE ({c.n_layers} attention layers")
    extra = "".join([f", {c.n_pred_tokens}-token prediction" if c.n_pred_tokens > 1 else "",
                     f", Mixture-of-Depths {c.mod_capacity}" if c.mod_capacity else ""])
    return (f"{kind}, width {c.d_model}, top-{c.top_k} of {c.n_experts} routed experts"
            f"{extra})")


def _tokenizer(trained_on: dict | None) -> str:
    if not trained_on:
        return "not recorded"
    return (f"{trained_on.get('name')} ({trained_on.get('kind')}, "
            f"{trained_on.get('vocab_size', 0):,} ids, EOS {trained_on.get('eos_id')})")


def _builds(shards) -> list[tuple[str, str, dict | None]]:
    """(name, path, manifest or None) of each build the run trained on."""
    from longpack import LongpackError
    from pipeline import parse_mixture
    from training.data.builds import read_manifest

    try:
        sources = parse_mixture([shards] if isinstance(shards, str) else list(shards),
                                None, (), ())[0]
    except (LongpackError, ValueError, TypeError):
        return []
    out = []
    for name, path in sources:
        try:
            out.append((name, path, read_manifest(path)))
        except (LongpackError, OSError, ValueError):
            out.append((name, path, None))
    return out


def _build(name: str, path: str, manifest: dict | None) -> list[str]:
    if manifest is None:
        return [f"- `{path}` ({name}): its manifest is not here, so no counts", ""]
    settings = manifest.get("settings", {})
    inputs = manifest.get("inputs", [])
    counts = manifest.get("counts", {})
    skipped = {k: v for k, v in counts.get("skipped", {}).items() if v}
    lines = [f"`{path}` ({name}): `pack build` of {settings.get('dataset', 'files')}"
             + (f" {settings['subset']}" if settings.get("subset") else "")
             + f"; inputs: {len(inputs):,} file{'s' * (len(inputs) != 1)}, "
             f"{sum(i.get('size', 0) for i in inputs):,} bytes", ""]
    lines += [f"- `{i.get('path')}` ({i.get('size', 0):,} bytes)" for i in inputs[:INPUTS_LISTED]]
    if len(inputs) > INPUTS_LISTED:
        lines.append(f"- and {len(inputs) - INPUTS_LISTED:,} more")
    lines += ["", f"{counts.get('documents', 0):,} documents, {counts.get('tokens', 0):,} tokens "
              "(skipped: " + (", ".join(f"{k} {v:,}" for k, v in skipped.items()) or "none")
              + f"), rows of {manifest.get('seq')} tokens:", ""]
    for split, c in manifest.get("splits", {}).items():
        lines.append(f"- {split}: {c.get('rows', 0):,} rows, {c.get('tokens', 0):,} tokens, "
                     f"{c.get('documents', 0):,} documents")
    return lines + [""]
