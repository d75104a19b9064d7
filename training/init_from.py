"""`train --init-from SOURCE`: a new run that starts from existing weights instead of random
ones (continued pretraining; context extension with another rotary base). docs/TRAIN.md,
"Starting from weights", says it for users.

    init = begin(cfg, found, log)     # None: no --init-from, or a resume (SOURCE is not read)
    model = archs.build(cfg.model, vocab_size=init.vocab_size, ...)
    init.load_into(model)             # before DDP, FSDP or compile wrap it
    init.record                       # where the run began: its checkpoints, metrics, model card

SOURCE is a longpack checkpoint folder (step-NNNNNNNN), a run folder (its newest sound
checkpoint), or a model folder (archs/hf/hf_import.py: GPTNeoXForCausalLM, Mamba2ForCausalLM,
zoo export's own folders), here or at a URL (training/init_source.py). Weights only: the
optimizer's state, the schedule, the data order and the step are the new run's own, from step
0 (a run that continues the same one is a resume).

Everything is checked before the data is opened, from the checkpoint's state.pt and DCP
metadata or the folder's config.json and safetensors headers, and the build's manifest: no
tensor is read until all of it holds, and each problem is one TrainingError line naming
SOURCE:
- the family: weights of another family than --model's;
- the vocabulary: a longpack checkpoint's recorded tokenizer against each build's (the same
  sha256, pipeline/builds/identity.py); a model folder's tokenizer.json, the same file as the
  build's, or one whose ids below the build's vocabulary are the same tokens (a vocabulary at
  least as large with the build's ids meaning the same; which of the two is said). The model
  is built at the weights' vocabulary (Pythia's embedding has rows past its tokenizer's);
- the model's settings: each field of the run's model config (--model and --model-arg)
  against the weights', but those FREE to change (the context, the rotary base, what only
  initializes, what weighs a loss or drops tokens, recomputation, a scan's chunk);
- the tensors: missing, extra (no place in the model) and each shape, the first that differ
  named.
Nothing is read through pickle but a checkpoint's state.pt (torch.load(weights_only=True))
and DCP's metadata (its allow-list): checkpoint.py's safe paths, and safetensors.

A run that has checkpoints resumes them and never reads SOURCE again: with the same
--init-from (re-running the command that started it) it says so in one line; with another
SOURCE, or a run that began otherwise, it is refused in one line (pass --resume never or
another --out to start anew from SOURCE).
"""

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from longpack import archs
from longpack.core import LongpackError, TrainingError, is_url, redact, sha256_file
from longpack.training.init_source import Source, open_source

# model config fields a run may set otherwise than the weights it starts from: the context
# and the rotary base (context extension), what only initializes, recomputation, the order a
# scan sums in, and what only training reads (a loss's weight, MoE's capacity); also each
# field ending in _coef
FREE = ("vocab_size", "max_seq", "rotary_base", "checkpointing", "init_std", "dt_min",
        "dt_max", "chunk", "ssm_chunk", "capacity_factor")
NAMED = 3  # tensors named in a message, the rest counted


@dataclass
class Start:
    """A checked SOURCE: what the run builds its model at, loads into it, and records."""
    source: Source
    vocab_size: int
    tied: dict[str, str]  # the model's tied weights: name -> the earlier name it shares
    record: dict

    def load_into(self, model) -> None:
        """SOURCE's weights into `model` (built at vocab_size, not yet wrapped); a tied weight
        is filled from its twin, or must equal it."""
        s = self.source
        try:
            weights = s.read()
        except ValueError as e:  # hf_import's: a file damaged past its header
            raise TrainingError(f"{s.where()}: {e}") from None
        for name, twin in self.tied.items():
            if name not in weights:
                weights[name] = weights[twin]
            elif not (weights[name].shape == weights[twin].shape
                      and bool((weights[name] == weights[twin]).all())):
                raise TrainingError(f"{s.where()}: its {name} is not its {twin}, and the "
                                    "model ties the two (one weight): it cannot hold both")
        try:
            model.load_state_dict(weights)
        except (RuntimeError, ValueError) as e:  # checked above; a file changed since
            raise TrainingError(f"{s.where()}: its weights do not load "
                                f"({str(e).strip().splitlines()[0]})") from None


def begin(cfg, found: tuple[dict, Path] | None, log) -> Start | None:
    """The run's start from --init-from, checked (module docstring); None without it, or when
    the run resumes `found` (its own checkpoint: SOURCE is not read again)."""
    if found is not None:
        _resuming(cfg, found, log)
        return None
    if cfg.init_from is None:
        return None
    source = open_source(cfg.init_from, log)
    family = archs.PRESETS.get(cfg.model, cfg.model)
    if source.family != family:
        raise TrainingError(f"{source.where()}: it holds a {source.family} model "
                            f"({source.model}) and this run asks for --model {cfg.model} (a "
                            f"{family}); pass --model with a {source.family} preset or family")
    vocab, how = check_vocabulary(source, cfg)
    tied = check_model(source, cfg, vocab)
    record = {"source": _absolute(source.given), "name": source.name, "kind": source.kind,
              "model": source.model, "step": source.step, "tokenizer": how}
    log(f"starting from {source.given} ({source.kind}"
        + (f", step {source.step}" if source.step is not None else "") + "): its weights, "
        f"with a new optimizer, schedule and data order from step 0; {how}")
    return Start(source, vocab, tied, record)


