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

An unknown setting is a SettingsError naming the nearest known one, as a config file's is;
a settings error names the keywords where the command names its flags (`train: min_lr=1.0 is
above lr=0.0003`), and a path, alone or in a list, is text or a Path, never a number.
"""

import dataclasses
import os
import re
from pathlib import Path

from longpack.core import LongpackError, SettingsError


def _config(cls, settings: dict, command: str):
    """cls(**settings), the dataclass checking each value as its flag's (longpack/core/settings.py);
    every unknown name refused at once, each with the nearest known one, as a config file's
    keys are. A value is checked first under the keyword the caller wrote (`train:
    val_fraction = '0.1' is not a number`, not the flag's name), and a rule that ties settings
    together says the keywords too (`_as_keywords`)."""
    from longpack.core import check_values, refuse_unknown

    fields = {f.name: f for f in dataclasses.fields(cls)}
    refuse_unknown(settings, fields, command, answers=_answers(cls))
    missing = [n for n, f in fields.items() if n not in settings
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise SettingsError(f"{command} needs {', '.join(f'{n}=...' for n in missing)}")
    _refuse_numbers(fields, settings, command)
    values = check_values(cls, settings, command)
    try:
        return cls(**values)
    except SettingsError as e:  # a config's rules are written once, with its flags
        raise type(e)(f"{command}: {_as_keywords(str(e), fields, values)}") from None


def _refuse_numbers(fields: dict, settings: dict, command: str) -> None:
    """Text (a path, a URL, a size) is text or a Path, never a number cast to text as a
    config file's may be (out=123 would build ./123); so is each item of a list of paths
    (`setting(path=True)`: shards=[S, 5] would read ./5)."""
    from longpack.core import kinds

    for name, value in settings.items():
        f, allowed = fields[name], kinds(fields[name].type)
        if f.metadata.get("path") and isinstance(value, list | tuple):
            for i, item in enumerate(value):
                if not isinstance(item, str | os.PathLike):
                    raise SettingsError(f"{command}: {name}[{i}]={item!r}: give each of {name} "
                                        "as text or a Path")
        elif isinstance(value, int | float) and (f.metadata.get("path") or str in allowed
                                                 and not {int, float} & set(allowed)):
            raise SettingsError(f"{command}: {name}={value!r}: give {name} as text or a Path")


# A flag in a message (--min-lr, --no-tokenizer) and what is written after it: a quoted text,
# a number (1.0, 3e-05, 32,768) or a word (cosine-restarts, zstd:9, /data/out; not hf in hf's)
_FLAG = re.compile(r"(?<![\w-])--(?P<no>no-)?(?P<flag>[a-z][a-z0-9-]*)(?: (?:"
                   r"(?P<value>'[^']*'|-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?)"
                   r"|(?P<word>(?!-)[\w.:/~-]*\w))(?![\w']))?")


def _as_keywords(message: str, fields: dict, values: dict) -> str:
    """A config's message, written with its flags, as a Python caller reads it: each flag of
    one of `fields` said as its keyword, with its value where one follows (`--min-lr 1.0 is
    above --lr 0.0003`: `min_lr=1.0 is above lr=0.0003`; `--fsdp`: `fsdp=True`;
    `--no-tokenizer`: `tokenizer=False`). A word after a flag is its value only when it is one
    of the setting's choices or the value the caller gave (`--upload is for` is not); a flag of
    no field (another command's) stays a flag."""
    import typing

    from longpack.core import flag_of, kinds

    by_flag = {flag_of(f): f for f in fields.values()
               if "role" in f.metadata and not f.metadata["argument"]}

    def said(m: re.Match) -> str:
        f = by_flag.get("--" + m["flag"])
        rest = m[0][m.end("flag") - m.start():]  # what follows the flag, as it was
        if f is None or m["no"] and bool not in kinds(f.type):
            return m[0]
        if bool in kinds(f.type):
            return f"{f.name}={not m['no']}{rest}"
        if typing.get_origin(f.type) is tuple:  # a list's item follows, not the setting
            return f.name + rest
        if m["value"]:
            return f"{f.name}={m['value']}"
        if m["word"] and m["word"] in (*(f.metadata["choices"] or ()), str(values.get(f.name))):
            return f"{f.name}={m['word']!r}"
        return f.name + rest

    return _FLAG.sub(said, message)


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
