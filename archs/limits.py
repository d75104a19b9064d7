"""The checked range of every field of the zoo's model configs, and the memory of a device.

Each config's `__post_init__` calls `check_fields(self, field=LIMIT, ...)` with a limit for
every one of its fields (a field without one is an error, so a new field cannot go unchecked),
then checks what ties fields together (divisibility, top_k <= n_experts, ...). So
`archs.config`, `archs.build`, `train --model-arg` and a config file's `[model]` table refuse the
same values with the same one line, a ValueError naming the field, the value and the range:

    d_model must be at least 1 (got -64)
    rotary_pct must be in [0, 1] (got 2.0)
    chunk must be in 1..1024 (got 4096): the scan's within-chunk product is chunk x chunk ...

A value's type is the field's annotation (`typed`): a bool is no number, a float where an int
goes is refused (1e9 from a TOML file is a float), an int where a float goes becomes that float,
None only where the annotation allows it. Floats must be finite (JSON's NaN and Infinity parse).

The commands' settings are held to the same rules by longpack/core/settings.py (`Range`, `typed`).
This file cannot import that one: it ships inside every exported model folder with the model
files (archs/hf/hf_remote.py), where longpack is not installed, so it keeps its own small copy
(tests/test_settings.py holds the two to the same answers).

Sizes have no upper bound here: whether a model fits is a question of its total size and of the
device, which `archs.build` answers before it allocates anything (archs/__init__.py). The few
upper bounds are where a value past them multiplies memory that no parameter count shows (a
Mamba chunk is a Q x Q product per head).
"""

import math
import os
import sys
import types
import typing
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Range:
    """A number in [low, high] (an open end excludes its value); None: unbounded."""
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
        """`whole`: the field is an int (its closed range reads 1..1024)."""
        if self.high is None:
            text = f"> {self.low}" if self.low_open else f"at least {self.low}"
        elif whole and not (self.low_open or self.high_open):
            text = f"in {self.low}..{self.high}"
        else:
            text = (f"in {'(' if self.low_open else '['}{self.low}, {self.high}"
                    f"{')' if self.high_open else ']'}")
        return text


@dataclass(frozen=True)
class Letters:
    """A non-empty string of the letters `allowed` (a layer pattern)."""
    allowed: str
    rule: str

    def holds(self, value) -> bool:
        return bool(value) and not set(value) - set(self.allowed)

    def describe(self, whole: bool) -> str:
        return self.rule


class Flag:
    """True or false: its type is its whole range."""

    def holds(self, value) -> bool:
        return True

    def describe(self, whole: bool) -> str:
        return "true or false"


SIZE = Range(1)  # a count or a width
# pack import's bound too (pipeline/adopt/import_tokens.py MAX_VOCAB): an id past it is no token id
VOCAB = Range(1, 2**31 - 1)
EPS = Range(0, 1, low_open=True)  # a normalization's epsilon
STD = Range(0, low_open=True)  # an initialization's standard deviation
COEF = Range(0)  # a loss's weight
FRACTION = Range(0, 1)
FLAG = Flag()
CHUNK = Range(1, 1024, why="the scan's within-chunk product is chunk x chunk per head; "
              "Mamba-2 uses 256")


def check_fields(cfg, **limits) -> None:
    """Type and range of each field of the dataclass `cfg` (frozen: an int given for a float is
    stored as the float). ValueError at the first that fails; TypeError if a field has no limit
    or a limit no field (a mistake in the model file, not in the user's values)."""
    names = [f.name for f in fields(cfg)]
    if set(names) != set(limits):
        raise TypeError(f"{type(cfg).__name__}: fields without a limit "
                        f"{sorted(set(names) - set(limits))}, limits without a field "
                        f"{sorted(set(limits) - set(names))}")
    for f in fields(cfg):
        value = typed(f.name, getattr(cfg, f.name), f.type)
        object.__setattr__(cfg, f.name, value)
        limit = limits[f.name]
        if value is not None and not limit.holds(value):
            none = " or None" if type(None) in _kinds(f.type) else ""
            rule = limit.describe(int in _kinds(f.type))
            why = getattr(limit, "why", "")
            raise ValueError(f"{f.name} must be {rule}{none} (got {value!r})"
                             + (f": {why}" if why else ""))


def typed(name: str, value, annotation):
    """`value` as a field annotated `annotation` takes it: int, float, bool, str, or one of
    them or None. A whole number where a float goes becomes that float. ValueError naming the
    field otherwise."""
    kinds = _kinds(annotation)
    if value is None and type(None) in kinds:
        return None
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > sys.float_info.max:  # float() would raise OverflowError
            from decimal import Decimal

            raise ValueError(f"{name}: {Decimal(value):.3e} is past the largest number a float "
                             f"holds ({sys.float_info.max:.3g})")
        return float(value)
    wanted = [k for k in kinds if k is not type(None)]
    if any(isinstance(value, k) and (k is bool or not isinstance(value, bool)) for k in wanted):
        return value
    names = " or ".join(k.__name__ for k in wanted) + (" or None" if len(kinds) > len(wanted)
                                                       else "")
    whole = " (a whole number: no point, no exponent)" if int in kinds else ""
    raise ValueError(f"{name}: {value!r} is not a {names}{whole}")


def _kinds(annotation) -> tuple:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def device_memory(device) -> int | None:
    """Bytes of memory of a torch device: a GPU's total, the machine's RAM for the CPU (or the
    container's limit when lower: cgroup v2 memory.max, v1 memory.limit_in_bytes); None for
    the meta device and devices whose memory is not known here (nothing is checked)."""
    import torch

    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None  # torch says so itself when the model is put there
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory
    if device.type != "cpu":
        return None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
