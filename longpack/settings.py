"""Settings declared once: a dataclass field carries its flag's help, choices and form, and
`click_options` makes the command line from the dataclass (`pack build`'s BuildConfig and
`train`'s TrainConfig alike). Validation lives in the dataclass, so a config file, the command
line and a Python caller get the same checks and the same one-line SettingsError.

    seq: int = setting(32768, "Tokens per row.", role="output")
    format: str = setting("mds", "mds or memmap.", choices=FORMATS, role="output")

Each setting declares its role once (ROLES), and every list of settings (a build's
fingerprint, its manifest, a task's record, the flags a launcher repeats) is `settings_of` or
`to_flags` of some roles, never a list kept by hand.
"""

import dataclasses
from collections.abc import Callable
from typing import get_args

ROLES = {
    "output": "shapes the output's bytes: in the fingerprint, the manifest, every repeat",
    "recorded": "how it ran, not what it made (workers, engine): in the manifest, not the "
                "fingerprint",
    "run": "where and how the command runs (paths, task count): repeated by tasks and "
           "launchers, not recorded in the manifest",
    "once": "this invocation only (--overwrite, --task-index): never repeated nor recorded",
}
_FORM = {"flag": None, "choices": None, "multiple": False, "switch": False,
         "show_default": True, "metavar": None, "argument": False, "min": None, "max": None,
         "min_open": False, "callback": None}


def setting(default=dataclasses.MISSING, help: str = "", *, factory: Callable | None = None,
            role: str = "run", **form) -> dataclasses.Field:
    """A dataclass field and its flag. `role`: one of ROLES. `form` (all optional): flag
    (default --field-name), choices, multiple (a repeatable flag, the field a tuple), switch (a
    bool given as a bare --flag, not --flag/--no-flag), show_default (True, False or the text
    to show), metavar, argument (a positional argument, not a flag), min / max / min_open (the
    range of numbers the flag takes: click refuses others as a usage error; the dataclass
    checks it for every caller), callback (click's: parses the flag's text)."""
    unknown = set(form) - set(_FORM)
    if unknown:
        raise TypeError(f"setting(): unknown {', '.join(sorted(unknown))}")
    if role not in ROLES:
        raise TypeError(f"setting(): role {role!r} is not one of {', '.join(ROLES)}")
    metadata = {"help": " ".join(help.split()), "role": role, **_FORM, **form}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _value_type(annotation):
    """int for `int` and `int | None`, str for anything else but float and bool."""
    kinds = [t for t in (annotation, *get_args(annotation)) if t in (int, float, bool)]
    return kinds[0] if kinds else str


_KINDS = {int: ((int,), "a whole number"), float: ((int, float), "a number"),
          bool: ((bool,), "true or false"), str: ((str, int, float), "text")}


def check_file_values(config_class, values: dict, where: str) -> None:
    """Values a config file gives the flags of `config_class` (TOML/YAML types), each of its
    field's kind: click would otherwise cast them quietly (2.5 steps -> 2, true -> 1) or fail
    on a list with a traceback. Text is left to the flag's own parsing."""
    from longpack.errors import SettingsError

    fields = {f.name: f for f in dataclasses.fields(config_class)}
    for name, value in values.items():
        f = fields.get(name)
        if f is None:
            continue
        kind = _value_type(f.type) if f.metadata.get("callback") is None else str
        types, said = _KINDS[kind]
        items = value if f.metadata.get("multiple") and isinstance(value, list) else [value]
        for item in items:
            if item is None and type(None) in get_args(f.type):
                continue
            if isinstance(item, str) or (isinstance(item, types)
                                         and (kind is bool or not isinstance(item, bool))):
                continue
            raise SettingsError(f"{where}: {name} = {item!r} is not {said}"
                                + (" (one value or a list of them)" if f.metadata.get("multiple")
                                   else ""))


