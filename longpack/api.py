"""longpack from Python: each command as a function, with the command's settings as keyword
arguments (named as its flags, with _) and its errors (LongpackError and its kinds; never
SystemExit; a build's progress bar only with progress=True; `train` prints the console's lines
unless given another `log`).

    import longpack

    manifest = longpack.build(dataset="fineweb-edu-sample", seq=2048, out="./mds")  # offline
    report = longpack.stats("./mds", verify=True)         # `pack stats --json`'s dict
    plan = longpack.plan(shards="./mds", model="neox-tiny", max_steps=20)   # train --dry-run
    history = longpack.train(shards="./mds", out="./run", model="neox-tiny", max_steps=20)
    longpack.export("./run", "./hf")                       # zoo export --to hf

An unknown setting is a SettingsError naming the nearest known one, as a config file's is.
"""

import dataclasses
from pathlib import Path

from longpack.core import LongpackError, SettingsError


def _config(cls, settings: dict, command: str):
    """cls(**settings), the dataclass checking each value as its flag's (longpack/core/settings.py);
    every unknown name refused at once, each with the nearest known one, as a config file's
    keys are. A value is checked first under the keyword the caller wrote (`train:
    val_fraction = '0.1' is not a number`, not the flag's name); text (a path, a URL, a
    size) is text or a Path, never a number cast to text."""
    from longpack.core import check_values, kinds, refuse_unknown

    fields = {f.name: f for f in dataclasses.fields(cls)}
    refuse_unknown(settings, fields, command, answers=_answers(cls))
    missing = [n for n, f in fields.items() if n not in settings
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise SettingsError(f"{command} needs {', '.join(f'{n}=...' for n in missing)}")
    for name, value in settings.items():
        allowed = kinds(fields[name].type)
        if allowed and str in allowed and not {int, float} & set(allowed) and isinstance(
                value, int | float):
            raise SettingsError(f"{command}: {name}={value!r}: give {name} as text or a Path")
    return cls(**check_values(cls, settings, command))


def _answers(cls) -> dict[str, str]:
    """Other trainers' names for a train keyword, answered with ours (training/names.py)."""
    from longpack.training import TrainConfig

    if cls is not TrainConfig:
        return {}
    from longpack.training import name_answers

    return name_answers()


def _callable(name: str, value):
    if not callable(value):
        raise SettingsError(f"{name}={value!r}: give a function taking one line of text")
    return value


def _text(name: str, value) -> str:
    """A path given as text or a Path; SettingsError otherwise."""
    import os

    if not isinstance(value, str | os.PathLike):
        raise SettingsError(f"{name}={value!r}: give {name} as text or a Path")
    return os.fspath(value)


def build(progress: bool = False, **settings) -> dict:
    """`pack build`: BuildConfig's settings (what the output is) and LaunchConfig's (where it
    runs: engine, ray_address, ...). Returns the manifest; a build that was complete already
    is returned as it is, nothing written."""
    from longpack.pipeline import BuildConfig, Destination, LaunchConfig, launch

    where = {f.name for f in dataclasses.fields(LaunchConfig)}
    how = _config(LaunchConfig, {k: v for k, v in settings.items() if k in where}, "pack build")
    cfg = _config(BuildConfig, {k: v for k, v in settings.items() if k not in where},
                  "pack build")
    outcome = launch(cfg, how, progress, Destination.of(cfg))
    if outcome.exit_code or outcome.manifest is None:
        raise LongpackError(outcome.message or f"pack build of {cfg.out} did not complete "
                            f"(exit status {outcome.exit_code})")
    return outcome.manifest


def merge(out) -> dict:
    """`pack merge OUT`: finish a build split into tasks once its tasks are done; the
    manifest."""
    from longpack.pipeline import merge_tasks

    return merge_tasks(Path(_text("out", out)))


def import_tokens(src, out, **settings) -> dict:
    """`pack import SRC --out OUT`: others' token rows (.npy, .pt, nanoGPT .bin) as a build;
    the manifest. Warnings go to `warn` (a callable; default: none)."""
    from longpack.pipeline import ImportConfig
    from longpack.pipeline import import_tokens as run_import

    warn = _callable("warn", settings.pop("warn", lambda line: None))
    cfg = _config(ImportConfig, {"src": src, "out": out, **settings}, "pack import")
    return run_import(cfg, warn=warn)


def stats(path, verify: bool = False, throughput: float | None = None,
          budget: float | None = None, eos_id: int | None = None) -> dict:
    """`pack stats PATH --json`: the report as a dict (keys in docs/STATS.md); its
    ["checks"]["ok"] says whether the build is sound."""
    from longpack.pipeline import StatsConfig, collect_stats

    cfg = _config(StatsConfig, {"paths": (_text("path", path),), "verify": verify,
                                "throughput": throughput, "budget": budget, "eos_id": eos_id},
                  "pack stats")
    return collect_stats(cfg.paths[0], cfg.verify, cfg.throughput, cfg.budget, cfg.eos_id)


def train(resume: str = "auto", log=print, **settings) -> list[dict]:
    """`train`: TrainConfig's settings; returns the metrics history (one dict a step, as
    metrics.jsonl holds). `log` gets the console's lines, as `train` prints them (default:
    printed; `log=lambda line: None` for none): a run says what it does before its first step."""
    from longpack.training import TrainConfig
    from longpack.training import train as run_training

    cfg = _config(TrainConfig, settings, "train")
    return run_training(cfg, resume=_text("resume", resume),
                        log=_callable("log", log))


def plan(world_size: int | None = None, gpu_memory: float = 80.0, log=print,
         **settings) -> dict:
    """`train --dry-run` (TrainConfig's settings; `world_size`, `gpu_memory` in GiB as its
    flags): the plan as `--json` gives it; `log` gets its lines (default: printed)."""
    from longpack.training import TrainConfig
    from longpack.training import plan as dry_run

    cfg = _config(TrainConfig, settings, "train")
    return dry_run(cfg, say=_callable("log", log), world_size=world_size,
                   gpu_memory=int(gpu_memory * 2**30))


def export(run, out, to: str = "hf", **settings) -> list[str]:
    """`zoo export RUN --to hf|safetensors --out OUT` (step, license, max_shard_size as its
    flags); returns notes for the user (what could not be written)."""
    from longpack.zoo import ExportConfig, export_run

    cfg = _config(ExportConfig, {"run": run, "out": out, "to": to, **settings}, "zoo export")
    return export_run(cfg)[1]
