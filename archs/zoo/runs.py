"""A trained run, loaded: what `zoo export`, `zoo generate` and `zoo eval` start from.

    trained = load_run(Path("runs/x"), step=None)   # the newest sound checkpoint
    trained.model, trained.tokenizer, trained.seq, trained.step, trained.train_config

`zoo export --to hf` (every family: archs/zoo/hf_export.py) and `--to safetensors`
(`archs.save`, which `archs.load` reads) write it out.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

import archs
from longpack import TrainingError
from training.checkpoints import checkpoint


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


def load_run(run: Path, step: int | None = None, say=checkpoint.warn) -> TrainedRun:
    """RUN's newest sound checkpoint (`say` is told of each one skipped), or step-N's. The
    tokenizer is the one the build's manifest names, when it loads here."""
    if step is None:
        found = checkpoint.load_latest(run, say)
        if found is None:
            raise TrainingError(f"{run}: no complete checkpoint (step-NNNNNNNN/ with COMPLETE); "
                                "pass the --out of a train run")
    else:
        steps = [int(p.name[5:]) for p in checkpoint.checkpoints(run)]
        have = (f"its complete checkpoints are of steps {', '.join(map(str, steps))}" if steps
                else f"{run} has no complete checkpoint")
        found = checkpoint.load(run / f"step-{step:08d}", f"--step {step}:",
                                f"{have}; pass one of them, or no --step for the newest")
    state, path = found
    name = state["config"]["model"]
    overrides = state.get("model_config") or {}
    weights = checkpoint.model_state(found)
    try:  # the vocabulary is the weights' (model_config is newer than some checkpoints)
        vocab = weights["embed.weight"].shape[0]
        model = archs.build(name, **{**overrides, "vocab_size": vocab})
        model.load_state_dict(weights)  # a Mamba refuses its LayerNorm of before (archs.mamba)
    except archs.mamba.OutdatedWeights as e:
        raise TrainingError(f"{path} holds {e}") from None
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise TrainingError(f"{path}: its model ({name}) cannot be built here "
                            f"({str(e).strip().splitlines()[0]})") from None
    model.eval()
    manifest = _manifest(state["config"].get("shards"))
    # checkpoints record the build's tokenizer; older ones only where the build still is
    trained_on = state.get("tokenizer") or (manifest or {}).get("tokenizer")
    return TrainedRun(model, _tokenizer(manifest), trained_on, state.get("seq"), path,
                      state.get("step"), state.get("config"), state.get("fingerprint"))


def _manifest(shards: str | list | None) -> dict | None:
    """The manifest of the run's build (a mixture's first source's: they share the tokenizer),
    or None when it is not here."""
    from longpack import LongpackError
    from pipeline import parse_mixture

    try:
        first = parse_mixture([shards] if isinstance(shards, str) else shards, None, (), ())
        manifest = json.loads((Path(first[0][0][1]) / "manifest.json").read_text())
        return manifest if isinstance(manifest.get("tokenizer"), dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, LongpackError):
        return None


def _tokenizer(manifest: dict | None):
    """The build's tokenizer (pipeline.tokenize.tokenizer.Tokenizer), or None when its file is not
    here (or the build records none: pack import without --tokenizer)."""
    from longpack import LongpackError
    from pipeline import load_tokenizer

    source = (manifest or {}).get("tokenizer", {}).get("source")
    if source is None:
        return None
    try:
        return load_tokenizer(source)
    except (OSError, ValueError, LongpackError):
        return None


def export_run(cfg) -> tuple:
    """`zoo export` (an ExportConfig, archs/zoo/settings.py): RUN's model (its newest sound
    checkpoint, or step-N's) written to --out, a new or empty directory. Returns the model and
    notes for the user (what could not be written)."""
    from archs.zoo.hf_export import DEFAULT_LICENSE, export_hf
    from archs.zoo.hf_folder import refuse_taken, staged

    out = Path(cfg.out)
    refuse_taken(out)  # before the checkpoint is read
    trained = load_run(Path(cfg.run), cfg.step)
    if cfg.to == "hf":
        return trained.model, export_hf(trained, out, cfg.license or DEFAULT_LICENSE,
                                        cfg.max_shard_size or "5GB", cfg.dtype)
    with staged(out) as folder:
        archs.save(trained.model, folder)
    return trained.model, []
