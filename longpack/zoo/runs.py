"""A trained run, loaded: what `zoo export`, `zoo generate` and `zoo eval` start from.

    trained = load_run(Path("runs/x"), step=None)   # the newest sound checkpoint
    trained.model, trained.tokenizer, trained.seq, trained.step, trained.train_config

The tokenizer is the build's own copy (BUILD/tokenizer.tiktoken or tokenizer.json, which its
manifest names beside the file's sha256), else the file the manifest says the build read (a
build of before the copy); either only with the sha256 the build recorded. The build is where
the run read it, or where `shards` says it is now (moved); either is held to the tokenizer the
checkpoint recorded, whatever the folder now holds: a build of another tokenizer, or one whose
copy was replaced, gives no tokenizer, and `other_tokenizer` says why, naming both sha256s
(checkpoints of before the record: nothing to hold it to). When no tokenizer loads,
`tokenizer_problem` says why in words an error can quote.

`zoo export --to hf` (every family: longpack/zoo/hf_export.py) and `--to safetensors`
(`archs.save`, which `archs.load` reads) write it out.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from longpack import archs
from longpack.core import TrainingError
from longpack.pipeline import other_tokenizer
from longpack.training import model_state, read_checkpoint


@dataclass
class TrainedRun:
    """A run's model and what it was trained on (`load_run`)."""
    model: torch.nn.Module  # in eval mode
    tokenizer: object | None  # the build's pipeline Tokenizer, when it loads here
    trained_on: dict | None  # the build manifest's "tokenizer" (None: not recorded, build gone)
    seq: int | None  # the sample length it trained on
    checkpoint: Path
    step: int | None = None  # the optimizer steps the checkpoint holds
    train_config: dict | None = None  # the run's settings (TrainConfig's fields), as saved
    fingerprint: str | None = None  # of the build (or mixture) it trained on
    tokenizer_problem: str | None = None  # why `tokenizer` is None, in a few words
    other_tokenizer: str | None = None  # the build is not of the recorded tokenizer: why
    began_from: dict | None = None  # the weights the run started from (train --init-from)


def load_run(run: Path, step: int | None = None, say=None,
             shards: str | None = None) -> TrainedRun:
    """RUN's newest sound checkpoint (`say` is told of each one skipped: stderr by default), or
    step-N's. The tokenizer is the one the build's manifest names, when it loads here and is the
    one the checkpoint recorded; `shards`: the build's place now (zoo --shards), for the run's."""
    found = read_checkpoint(run, step, say)
    state, path = found
    name = state["config"]["model"]
    overrides = state.get("model_config") or {}
    weights = model_state(found)
    try:  # the vocabulary is the weights' (model_config is newer than some checkpoints)
        vocab = weights["embed.weight"].shape[0]
        model = archs.build(name, **{**overrides, "vocab_size": vocab})
        model.load_state_dict(weights)  # a Mamba refuses its LayerNorm of before (longpack.archs.mamba)
    except archs.mamba.OutdatedWeights as e:
        raise TrainingError(f"{path} holds {e}") from None
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise TrainingError(f"{path}: its model ({name}) cannot be built here "
                            f"({str(e).strip().splitlines()[0]})") from None
    model.eval()
    moved = shards is not None
    shards = shards if moved else state["config"].get("shards")
    folder, manifest = _build(shards)
    # checkpoints record the build's tokenizer; older ones only where the build still is
    recorded = state.get("tokenizer")
    trained_on = recorded or (manifest or {}).get("tokenizer")
    other = other_tokenizer(recorded, (manifest or {}).get("tokenizer"), folder,
                            _location(shards) or str(shards))
    if manifest is None:
        tokenizer, problem = None, (f"--shards {shards} holds no build (no manifest.json to read)"
                                    if moved else f"the build it trained on ({shards}) is not "
                                    "here (no manifest.json to read)")
    elif other:
        tokenizer, problem = None, other
    else:
        tokenizer, problem = _tokenizer(manifest, folder)
    return TrainedRun(model, tokenizer, trained_on, state.get("seq"), path,
                      state.get("step"), state.get("config"), state.get("fingerprint"),
                      problem, other, state.get("began_from"))


