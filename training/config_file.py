"""`train --config FILE`: a TOML or YAML file's settings as the flags' (their names with _), flat
or in the nested layout training configs commonly use: a `model` table (`name` = --model, every
other key a field of the model's config = --model-arg; a `model_args` table is those fields
alone), a `[[data]]` list (a mixture), and sections (training:, optim:, data:, ...) whose keys
are the flags'.

Every problem of the file is found before any is said, at every depth, and said in one
SettingsError line, each item naming its key by its place in the file (`training.max_lr`):
another trainer's name with ours and its value in our unit (training/names.py), a field of the
model's config outside the model table, a model table without a name (with the family its
fields belong to), an unknown key with the nearest known name, a key given twice, a value of
the wrong type or range (longpack/core/settings.py's checks). A translation reads
`THEIRS: VALUE -> OURS: VALUE (difference)` or `THEIRS: VALUE -> remove (why)`, so the file is
right after one edit."""

import dataclasses
import json

from longpack.core import SettingsError, kinds, read_settings_file, suggest, values_checked
from longpack.training import names
from longpack.training.config import TrainConfig

SECTIONS = ("training", "optim", "optimizer", "data", "run", "checkpoint", "logging")
DATA_KEYS = ("name", "path", "weight", "max_epochs")
MODEL_TABLES = ("model", "model_args")


def read(path: str) -> dict:
    """The file's settings by the flags' names (a tuple of a comma-separated flag as its text),
    or SettingsError listing everything to change."""
    reading = _Reading(path)
    for key, value in read_settings_file(path).items():
        reading.top(str(key), value)
    return reading.finish()