def click_options(config_class, **option_classes) -> Callable:
    """A decorator adding one click option per field of `config_class`, in field order; each
    lands in the command's keyword arguments under the field's name. `option_classes` gives a
    field's option a click.Option subclass of the command's own (e.g. shards=_Shards)."""

    def decorate(func):
        for f in reversed(dataclasses.fields(config_class)):
            func = _option(f, option_classes.get(f.name))(func)
        return func

    return decorate


def _option(f: dataclasses.Field, option_class):
    import click  # here: a config module imports this file without needing click

    m = f.metadata
    if m["argument"]:  # multiple: one or more
        return click.argument(f.name, metavar=m["metavar"] or f.name.upper(),
                              nargs=-1 if m["multiple"] else 1, required=True)
    flag = m["flag"] or "--" + f.name.replace("_", "-")
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    kw = {"help": m["help"] or None, "metavar": m["metavar"]}
    if m["callback"] is not None:
        kw["callback"] = m["callback"]
    if option_class is not None:
        kw["cls"] = option_class
    if required:
        kw["required"] = True
    else:
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if isinstance(default, tuple) and not m["multiple"]:  # a list given comma-separated
            default = ",".join(default)
        kw["default"] = default
        kw["show_default"] = m["show_default"] if default is not None else False
    kind = _value_type(f.type)
    if kind is bool:
        decls = [flag] if m["switch"] else [f"{flag}/--no-{flag[2:]}"]
        return click.option(*decls, f.name, is_flag=m["switch"] or None, **kw)
    if m["callback"] is not None:  # it parses the text
        kw["type"] = click.STRING
    elif m["choices"]:
        kw["type"] = click.Choice(m["choices"])
    elif m["min"] is not None or m["max"] is not None:
        bounds = {"min": m["min"], "max": m["max"]}
        kw["type"] = (click.IntRange(**bounds) if kind is int
                      else click.FloatRange(**bounds, min_open=m["min_open"]))
    else:
        kw["type"] = kind
    return click.option(flag, f.name, multiple=m["multiple"], **kw)


def settings_of(config, *roles: str) -> dict:
    """{name: value} of `config`'s fields of these roles, in field order."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.metadata.get("role") in roles}


def to_flags(config, skip: tuple[str, ...] = (), roles: tuple[str, ...] = tuple(ROLES)
             ) -> list[str]:
    """The command-line flags that give back `config`'s fields of `roles` (but those in
    `skip`), the inverse of click_options: how a launcher (Slurm's batch script) repeats a
    command."""
    flags = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in skip or f.metadata.get("role") not in roles or value is None:
            continue
        if f.metadata["argument"]:
            flags.append(str(value))
            continue
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            if value or not f.metadata["switch"]:
                flags.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, tuple):
            if f.metadata["multiple"]:
                for item in value:
                    flags += [flag, str(item)]
            else:
                flags += [flag, ",".join(map(str, value))]
        else:
            flags += [flag, repr(value) if isinstance(value, float) else str(value)]
    return flags


def suggest(name: str, known, synonyms: dict | None = None) -> str | None:
    """The known name nearest to an unknown one: its synonym in another tool's vocabulary
    (`synonyms`, other -> known: gradient_accumulation_steps -> grad_accum), else a known name
    it begins with or that begins with it (sequence -> seq), else the one whose name or synonym
    is closest in spelling (difflib: warmup_step -> warmup), else None."""
    import difflib

    synonyms = synonyms or {}
    # each spelling that leads to a known name: the names themselves, then their synonyms
    leads = {**{other: k for other, k in synonyms.items() if k in known}, **{k: k for k in known}}
    key = name.strip().lower().replace("-", "_")
    if key in leads:
        return leads[key]
    prefixed = [k for k in known if len(k) >= 3 and (key.startswith(k) or k.startswith(key))]
    if prefixed:
        return max(prefixed, key=len)
    close = difflib.get_close_matches(key, sorted(leads), n=1, cutoff=0.75)
    return leads[close[0]] if close else None