def _location(shards: str | list | None) -> str | None:
    """Where the run's build is (a mixture's first source's: they share the tokenizer), or
    None when `shards` names none."""
    from longpack.core import LongpackError
    from longpack.pipeline import parse_mixture

    try:
        return parse_mixture([shards] if isinstance(shards, str) else shards, None, (), ())[0][0][1]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, LongpackError):
        return None


def _build(shards: str | list | None) -> tuple[Path | None, dict | None]:
    """The folder and manifest of the run's build (a mixture's first source's: they share the
    tokenizer), or (None, None) when it is not here."""
    from longpack.core import DataError, LongpackError, Store, is_url
    from longpack.pipeline import fetch_kept, manifest_lacks

    location = _location(shards)
    if location is None:
        return None, None
    try:
        if is_url(location):  # a build in a bucket: its manifest, and its tokenizer's copy cached
            store = Store(location)
            manifest = json.loads(store.read_bytes("manifest.json"))
        else:
            manifest = json.loads((Path(location) / "manifest.json").read_text())
    except (OSError, ValueError, LongpackError):
        return None, None
    lacks = manifest_lacks(manifest)
    if lacks:  # a build is there, whose manifest would be misread: said, not passed over
        raise DataError(f"{location}/manifest.json: not a longpack manifest (no "
                        f"{', '.join(lacks)}); re-run the pack build that wrote it")
    if not is_url(location):
        return Path(location), manifest
    try:  # its tokenizer's copy, cached (a cache folder that cannot be written: not here)
        return fetch_kept(store, manifest["tokenizer"]) or Path(location), manifest
    except (LongpackError, OSError):
        return None, None


def _tokenizer(manifest: dict, folder: Path):
    """The build's tokenizer and None, or None and why it cannot be loaded here
    (longpack.pipeline.tokenize.tokenizer.load_build_tokenizer: its copy first, then its source)."""
    from longpack.pipeline import load_build_tokenizer

    return load_build_tokenizer(manifest["tokenizer"], folder)


def export_run(cfg) -> tuple:
    """`zoo export` (an ExportConfig, longpack/zoo/settings.py): RUN's model (its newest sound
    checkpoint, or step-N's) written to --out, a new or empty directory. Returns the model and
    notes for the user (what could not be written). `--to hf` without the build's tokenizer
    is refused before anything is written, unless --no-tokenizer."""
    from longpack.archs import refuse_taken, staged
    from longpack.zoo.hf_export import DEFAULT_LICENSE, export_hf

    out = Path(cfg.out)
    refuse_taken(out)  # before the checkpoint is read
    trained = load_run(Path(cfg.run), cfg.step, shards=cfg.shards)
    if cfg.to == "hf":
        if trained.other_tokenizer and cfg.tokenizer:
            raise TrainingError(f"{cfg.run}: {trained.other_tokenizer}: exported with the model, "
                                "it would give it ids it never learned; pass --shards with the "
                                "run's build where it is now, or --no-tokenizer to export the "
                                "model alone")
        if trained.tokenizer is None and cfg.tokenizer:
            raise TrainingError(f"{cfg.run}: no tokenizer to export with the model: "
                                f"{trained.tokenizer_problem}. Put the build's tokenizer back "
                                "(its --out, or the file it names), pass --shards with the "
                                "build's new place, or pass --no-tokenizer to export the model "
                                "alone")
        return trained.model, export_hf(trained, out, cfg.license or DEFAULT_LICENSE,
                                        cfg.max_shard_size or "5GB", cfg.dtype)
    with staged(out) as folder:
        archs.save(trained.model, folder)
    return trained.model, []