class _Reading:
    def __init__(self, path: str):
        from longpack import archs

        self.path = path
        self.fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
        self.families = {family: {f.name for f in dataclasses.fields(cls)}
                         for family, (cls, _, _) in archs.FAMILIES.items()}
        self.out, self.where, self.order = {}, {}, {}  # setting -> value, place, item order
        self.problems: list[tuple[int, str]] = []
        self.unknown: list[tuple[int, str]] = []
        self.foreign: list[tuple[int, str, object, names.Name, str | None]] = []
        self.model_fields: dict[str, tuple[object, str]] = {}  # field -> (value, place)
        self.model_table: str | None = None
        self.missing_name: int | None = None  # the place of a model table without a name
        self.count = 0

    def _next(self) -> int:
        self.count += 1
        return self.count

    # -- where each key goes -----------------------------------------------------------------

    def top(self, written: str, value) -> None:
        """A key of the file as written (`model-dim`), its value."""
        key = written.replace("-", "_")
        if key == "data" and isinstance(value, list):
            self.data_list(value)
        elif key in MODEL_TABLES and isinstance(value, dict):
            self.model(key, value, written)
        elif key in SECTIONS and isinstance(value, dict):
            for inner, v in value.items():
                self.place(str(inner), v, written)
        elif key not in self.fields and isinstance(value, dict):  # wandb:, evaluation:, ...
            for inner, v in value.items():
                self.place(str(inner), v, written, own=False)
        else:
            self.place(written, value, None)

    def place(self, written: str, value, section: str | None, own: bool = True) -> None:
        """A key (as written) of the top level or of `section`, one of train's tables (`own`)
        or another's."""
        key = written.replace("-", "_")
        at = f"{section}.{written}" if section else written
        section = section and section.replace("-", "_")
        if key in self.fields and own:
            self.set(key, value, at)
        elif key in self.fields:  # one of ours, in a section that is not one of ours
            note = f"{section} is not one of train's tables, which are {', '.join(SECTIONS)}"
            self.foreign.append((self._next(), at, value, names.Name(at, key, (), note), None))
        elif found := names.lookup(section, key):
            for entry in found:
                self.foreign.append((self._next(), at, value, entry, section if own else None))
        elif any(key in fields for fields in self.families.values()):
            entry = names.Name(at, f"model.{key}", (), "a field of the model's config")
            self.foreign.append((self._next(), at, value, entry, None))
        else:
            near = suggest(key, self.fields)
            where = f"{section}." if section and own else ""
            self.unknown.append((self._next(), at + (f" (did you mean {where}{near}?)"
                                                     if near else "")))

    def set(self, key: str, value, at: str) -> None:
        if key in self.out:
            self.problems.append((self._next(), f"{at} is set twice (also as {self.where[key]})"))
            return
        self.out[key], self.where[key], self.order[key] = value, at, self._next()

    def model(self, table_name: str, table: dict, written: str) -> None:
        """A [model] table (its name, the model's fields) or [model_args] (the fields)."""
        table = {str(k): v for k, v in table.items()}
        if table_name == "model":
            if "name" in table:
                self.set("model", table.pop("name"), f"{written}.name")
            else:
                self.missing_name = self._next()
        if self.model_table is not None:
            self.problems.append((self._next(), f"the model's fields are set twice "
                                  f"([{table_name}] and [{self.model_table}]): keep one"))
            return
        self.model_table = table_name
        for written_key, value in table.items():
            key, at = written_key.replace("-", "_"), f"{written}.{written_key}"
            found = names.lookup("model", key)
            if found and not found[0].ours:  # a model's field that is not set here (vocab_size)
                self.foreign.append((self._next(), at, value, found[0], None))
            elif any(key in fields for fields in self.families.values()):
                self.model_fields[key] = (value, at)
                self.order[at] = self._next()
            elif found:
                for entry in found:
                    self.foreign.append((self._next(), at, value, entry, None))
            elif key in self.fields:  # a train setting, not the model's
                entry = names.Name(at, key, (), "a setting of train, not of the model")
                self.foreign.append((self._next(), at, value, entry, None))
            else:  # no family's field: check_model names the nearest of the model's
                self.model_fields[key] = (value, at)
                self.order[at] = self._next()

    def data_list(self, entries: list) -> None:
        """A `[[data]]` list (each with name, path, optional weight and max_epochs) as the
        flags' settings: shards NAME=PATH, mix, max_epochs NAME=N."""
        from longpack.pipeline import good_name, source_name

        shards, weights, epochs = [], [], []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or "path" not in entry:
                self.problems.append((self._next(), f"data entry {i + 1} needs a path (and may "
                                      f"have {', '.join(DATA_KEYS)})"))
                continue
            unknown = set(entry) - set(DATA_KEYS)
            if unknown:
                self.problems.append((self._next(), f"data entry {i + 1}: unknown "
                                      f"{', '.join(sorted(unknown))} (the keys: "
                                      f"{', '.join(DATA_KEYS)})"))
            name = str(entry.get("name") or source_name(str(entry["path"])))
            if not good_name(name):
                self.problems.append((self._next(), f"data entry {i + 1}: its name {name!r} "
                                      "has characters other than letters, digits, '_', '.', "
                                      "'-'; give it a name = ..."))
            shards.append(f"{name}={entry['path']}")
            if "weight" in entry:
                weights.append(f"{name}={entry['weight']}")
            if "max_epochs" in entry:
                epochs.append(f"{name}={entry['max_epochs']}")
        if weights and len(weights) != len(shards):
            self.problems.append((self._next(), "give every data entry a weight, or none (each "
                                  "then in proportion to its train rows)"))
        self.set("shards", shards, "shards of [[data]]")
        if weights:
            self.set("mix", ",".join(weights), "mix of [[data]]")
        if epochs:
            self.set("max_epochs", epochs, "max_epochs of [[data]]")

    # -- what the file's names become ----------------------------------------------------------

    def translate(self) -> dict:
        """Each other trainer's name as ours (one item each); {setting: value} of those that
        set a train setting, for the value checks."""
        plain = {e.ours: v for _, _, v, e, _ in self.foreign
                 if e.convert is None and e.ours and not e.ours.startswith("model.")}
        context = {**plain, **self.out}  # the file's settings in our names, ours first
        translated = {}
        for order, at, value, entry, section in self.foreign:
            head = f"{at}: {names.said(value)} -> "
            if not entry.ours:
                self.problems.append((order, f"{head}remove ({entry.note})"))
                continue
            target = entry.target(section)
            if self.model_table == "model_args" and target.startswith("model."):
                target = "model_args." + target[len("model."):]
            try:
                new = value if entry.convert is None else entry.convert(value, context)
            except (ValueError, TypeError) as e:
                self.problems.append((order, f"{head}{target} ({e})"))
                continue
            note = entry.note
            if isinstance(new, names.Converted):
                new, note = new.value, new.note
            if new is names.DROP:
                self.problems.append((order, f"{head}remove ("
                                      + (note or "it changes nothing here") + ")"))
                continue
            ours = entry.ours
            if ours.startswith("model."):
                field = ours[len("model."):]
                given = self.model_fields.get(field)
            else:
                field = None
                given = (self.out[ours], self.where[ours]) if ours in self.out else \
                    translated.get(ours)
            if given is not None:  # the same setting twice: keep the one given
                self.problems.append((order, f"{head}remove ({ours} is given as {given[1]}: "
                                      f"{names.said(given[0])})"))
                continue
            if field is not None:
                self.model_fields[field] = (new, at)
            else:
                translated[ours] = (new, at)
            note = f" ({note})" if note else ""
            self.problems.append((order, f"{head}{target}: {names.said(new)}{note}"))
        return {ours: value for ours, (value, _) in translated.items()}

    def check_model(self) -> None:
        """The model's name (given, or the family its fields belong to) and its fields: each
        one the model's, each value of its type, and the config they make (ranges, ties)."""
        from longpack import archs

        fields = self.model_fields
        name = self.out.get("model")
        if name is None and not fields and self.missing_name is None:
            return
        if name is None:
            every = set().union(*self.families.values())
            for field, (_, at) in fields.items():
                if field not in every:  # no family's: said now, the name is said beside it
                    near = suggest(field, every)
                    self.unknown.append((self.order.get(at, self.count), at + (
                        f" (did you mean {at.rsplit('.', 1)[0]}.{near}?)" if near else "")))
            fields = {k: v for k, v in fields.items() if k in every}
            fits = [family for family, known in self.families.items() if set(fields) <= known]
            order = self.missing_name or min(
                (self.order.get(at, self.count) for _, at in fields.values()), default=0)
            given = ", ".join(fields) or "none"
            if len(fits) == 1:
                self.problems.append((order, f"model.name: missing -> model.name: "
                                      f"{names.said(fits[0])} (the family whose config has "
                                      f"{given}, or one of its presets from `zoo list`)"))
            else:
                self.problems.append((order, "model.name: missing (a preset from `zoo list` or "
                                      "a family: " + ", ".join(fits or self.families) + ", or "
                                      "the fields alone in model_args to keep --model's model)"))
            return
        try:
            known = {f.name: f.type for f in dataclasses.fields(archs.config(str(name)))}
        except KeyError as e:  # the registry's message lists the choices
            self.problems.append((self.order.get("model", 0), f"{self.where['model']}: "
                                  f"{e.args[0]}"))
            return
        typed, bad = {}, False
        for field, (value, at) in fields.items():
            if field not in known:
                near = suggest(field, known)
                self.unknown.append((self.order.get(at, self.count), at + (
                    f" (did you mean {at.rsplit('.', 1)[0]}.{near}?)" if near else
                    f" (not a field of {name}: {', '.join(known)})")))
                bad = True
                continue
            wanted = kinds(known[field])
            if (int in wanted and float not in wanted and isinstance(value, float)
                    and value.is_integer() and abs(value) <= 2**53):  # 1e9: a whole number
                value = int(value)
            try:
                typed[field] = archs.limits.typed(at, value, known[field])
            except ValueError as e:
                self.problems.append((self.order.get(at, self.count), str(e)))
                bad = True
        if not bad:
            try:
                archs.config(str(name), **typed)
            except (ValueError, TypeError) as e:
                self.problems.append((self.order.get("model", self.count),
                                      f"{self.model_table or 'model'}: {e}"))
            for field, value in typed.items():  # as typed: the file's 1e9 a whole number
                self.model_fields[field] = (value, fields[field][1])

    def finish(self) -> dict:
        translated = self.translate()
        if "model_args" in self.out and (self.model_table or self.model_fields):
            self.problems.append((self.order["model_args"], "the model's fields are set twice "
                                  f"([{self.model_table or 'model'}] and model_args): keep one"))
        self.check_model()
        typed, problems = values_checked(TrainConfig, {**self.out, **translated},
                                         whole_floats=True)
        for key, problem in problems:
            self.problems.append((self.order.get(key, self.count), problem))
        if self.unknown:
            self.unknown.sort()
            keys = [text for _, text in self.unknown]
            self.problems.append((self.unknown[0][0], f"unknown setting"
                                  f"{'s' if len(keys) > 1 else ''} {', '.join(keys)}"))
        if self.problems:
            items = [text for _, text in sorted(self.problems)]
            raise SettingsError(f"{self.path}: " + (items[0] if len(items) == 1 else
                                f"{len(items)} things to change: " + "; ".join(items)))
        if self.model_fields:
            typed["model_args"] = [f"{k}={json.dumps(v)}" for k, (v, _) in
                                   self.model_fields.items()]
        for f in dataclasses.fields(TrainConfig):  # a tuple's flag that takes comma-separated text
            if isinstance(typed.get(f.name), tuple) and not f.metadata["multiple"]:
                typed[f.name] = ",".join(typed[f.name])
        return typed
