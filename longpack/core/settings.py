"""Settings declared once: a dataclass field carries its flag's help, its type (the field's
annotation), its range and choices, and its form on the command line. From that one declaration
`click_options` makes the command's flags, `check` checks a config object however it was made
(flags, a config file, a Python caller), and `values_checked` checks a config file's values
before they become flags (`check_values` a Python caller's keywords), all with the same one-line
SettingsError naming the flag:

    seq: int = setting(32768, "Tokens per row.", min=2, role="output")
    format: str = setting("mds", "mds or memmap.", choices=FORMATS, role="output")

    def __post_init__(self):
        check(self)          # every field's type, range and choices
        ...                  # then only what ties fields together

A config's own rules (one field against another, the environment) follow `check` in its
__post_init__. Each setting declares its role once (ROLES), and every list of settings (a
build's fingerprint, its manifest, a task's record, the flags a launcher repeats) is
`settings_of` or `to_flags` of some roles, never a list kept by hand.

This is the project's own small checker rather than pydantic: the fields are plain frozen
dataclasses that pickle into worker processes and compare by value, their flags come from the
same metadata, and the messages name the flag a user typed (docs/STYLE.md).
"""

import dataclasses
import math
import os
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path

ROLES = {
    "output": "shapes the output's bytes: in the fingerprint, the manifest, every repeat",
    "recorded": "how it ran, not what it made (workers, engine): in the manifest, not the "
                "fingerprint",
    "run": "where and how the command runs (paths, task count): repeated by tasks and "
           "launchers, not recorded in the manifest",
    "once": "this invocation only (--overwrite, --task-index): never repeated nor recorded",
}
_FORM = {"flag": None, "choices": None, "multiple": False, "switch": False, "comma": False,
         "show_default": True, "metavar": None, "argument": False, "min": None, "max": None,
         "min_open": False, "max_open": False, "why": "", "callback": None, "path": False}