def _absolute(text: str) -> str:
    return text if is_url(text) else os.path.abspath(text)


def _resuming(cfg, found: tuple[dict, Path], log) -> None:
    """A run with a checkpoint resumes it: --init-from as the run began is said and not read;
    another is refused."""
    if cfg.init_from is None:
        return
    state, path = found
    # the record every checkpoint of the run carries, not the settings of its last leg (a
    # resume without --init-from records none there)
    began = (state.get("began_from") or {}).get("source")
    asked = cfg.to_dict()["init_from"]
    asked = redact(asked) if is_url(asked) else asked  # as the record has it (no password)
    shown = redact(cfg.init_from) if is_url(cfg.init_from) else cfg.init_from
    if began == asked:
        log(f"--init-from {shown}: the run began from it and resumes its own "
            f"checkpoint {path.name}, without reading it again")
        return
    how = f"began from {began}" if began else "began from random weights"
    raise TrainingError(f"--init-from {shown}: the run has a checkpoint to resume "
                        f"({path}, of a run that {how}), and a resume never reads --init-from; "
                        f"pass --resume never or another --out to start a new run from "
                        f"{shown}, or leave --init-from out to resume")


# -- the vocabulary ------------------------------------------------------------------------

def check_vocabulary(source: Source, cfg) -> tuple[int, str]:
    """(the vocabulary to build the model at: the weights', how the tokenizer was checked),
    against each build of --shards whose manifest is here (opening the data names one that
    is not)."""
    from longpack.pipeline import read_manifest

    builds = []
    for _, location in cfg.mixture()[0]:
        try:
            builds.append((location, read_manifest(location)["tokenizer"]))
        except LongpackError:
            continue
    vocab = source.vocab_size
    if vocab is None:
        raise TrainingError(f"{source.where()}: it holds no embed.weight (the embedding) and "
                            "says no vocab_size; pass a model's folder")
    if not builds:
        return vocab, "the build's tokenizer was not checked (no manifest here)"
    hows = set()
    for location, theirs in builds:
        if vocab < theirs["vocab_size"]:
            raise TrainingError(f"{source.where()}: its embedding has {vocab} rows and "
                                f"{location} has ids up to {theirs['vocab_size'] - 1}: it was "
                                "trained with another tokenizer; build the data with the "
                                "model's tokenizer")
        if source.kind == "longpack checkpoint":
            hows.add(_same_build_tokenizer(source, location, theirs, vocab))
        else:
            hows.add(_same_ids(source, location, theirs))
    return vocab, "; ".join(sorted(hows))


def _same_build_tokenizer(source: Source, location: str, theirs: dict, vocab: int) -> str:
    from longpack.pipeline import other_tokenizer, tokenizer_label

    if source.tokenizer is None:  # a checkpoint of before the record
        if vocab != theirs["vocab_size"]:
            raise TrainingError(f"{source.where()}: its embedding has {vocab} rows, the "
                                f"build's tokenizer {theirs['vocab_size']} ids, and the "
                                "checkpoint does not record its tokenizer: build the data with "
                                "the tokenizer it was trained with")
        return ("the tokenizer of the checkpoint is not recorded (a checkpoint of before the "
                "record): its vocabulary's size alone was checked")
    other = other_tokenizer(source.tokenizer, theirs,
                            None if is_url(location) else Path(location), location)
    if other:
        raise TrainingError(f"{source.where()}: {other}; its ids mean other tokens: start "
                            "from weights trained with the build's tokenizer, or build the "
                            "data with theirs")
    return f"the build's tokenizer, the one it trained with ({tokenizer_label(theirs)})"


def _same_ids(source: Source, location: str, theirs: dict) -> str:
    """A model folder's tokenizer.json against the build's: the same file, or the same token
    at every id the build has."""
    from longpack.pipeline import tokenizer_label

    file = source.path / "tokenizer.json"
    if not file.is_file():
        raise TrainingError(f"{source.where()}: it holds no tokenizer.json, so what its ids "
                            "mean cannot be checked against the build's tokenizer: put the "
                            "tokenizer.json of the tokenizer it was trained with in it")
    if theirs.get("kind") == "imported":
        raise TrainingError(f"{source.where()}: {location} holds imported ids with no "
                            "tokenizer, so what they mean cannot be checked against its "
                            "tokenizer.json; import the data with --tokenizer")
    sha = sha256_file(file)
    if sha == theirs.get("sha256"):
        return f"its tokenizer.json is the build's ({tokenizer_label(theirs)})"
    from longpack.archs import tokenizer_json_vocabulary

    try:
        mine = tokenizer_json_vocabulary(file.read_text(errors="replace"))
    except ValueError as e:
        raise TrainingError(f"{source.where()}: its tokenizer.json is not one ({e})") from None
    build = tokenizer_json_vocabulary(_build_tokenizer_json(location, theirs, source))
    for i in range(theirs["vocab_size"]):
        if mine.get(i) != build.get(i):
            raise TrainingError(
                f"{source.where()}: id {i} is {_token(mine.get(i))} in its tokenizer.json and "
                f"{_token(build.get(i))} in the build's ({tokenizer_label(theirs)}): its ids "
                "mean other tokens; build the data with its tokenizer.json")
    return (f"its tokenizer.json (sha256 {sha[:12]}) is another file than the build's "
            f"({tokenizer_label(theirs)}) with the same token at each of the build's "
            f"{theirs['vocab_size']:,} ids")


