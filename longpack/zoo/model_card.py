"""README.md of an exported folder: the model card the Hugging Face hub shows, made with
huggingface_hub's ModelCard.

    model_card(trained, "hf-x", license="apache-2.0", context=1024, code=["moe.py", ...]) -> str

Its metadata (ModelCardData, the YAML the hub reads): license, library_name, pipeline_tag, tags
(custom_code where the folder carries its own modeling code), datasets where the run's builds
read a hub dataset (hf://datasets/... inputs, or a --dataset the catalog names), and
`longpack`: the final train loss and the last val loss (with its step) from the run's
metrics.jsonl; no base_model (a run that began from other weights, `train --init-from`, names
them in the card by their folder's name, which is no hub repository id). Then what the model
is and where it came from, each read from the run rather than restated: the family and its
sizes (parameters, and active parameters per token for MoE) from the model; the tokens it
trained on from the run's metrics.jsonl (the record of the checkpoint's last step); the
build's fingerprint from the checkpoint; the weights it started from (the checkpoint's
record); each build's inputs and counts from its manifest (a build no longer where the run
read it is named, without counts); the command that trained it from the
run's settings as the checkpoint holds them (the flags that differ from `train`'s defaults);
how to load it.

The card goes to the hub, so it names nothing by a path of the machine that trained it: a build
is named by its folder's name and its manifest's fingerprint, a local input file by its name,
the run by its folder's name, and the settings that only say where a run kept its files
(WHERE) are left out of the command.
"""

import dataclasses
import json
import re
import shlex
from pathlib import Path

INPUTS_LISTED = 10  # a build of thousands of files lists its first few and a count
WHERE = ("out", "upload", "staging", "cache")  # train's settings that are places, not the model
HUB_INPUT = re.compile(r"hf://datasets/(?P<repo>[^@]+)@")  # pipeline/read/hub.py's uri()


def model_card(trained, name: str, license: str, context: int, code: list[str]) -> str:
    """`name`: the folder's (the repository's); `code`: the archs files the folder carries
    (none: transformers has the class)."""
    from huggingface_hub import ModelCard, ModelCardData

    model = trained.model
    family = _family(model)
    settings = trained.train_config or {}
    preset = settings.get("model", family)
    params = model.num_params()
    active = model.active_params() if hasattr(model, "active_params") else params
    last = final_losses(trained.checkpoint.parent, trained.step)
    tokens = last.get("tokens")
    builds = [(source, path, _manifest(path)) for source, path in _sources(settings)]
    data = ModelCardData(license=license, library_name="transformers",
                         pipeline_tag="text-generation", datasets=_hub_datasets(builds) or None,
                         tags=["longpack", family] + (["custom_code"] if code else []),
                         longpack={k: v for k, v in last.items() if k != "tokens"} or None)
    run = trained.checkpoint.parent.name
    lines = [f"# {name}", "",
             f"A {_describe(model)} language model trained with longpack and exported by "
             f"`zoo export --to hf` from the checkpoint `{trained.checkpoint.name}` of the "
             f"run `{run}`.",
             "", "| | |", "|---|---|",
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
              + (f" ({trained.step:,} steps)" if trained.step is not None else "")
              + (" in this run, after those of the weights it started from" if
                 trained.began_from else "") + " |",
              f"| started from | {_began(trained.began_from)} |",
              f"| build fingerprint | `{trained.fingerprint or 'not recorded'}` |",
              f"| tokenizer | {_tokenizer(trained.trained_on)} |",
              f"| license | {license} |", "", "## Training data", ""]
    for source, path, manifest in builds:
        lines += _build(source, path, manifest)
    lines += ["## Training", "", "Each build named by its folder; where the run kept its files "
              f"({', '.join(f'`--{w}`' for w in WHERE)}) left out.", "",
              "```bash", train_command(settings), "```", "",
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
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))


def final_losses(run: Path, step: int | None) -> dict:
    """What the run's metrics.jsonl says of the checkpoint of `step` (its last step is step - 1):
    the tokens trained, that step's train loss (`loss`, `lm_loss`) and the last val loss up to
    it (`val_loss`, at `val_step`); {} when the file is not here."""
    out = {}
    if step is None:
        return out
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        if not isinstance(record, dict) or record.get("step") is None or record["step"] >= step:
            continue
        if record["step"] == step - 1:
            out.update({k: record[k] for k in ("tokens", "loss", "lm_loss") if k in record})
        if record.get("val_loss") is not None:
            out.update(val_loss=record["val_loss"], val_step=record["step"])
    return out