@dataclasses.dataclass(frozen=True)
class Range:
    """A number in [low, high] (an open end excludes its value); None: unbounded. Only finite
    numbers are in a range (JSON's NaN and Infinity parse)."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""  # said after the range when it is not obvious

    def holds(self, value) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self, whole: bool) -> str:
        """`whole`: the value is an int (its closed range reads 1..1024)."""
        finite = "" if whole else " and finite"
        if self.high is None:
            if self.low == 0 and self.low_open:
                return "positive" + finite
            return (f"above {self.low}" if self.low_open else f"at least {self.low}") + finite
        if self.low is None:
            return f"below {self.high}" if self.high_open else f"at most {self.high}"
        if whole and not (self.low_open or self.high_open):
            return f"in {self.low}..{self.high}"
        return (f"in {'(' if self.low_open else '['}{self.low}, {self.high}"
                f"{')' if self.high_open else ']'}")


def setting(default=dataclasses.MISSING, help: str = "", *, factory: Callable | None = None,
            role: str = "run", **form) -> dataclasses.Field:
    """A dataclass field and its flag. `role`: one of ROLES. `form` (all optional): flag
    (default --field-name), choices (a tuple field: each item's), min / max / min_open /
    max_open / why (the range of a number: Range), multiple (a repeatable flag, the field a
    tuple), comma (a tuple given as comma-separated text, on the command line or in a file),
    switch (a bool that is off unless given: a launcher repeats its --flag only when it is on;
    every bool has --flag and --no-flag), show_default (True, False or the text to show),
    metavar, argument (a positional argument, not a flag), callback (click's: parses the
    flag's text, which `check` then leaves to the config), path (text that names a file, a
    folder or a URL, each item's for a tuple: a Python caller's number there is refused
    rather than taken as a folder's name, longpack/api.py)."""
    unknown = set(form) - set(_FORM)
    if unknown:
        raise TypeError(f"setting(): unknown {', '.join(sorted(unknown))}")
    if role not in ROLES:
        raise TypeError(f"setting(): role {role!r} is not one of {', '.join(ROLES)}")
    metadata = {"help": " ".join(help.split()), "role": role, **_FORM, **form}
    if form.get("min") is not None or form.get("max") is not None:
        metadata["range"] = Range(form.get("min"), form.get("max"), form.get("min_open", False),
                                  form.get("max_open", False), form.get("why", ""))
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def kinds(annotation) -> tuple:
    """The types an annotation allows: (int,) for int, (int, NoneType) for int | None."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def typed(name: str, value, annotation, comma: bool = False):
    """`value` as a field annotated `annotation` takes it: bool, int, float, str, a tuple of
    str, or one of them or None. A whole number where a float goes becomes that float; a path
    (os.PathLike) or a number where text goes becomes text; one item or a list where a tuple goes
    becomes a tuple (`comma`: text items split at commas). ValueError naming `name` otherwise:
    a bool is no number, a float no whole number, a list no single value."""
    allowed = kinds(annotation)
    if value is None and type(None) in allowed:
        return None
    if typing.get_origin(annotation) is tuple:
        items = [value] if isinstance(value, str | os.PathLike | int | float) else value
        if not isinstance(items, list | tuple):
            raise ValueError(f"{name}: give a list of values, not {value!r}")
        items = [typed(name, item, str) for item in items]
        if comma:
            items = [part.strip() for item in items for part in item.split(",") if part.strip()]
        return tuple(items)
    wanted = [k for k in (bool, int, float, str) if k in allowed]
    if str in wanted and isinstance(value, os.PathLike):
        return os.fspath(value)
    if str in wanted and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # a path or a size in a config file may read as a number
    if float in wanted and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > sys.float_info.max:  # float() would raise OverflowError
            from decimal import Decimal  # formats the int in full precision, no float on the way

            raise ValueError(f"{name} = {Decimal(value):.3e} is past the largest number a "
                             f"float holds ({sys.float_info.max:.3g})")
        return float(value)
    if any(isinstance(value, k) and (k is bool or not isinstance(value, bool)) for k in wanted):
        return value
    said = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}
    raise ValueError(f"{name} = {value!r} is not " + " or ".join(said[k] for k in wanted))


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def checked(f: dataclasses.Field, value, name: str | None = None):
    """A setting's value typed (`typed`) and held to its range and choices; SettingsError
    naming the setting (`name`, default its flag) otherwise. A value for a `callback` flag may
    be its text, which the config parses."""
    from longpack.core.errors import SettingsError

    m, name = f.metadata, name or flag_of(f)
    if m.get("callback") is not None and isinstance(value, str):
        return value
    try:
        value = typed(name, value, f.type, comma=m.get("comma", False))
    except ValueError as e:
        raise SettingsError(str(e)) from None
    items = value if isinstance(value, tuple) else () if value is None else (value,)
    for item in items:
        if m.get("choices") and item not in m["choices"]:
            raise SettingsError(f"{name} {item!r}: choose "
                                + ("from" if isinstance(value, tuple) else "one of") + " "
                                + ", ".join(map(str, m["choices"])))
        limit = m.get("range")
        if limit is not None and not limit.holds(item):
            why = f": {limit.why}" if limit.why else ""
            raise SettingsError(f"{name} must be {limit.describe(isinstance(item, int))} "
                                f"(got {item!r}){why}")
    return value


def check(config) -> None:
    """Every setting of the frozen dataclass `config` typed and held to its declared range and
    choices, in field order: the first that fails is a SettingsError naming its flag."""
    for f in dataclasses.fields(config):
        if "role" in f.metadata:  # a setting()
            object.__setattr__(config, f.name, checked(f, getattr(config, f.name)))


def values_checked(config_class, values: dict, whole_floats: bool = False
                   ) -> tuple[dict, list[tuple[str, str]]]:
    """Values for `config_class`'s settings (a config file's, a Python caller's), checked as
    `check` checks them (a file's 2.5 is no number of steps, where click would cast it to 2):
    (the values typed, [(name, problem)] of every one that fails). `whole_floats`: a whole
    number written as a float (a file's 1e10, which YAML and TOML read as one) is that number
    where a whole number goes, which loses nothing."""
    from longpack.core.errors import SettingsError

    fields = {f.name: f for f in dataclasses.fields(config_class)}
    out, problems = {}, []
    for name, value in values.items():
        if name not in fields:
            out[name] = value
            continue
        wanted = kinds(fields[name].type)
        if (whole_floats and int in wanted and float not in wanted and isinstance(value, float)
                and value.is_integer() and abs(value) <= 2**53):  # exact as a float
            value = int(value)
        try:
            out[name] = checked(fields[name], value, name)
        except SettingsError as e:
            problems.append((name, str(e)))
    return out, problems


def check_values(config_class, values: dict, where: str) -> dict:
    """`values_checked`, or one SettingsError '{where}: ...' naming every value that fails."""
    from longpack.core.errors import SettingsError

    out, problems = values_checked(config_class, values)
    if problems:
        raise SettingsError(f"{where}: " + "; ".join(problem for _, problem in problems))
    return out


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
    flag = flag_of(f)
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
    kind = next((k for k in (bool, int, float) if k in kinds(f.type)), str)
    if kind is bool:  # --no-X too: a config file's `X = true` is then undone on the command line
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, **kw)
    # ranges are `check`'s: the command line then says what a config file and Python say
    if m["callback"] is not None or typing.get_origin(f.type) is tuple:  # text it parses
        kw["type"] = click.STRING
    elif m["choices"]:
        kw["type"] = click.Choice(m["choices"])
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
        flag = flag_of(f)
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


def suggest(name: str, known) -> str | None:
    """The known name nearest to an unknown one: a known name it begins with or that begins
    with it (sequence -> seq), else the closest in spelling (difflib: warmup_step -> warmup),
    else None."""
    import difflib

    key = name.strip().lower().replace("-", "_")
    prefixed = [k for k in known if len(k) >= 3 and (key.startswith(k) or k.startswith(key))]
    if prefixed:
        return max(prefixed, key=len)
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def refuse_unknown(names, known, where: str, prefix: str = "",
                   answers: dict[str, str] | None = None) -> None:
    """SettingsError naming every one of `names` that is not `known` at once, each with the
    nearest known one (`suggest`), or for a name `answers` has (another trainer's, whose
    near spelling would mislead: training/names.py), that answer: a config file's keys, a
    Python caller's keywords."""
    from longpack.core.errors import SettingsError

    unknown = sorted(set(names) - set(known))
    if unknown:
        answers = answers or {}
        named = [prefix + name + (f" ({answers[name]})" if name in answers else
                                  f" (did you mean {prefix}{near}?)"
                                  if (near := suggest(name, known)) else "")
                 for name in unknown]
        raise SettingsError(f"{where}: unknown setting{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(named)}")


# YAML 1.2's numbers in exponent form without a point (3e-4, 1e10), which PyYAML's YAML 1.1
# reads as text: the float resolver YAML 1.1 lacks, for plain scalars only (quoted stays text)
EXPONENT = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"


def _yaml_loader(yaml):
    """PyYAML's safe loader with numbers in exponent form read as numbers."""
    import re

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(EXPONENT),
                                 list("-+0123456789."))
    return Loader


def read_settings_file(path: str) -> dict:
    """A TOML or YAML file of settings (by its suffix) as a dict; SettingsError naming the file
    when it is not one."""
    from longpack.core.errors import SettingsError, install_hint

    text = Path(path).read_bytes()
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise SettingsError(f"a YAML --config needs PyYAML: {install_hint('yaml')}") from None
        try:
            data = yaml.load(text, Loader=_yaml_loader(yaml)) or {}
        except yaml.YAMLError as e:  # a reader's error too: bytes that are not text
            raise SettingsError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    else:
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise SettingsError("a TOML --config needs Python 3.11 or later; use YAML") from None
        try:
            data = tomllib.loads(text.decode())
        except UnicodeDecodeError as e:
            raise SettingsError(f"{path}: not valid TOML (not UTF-8 text: byte {e.start} is "
                                f"{text[e.start]:#04x})") from None
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"{path}: not valid TOML ({e})") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a table of settings")
    return data