def _token(text: str | None) -> str:
    return "no token" if text is None else repr(text)


def _build_tokenizer_json(location: str, theirs: dict, source: Source) -> str:
    """The build's tokenizer as tokenizer.json text: its own file, or its tiktoken ranks as
    transformers converts them (what zoo export writes)."""
    from longpack.pipeline import fetch_kept, load_build_tokenizer

    if is_url(location):
        from longpack.core import Store

        folder = fetch_kept(Store(location), theirs)
    else:
        folder = Path(location)
    tok, problem = load_build_tokenizer(theirs, folder)
    if tok is None:
        raise TrainingError(f"{source.where()}: its tokenizer.json is another file than the "
                            f"build's, whose tokenizer does not load here to compare their ids "
                            f"({problem})")
    if tok.kind == "huggingface":
        return Path(tok.source).read_text(errors="replace")
    from longpack.archs import converted_tiktoken

    return converted_tiktoken(tok)


# -- the model -----------------------------------------------------------------------------

def check_model(source: Source, cfg, vocab: int) -> dict[str, str]:
    """The run's model (--model, --model-arg, at `vocab`) against SOURCE's settings and
    tensors; returns the model's tied weights (name -> the name it shares)."""
    try:
        archs.mamba.refuse_layernorm_weights(source.shapes)
    except archs.mamba.OutdatedWeights as e:
        raise TrainingError(f"{source.where()}: it holds {e}") from None
    model = archs.build(cfg.model, device="meta", **{**cfg.model_overrides, "vocab_size": vocab})
    state = model.state_dict(keep_vars=True)
    first, tied = {}, {}
    for name, t in state.items():
        tied.update({name: first[id(t)]} if id(t) in first else {})
        first.setdefault(id(t), name)
    wanted = {k: tuple(t.shape) for k, t in state.items()}
    settings = _differ(source, cfg, vocab)
    differ = [k for k in wanted if k in source.shapes and source.shapes[k] != wanted[k]]
    missing = [k for k in wanted if k not in source.shapes and k not in tied]
    extra = source.extra + [k for k in source.shapes if k not in wanted]
    run = f"--model {cfg.model}" + "".join(f" --model-arg {a}" for a in cfg.model_args)
    fix = ("; pass " + " ".join(f"--model-arg {k}={_arg(v)}" for k, v, _ in settings)
           if settings else "; pass the --model and --model-arg it was trained with")
    theirs = (" (its " + ", ".join(f"{k} {_arg(v)}" for k, v, _ in settings) + "; this run's "
              + ", ".join(f"{_arg(w)}" for _, _, w in settings) + ")") if settings else ""
    if differ or missing or extra:
        parts = []
        if differ:
            k = differ[0]
            parts.append(f"{k} is {list(source.shapes[k])} in it and {list(wanted[k])} here"
                         + _more(differ, 1))
        if missing:
            parts.append(f"it has no {', '.join(missing[:NAMED])}"
                         + _more(missing, NAMED))
        if extra:
            parts.append(f"its {', '.join(extra[:NAMED])} "
                         + ("has" if len(extra) == 1 else "have") + " no place here"
                         + _more(extra, NAMED))
        raise TrainingError(f"{source.where()}: its weights do not fit {run}{theirs}: "
                            + "; ".join(parts) + fix)
    if settings:
        raise TrainingError(f"{source.where()}: its model has the same tensors as {run} and "
                            f"computes otherwise{theirs}{fix}")
    return tied


def _more(names: list, named: int) -> str:
    left = len(names) - named
    return "" if left <= 0 else f" (and {left} more)"


def _arg(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def _differ(source: Source, cfg, vocab: int) -> list[tuple[str, object, object]]:
    """[(field, SOURCE's value, the run's)] of the model settings that differ but are not
    FREE; [] where SOURCE records none."""
    if source.config is None:
        return []
    try:
        theirs = _settings(archs.config(source.family, **{**source.config,
                                                          "vocab_size": vocab}))
    except (TypeError, ValueError):  # a field archs has no more: the tensors say the rest
        return []
    ours = _settings(archs.config(cfg.model, **{**cfg.model_overrides, "vocab_size": vocab}))
    return [(k, theirs[k], ours[k]) for k in ours
            if k not in FREE and not k.endswith("_coef") and theirs.get(k) != ours[k]]


def _settings(config) -> dict:
    """A model config's fields as they count: a width the config resolves (MoE's d_expert,
    None: its expert_width) as the width."""
    out = asdict(config)
    if hasattr(config, "expert_width"):
        out["d_expert"] = config.expert_width
    return out