def train_command(settings: dict) -> str:
    """`train` with the flags of every setting that differs from its default (shards and the
    model always; each build by its folder's name, WHERE left out), one flag a line."""
    from longpack.pipeline import source_name
    from longpack.training import TrainConfig

    parts = []
    for source, path in _sources(settings):
        folder = source_name(path)
        parts.append("--shards " + shlex.quote(folder if source == folder else f"{source}={folder}"))
    if settings.get("init_from"):  # by its folder's name, as a build
        parts.append("--init-from " + shlex.quote(Path(settings["init_from"]).name))
    for f in dataclasses.fields(TrainConfig):
        if f.name not in settings or f.name in WHERE or f.name in ("shards", "init_from"):
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
    from longpack import archs

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


def _began(began: dict | None) -> str:
    """Where the run's weights began: random ones, or the folder it started from by its name
    (a run's checkpoint as RUN/step-N), its kind and how its vocabulary was checked."""
    if not began:
        return "random weights (trained from scratch)"
    return (f"`{began.get('name')}` ({began.get('kind')}"
            + (f", step {began['step']:,}" if began.get("step") is not None else "")
            + f"; {began.get('tokenizer')})")


def _tokenizer(trained_on: dict | None) -> str:
    if not trained_on:
        return "not recorded"
    return (f"{trained_on.get('name')} ({trained_on.get('kind')}, "
            f"{trained_on.get('vocab_size', 0):,} ids, EOS {trained_on.get('eos_id')})")


def _sources(settings: dict) -> list[tuple[str, str]]:
    """(name, path) of each build the run trained on; none where the settings hold no valid
    --shards (the card still says the rest)."""
    from longpack.core import LongpackError
    from longpack.pipeline import parse_mixture

    shards = settings.get("shards") or ()
    try:
        return parse_mixture([shards] if isinstance(shards, str) else list(shards),
                             None, (), ())[0]
    except (LongpackError, ValueError, TypeError):
        return []


def _manifest(path: str) -> dict | None:
    from longpack.core import LongpackError
    from longpack.pipeline import read_manifest

    try:
        return read_manifest(path)
    except (LongpackError, OSError, ValueError):
        return None


def _hub_datasets(builds) -> list[str]:
    """The hub datasets (repository ids) of the builds: those they read their inputs from, and
    the one a build's --dataset names (fineweb-edu: its files, wherever they were read)."""
    from longpack.pipeline import DATASETS

    repos = set()
    for _, _, manifest in builds:
        if manifest:
            repos |= {m["repo"] for i in manifest.get("inputs", [])
                      if (m := HUB_INPUT.match(str(i.get("path", ""))))}
            named = DATASETS.get(str(manifest.get("settings", {}).get("dataset")))
            if named is not None and named.hub_repo:
                repos.add(named.hub_repo)
    return sorted(repos)


def _build(source: str, path: str, manifest: dict | None) -> list[str]:
    """A build, by its folder's name and its manifest's fingerprint (never its path)."""
    from longpack.pipeline import dataset_fingerprint, source_name

    folder = source_name(path)
    named = f"`{folder}`" + (f" (source {source})" if source != folder else "")
    if manifest is None:
        return [f"- {named}: its manifest is not here, so no counts", ""]
    settings = manifest.get("settings", {})
    inputs = manifest.get("inputs", [])
    counts = manifest.get("counts", {})
    skipped = {k: v for k, v in counts.get("skipped", {}).items() if v}
    lines = [f"{named}, fingerprint `{dataset_fingerprint(manifest)}`: `pack build` of "
             f"{settings.get('dataset', 'files')}"
             + (f" {settings['subset']}" if settings.get("subset") else "")
             + f"; inputs: {len(inputs):,} file{'s' * (len(inputs) != 1)}, "
             f"{sum(i.get('size', 0) for i in inputs):,} bytes", ""]
    lines += [f"- `{_input(i.get('path'))}` ({i.get('size', 0):,} bytes)"
              for i in inputs[:INPUTS_LISTED]]
    if len(inputs) > INPUTS_LISTED:
        lines.append(f"- and {len(inputs) - INPUTS_LISTED:,} more")
    lines += ["", f"{counts.get('documents', 0):,} documents, {counts.get('tokens', 0):,} tokens "
              "(skipped: " + (", ".join(f"{k} {v:,}" for k, v in skipped.items()) or "none")
              + f"), rows of {manifest.get('seq')} tokens:", ""]
    for split, c in manifest.get("splits", {}).items():
        lines.append(f"- {split}: {c.get('rows', 0):,} rows, {c.get('tokens', 0):,} tokens, "
                     f"{c.get('documents', 0):,} documents")
    return lines + [""]


def _input(path) -> str:
    """An input as the card names it: a URL as the manifest recorded it (credentials already
    redacted there), a local file by its name alone."""
    path = str(path)
    return path if "://" in path else Path(path).name
