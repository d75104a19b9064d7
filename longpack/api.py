"""longpack from Python: each command as a function, with the command's settings as keyword
arguments (named as its flags, with _) and its errors (LongpackError and its kinds; never
SystemExit, never a printed progress bar unless asked).

    import longpack

    manifest = longpack.build(inputs=["../shared/data/fineweb-edu-sample"], seq=2048,
                              tokenizer="../shared/tokenizers/gpt2.tiktoken", out="./mds")
    report = longpack.stats("./mds", verify=True)         # `pack stats --json`'s dict
    history = longpack.train(shards="./mds", out="./run", model="neox-tiny", max_steps=20)
    longpack.export("./run", "./hf")                       # zoo export --to hf

An unknown setting is a SettingsError naming the nearest known one, as a config file's is.
"""

import dataclasses
from pathlib import Path

from longpack.errors import LongpackError, SettingsError


def _config(cls, settings: dict, command: str, synonyms: dict | None = None):
    """cls(**settings): an unknown name refused in one line with the nearest known one (or the
    setting another tool's name means, `synonyms`: as a config file's keys are), a value
    of the wrong type in one line naming the setting; a path may be a Path, a list of them a
    list or one path."""
    from longpack.settings import suggest

    fields = {f.name: f for f in dataclasses.fields(cls)}
    given = {}
    for name, value in settings.items():
        if name not in fields:
            near = suggest(name, list(fields), synonyms)
            raise SettingsError(f"{name!r} is not a setting of {command}"
                                + (f"; did you mean {near!r}?" if near else ""))
        parses_text = fields[name].metadata.get("callback") is not None  # a size: "500MB"
        given[name] = value if parses_text and isinstance(value, str) else _typed(
            name, value, fields[name].type)
    missing = [n for n, f in fields.items() if n not in given
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise SettingsError(f"{command} needs {', '.join(f'{n}=...' for n in missing)}")
    return cls(**given)


def _callable(name: str, value):
    if not callable(value):
        raise SettingsError(f"{name}={value!r}: give a function taking one line of text")
    return value


def _typed(name: str, value, annotation):
    """`value` as the setting's type takes it (Path -> str, a list or one item -> a tuple), or
    SettingsError naming the setting and the type it takes."""
    import os
    import typing

    kinds = set(typing.get_args(annotation)) or {annotation}
    if value is None and type(None) in kinds:
        return None
    if typing.get_origin(annotation) is tuple:
        items = [value] if isinstance(value, str | os.PathLike) else value
        if not isinstance(items, list | tuple):
            raise SettingsError(f"{name}: give a list of values, not {value!r}")
        return tuple(_typed(name, v, str) for v in items)
    if str in kinds and isinstance(value, os.PathLike):
        return os.fspath(value)
    wanted = [k for k in (bool, int, float, str) if k in kinds]
    ok = any(isinstance(value, k) and not (k in (int, float) and isinstance(value, bool))
             or k is float and isinstance(value, int) and not isinstance(value, bool)
             for k in wanted)
    if wanted and not ok:
        raise SettingsError(f"{name}={value!r}: {name} takes "
                            f"{' or '.join(k.__name__ for k in wanted)}")
    return float(value) if float in wanted and isinstance(value, int) else value


def build(progress: bool = False, **settings) -> dict:
    """`pack build`: BuildConfig's settings (what the output is) and LaunchConfig's (where it
    runs: engine, ray_address, ...). Returns the manifest; a build that was complete already
    is returned as it is, nothing written."""
    from pipeline.config import BuildConfig
    from pipeline.distribute.launch import LaunchConfig, launch
    from pipeline.store.destination import Destination

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
    from pipeline.distribute import tasks

    return tasks.merge(Path(_typed("out", out, str)))


def import_tokens(src, out, **settings) -> dict:
    """`pack import SRC --out OUT`: others' token rows (.npy, .pt, nanoGPT .bin) as a build;
    the manifest. Warnings go to `warn` (a callable; default: none)."""
    from pipeline.adopt.config import ImportConfig
    from pipeline.adopt.import_tokens import import_tokens as run_import

    warn = _callable("warn", settings.pop("warn", lambda line: None))
    cfg = _config(ImportConfig, {"src": src, "out": out, **settings}, "pack import")
    return run_import(cfg, warn=warn)


def stats(path, verify: bool = False, throughput: float | None = None,
          budget: float | None = None, eos_id: int | None = None) -> dict:
    """`pack stats PATH --json`: the report as a dict (keys in docs/STATS.md); its
    ["checks"]["ok"] says whether the build is sound."""
    from pipeline.stats import report
    from pipeline.stats.config import StatsConfig

    cfg = _config(StatsConfig, {"paths": (_typed("path", path, str),), "verify": verify,
                                "throughput": throughput, "budget": budget, "eos_id": eos_id},
                  "pack stats")
    return report.collect(cfg.paths[0], cfg.verify, cfg.throughput, cfg.budget, cfg.eos_id)


def train(resume: str = "auto", log=None, **settings) -> list[dict]:
    """`train`: TrainConfig's settings; returns the metrics history (one dict a step, as
    metrics.jsonl holds). `log` gets the console's lines (default: none)."""
    from training.config import SYNONYM_OF, TrainConfig
    from training.loop import train as run_training

    cfg = _config(TrainConfig, settings, "train", SYNONYM_OF)
    return run_training(cfg, resume=_typed("resume", resume, str),
                        log=_callable("log", log or (lambda line: None)))


def export(run, out, to: str = "hf", **settings) -> list[str]:
    """`zoo export RUN --to hf|safetensors --out OUT` (step, license, max_shard_size as its
    flags); returns notes for the user (what could not be written)."""
    from archs.zoo.runs import export_run
    from archs.zoo.settings import ExportConfig

    cfg = _config(ExportConfig, {"run": run, "out": out, "to": to, **settings}, "zoo export")
    return export_run(cfg)[1]
