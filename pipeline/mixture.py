"""Data mixtures as the user writes them: named builds and the share of each (`train --shards
web=./fw --shards code=./code --mix web=0.7,code=0.3 --mix-stage 90%:web=0.2,code=0.8`, and
`pack stats A B --mix ...`). Parsing and validation only; how the trainer draws the rows is
training/data/mixture.py's.

    sources = parse_sources(["web=./fw", "./code"])        # [("web", "./fw"), ("code", "./code")]
    weights = parse_weights("web=7,code=3", ["web", "code"])   # {"web": 0.7, "code": 0.3}
    stage = parse_stage("90%:code=1", ["web", "code"])         # Stage(90.0, "%", {"web": 0, ...})

A bare path is named by its folder's name (the last part of a URL's path). Weights are any
non-negative numbers, divided by their sum; a source a mixture does not name gets 0. A stage
starts at a step (`8000`), after a number of tokens (`2e9tok`: the first step once that many
have been trained) or at a share of the run's steps (`90%`).
"""

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from longpack.core import SettingsError

# More epochs of a source than this gets a warning (`pack stats --mix --budget`, `train
# --dry-run`): up to about 4 repeats cost little against fresh data, beyond that the value of
# repeated tokens falls off fast (Muennighoff et al. 2023, "Scaling Data-Constrained Language
# Models").
REPEAT_WARNING_EPOCHS = 4
NAME = re.compile(r"[A-Za-z0-9_.-]+")
START = re.compile(r"(?P<number>\d+(\.\d*)?(e\d{1,2})?)(?P<unit>tok|%)?", re.IGNORECASE)


def good_name(name: str) -> bool:
    """Whether `name` may name a source: letters, digits, '_', '.', '-'."""
    return NAME.fullmatch(name) is not None


def source_name(path: str) -> str:
    """A bare --shards path's name: its folder's (a URL's last path part)."""
    return path.rstrip("/").rsplit("/", 1)[-1].split("://")[-1] or path


def parse_sources(values, what: str = "--shards") -> list[tuple[str, str]]:
    """(name, path) of each value of `what` (train's --shards, pack stats' PATHs), NAME=PATH
    or a bare path; names are unique."""
    out = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not good_name(name) or "://" in name:
            name, path = source_name(value), value
        if not path:
            raise SettingsError(f"{what} {value!r}: give NAME=PATH or a path")
        if not good_name(name):
            raise SettingsError(f"{what} {value}: its name {name!r} has characters other than "
                                f"letters, digits, '_', '.', '-'; name it: {what} NAME=PATH")
        if name in (n for n, _ in out):
            raise SettingsError(f"{what}: two sources are named {name!r}; name them: "
                                f"{what} NAME=PATH")
        out.append((name, path))
    if not out:
        raise SettingsError(f"{what}: give at least one build")
    return out


def parse_weights(text: str, names: list[str], what: str = "--mix") -> dict[str, float]:
    """NAME=WEIGHT,... as a share per source (summing to 1; 0 for a source not named)."""
    given = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, number = part.partition("=")
        if not sep:
            raise SettingsError(f"{what} {text!r}: {part!r} is not NAME=WEIGHT (e.g. "
                                f"{names[0]}=0.7)")
        if name not in names:
            raise SettingsError(f"{what}: no source is named {name!r}; the sources: "
                                f"{', '.join(names)}")
        if name in given:
            raise SettingsError(f"{what}: {name} has two weights")
        try:
            weight = float(number)
        except ValueError:
            weight = -1.0
        if not (weight >= 0 and math.isfinite(weight)):
            raise SettingsError(f"{what}: {name}={number}: a weight is a number >= 0")
        given[name] = weight
    top = max(given.values())
    if top <= 0:
        raise SettingsError(f"{what} {text!r}: at least one weight must be above 0")
    total = sum(w / top for w in given.values())  # over the largest first: no overflow
    return {n: given.get(n, 0.0) / top / total for n in names}


@dataclass(frozen=True)
class Stage:
    """A mixture from a point of the run on: `at` in `unit` ("step", "tok" or "%"), exact
    (7% of 100 steps is step 7, not 8 by a float's rounding); `text` as the user wrote it."""

    at: Fraction
    unit: str
    weights: dict
    text: str

    def start_step(self, step_tokens: int, max_steps: int) -> int:
        """The first step of this stage, given the tokens of a step and the run's steps."""
        if self.unit == "step":
            return int(self.at)
        if self.unit == "tok":
            return math.ceil(self.at / step_tokens)
        return math.ceil(self.at * max_steps / 100)


def parse_stage(text: str, names: list[str]) -> Stage:
    """--mix-stage START:NAME=WEIGHT,... (START: a step, Ntok or P%)."""
    start, sep, mix = text.partition(":")
    m = START.fullmatch(start.strip())
    if not sep or not m:
        raise SettingsError(f"--mix-stage {text!r}: give START:NAME=WEIGHT,..., START a step "
                            "(8000), tokens (2e9tok) or a share of the steps (90%)")
    unit = (m["unit"] or "step").lower()
    at = Fraction(m["number"])
    if unit == "step" and at.denominator != 1:
        raise SettingsError(f"--mix-stage {text!r}: a step is a whole number")
    if unit == "%" and not 0 <= at <= 100:
        raise SettingsError(f"--mix-stage {text!r}: a share of the steps is 0% to 100%")
    return Stage(at, unit, parse_weights(mix, names, f"--mix-stage {start}"), start.strip())


def natural_weights(rows: dict[str, int]) -> dict[str, float]:
    """Without --mix: each source in proportion to its train rows (as if concatenated)."""
    total = sum(rows.values())
    return {n: r / total for n, r in rows.items()}


def parse_max_epochs(values, names: list[str]) -> dict[str, float]:
    """--max-epochs NAME=N (repeatable), or a bare N for every source: the passes over its
    train rows after which the run stops rather than repeat it once more."""
    out = {}
    for value in values:
        name, sep, number = str(value).rpartition("=")
        targets = [name] if sep else names
        if sep and name not in names:
            raise SettingsError(f"--max-epochs: no source is named {name!r}; the sources: "
                                f"{', '.join(names)}")
        try:
            epochs = float(number)
        except ValueError:
            epochs = 0.0
        if not (epochs > 0 and math.isfinite(epochs)):
            raise SettingsError(f"--max-epochs {value}: give a number of epochs above 0 "
                                "(NAME=N, or N for every source)")
        out.update(dict.fromkeys(targets, epochs))
    return out


def parse_mixture(shards, mix: str | None, stages, max_epochs):
    """`train`'s mixture settings at once: (sources [(name, path)], shares or None, stages,
    max epochs per source name)."""
    sources = parse_sources(shards)
    names = [n for n, _ in sources]
    weights = parse_weights(mix, names) if mix else None
    return (sources, weights, [parse_stage(text, names) for text in stages],
            parse_max_epochs(max_epochs, names))
