"""`train --config FILE`: a TOML or YAML file's settings as the flags' (their names with _), flat
or in the nested layout training configs commonly use: a `model` table (`name` = --model, every
other key a field of the model's config = --model-arg; a `model_args` table is those fields
alone), a `[[data]]` list (a mixture), and sections (training:, optim:, data:, ...) whose keys
are the flags', tables inside tables at any depth (training.optimizer.lr is lr).

Every problem of the file is found before any is said, at every depth, and said in one
SettingsError line, each item naming its key by its place in the file (`training.max_lr`):
another trainer's name with ours and its value in our unit (training/names.py), a field of the
model's config outside the model table, a model table without a name (with the family its
fields belong to), an unknown key with the nearest known name, a key given twice, a value of
the wrong type or range (longpack/core/settings.py's checks), a rule that ties settings
together (training/config.py's `broken`: `training.min_lr: 0.002 is above training.max_lr (lr):
0.001`) and a report backend this machine lacks. A translation reads `THEIRS: VALUE -> OURS:
VALUE (difference)` or `THEIRS: VALUE -> remove (why)`, so the file is right after one edit.
What a flag on the command line takes part in (it wins over the file) is left to the flags'
own checks, which name the flags as they do without a file."""

import dataclasses
import json

from longpack.core import SettingsError, kinds, read_settings_file, suggest, values_checked
from longpack.training import conversions, names
from longpack.training.config import TrainConfig

SECTIONS = ("training", "optim", "optimizer", "data", "run", "checkpoint", "logging")
DATA_KEYS = ("name", "path", "weight", "max_epochs")
MODEL_TABLES = ("model", "model_args")


def read(path: str, given=frozenset()) -> dict:
    """The file's settings by the flags' names (a tuple of a comma-separated flag as its text),
    or SettingsError listing everything to change. `given`: the settings the command line
    gives, whose rules and backends its flags answer for."""
    reading = _Reading(path, frozenset(given))
    for key, value in read_settings_file(path).items():
        reading.place(str(key), value)
    return reading.finish()


class _Reading:
    def __init__(self, path: str, given: frozenset):
        from longpack import archs

        self.path, self.given = path, given
        self.fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
        self.families = {family: {f.name for f in dataclasses.fields(cls)}
                         for family, (cls, _, _) in archs.FAMILIES.items()}
        self.out, self.where, self.order = {}, {}, {}  # setting -> value, place, item order
        self.problems: list[tuple[int, str]] = []
        self.unknown: list[tuple[int, str]] = []
        self.foreign: list[tuple[int, str, object, names.Name, str | None]] = []
        self.model_fields: dict[str, tuple[object, str]] = {}  # field -> (value, place)
        self.model_table: str | None = None
        self.model_at: str | None = None  # where the model table is in the file
        self.bad: set[str] = set()  # settings with a problem of their own: held to no rule
        self.missing_name: int | None = None  # the place of a model table without a name
        self.count = 0

    def _next(self) -> int:
        self.count += 1
        return self.count

    # -- where each key goes -----------------------------------------------------------------

    def place(self, written: str, value, table: str | None = None, home: str | None = None,
              own: bool = True) -> None:
        """A key as written (`model-dim`) and its value, in `table` (its place in the file;
        None: the top level), which is one of train's tables (`own`) or another's, inside the
        nearest of train's, `home` (where a translation goes)."""
        key = written.replace("-", "_")
        at = f"{table}.{written}" if table else written
        inner = table and table.rsplit(".", 1)[-1].replace("-", "_")  # whose meaning a key has
        if own and key == "data" and isinstance(value, list):
            self.data_list(value)
        elif own and key in MODEL_TABLES and isinstance(value, dict):
            self.model(key, value, at)
        elif isinstance(value, dict) and (key in SECTIONS or key not in self.fields):
            mine = own and key in SECTIONS  # training:, optimizer: ...; else wandb:, evaluation:
            for inner_key, v in value.items():
                self.place(str(inner_key), v, at, at if mine else home, mine)
        elif key in self.fields and own:
            self.set(key, value, at)
        elif key in self.fields:  # one of ours, in a table that is not one of ours
            note = f"{table} is not one of train's tables, which are {', '.join(SECTIONS)}"
            self.foreign.append((self._next(), at, value, names.Name(at, key, (), note), home))
        elif found := names.lookup(inner, key):
            for entry in found:
                self.foreign.append((self._next(), at, value, entry, home))
        elif any(key in fields for fields in self.families.values()):
            entry = names.Name(at, f"model.{key}", (), "a field of the model's config")
            self.foreign.append((self._next(), at, value, entry, None))
        else:
            near = suggest(key, self.fields)
            where = f"{home}." if home else ""
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
        self.model_table, self.model_at = table_name, written
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
        set a train setting, for the value checks. Implied entries come last: a setting the
        file gives otherwise is not implied."""
        plain = {e.ours: v for _, _, v, e, _ in self.foreign
                 if e.convert is None and e.ours and not e.ours.startswith("model.")}
        context = {**plain, **self.out}  # the file's settings in our names, ours first
        translated = {}
        for order, at, value, entry, home in sorted(self.foreign,
                                                    key=lambda f: (f[3].implied, f[0])):
            head = f"{at}: {names.said(value)} -> "
            if not entry.ours:
                self.problems.append((order, f"{head}remove ({entry.note})"))
                continue
            ours = entry.ours
            if ours.startswith("model."):
                field = ours[len("model."):]
                given = self.model_fields.get(field)
            else:
                field = None
                given = (self.out[ours], self.where[ours]) if ours in self.out else \
                    translated.get(ours)
            if entry.implied and given is not None:
                continue
            target = entry.target(home)
            if self.model_table == "model_args" and target.startswith("model."):
                target = "model_args." + target[len("model."):]
            try:
                new = value if entry.convert is None else entry.convert(value, context)
            except (ValueError, TypeError) as e:
                if not entry.implied:
                    self.problems.append((order, f"{head}{target} ({e})"))
                    self.bad.add(ours)
                continue
            note = entry.note
            if isinstance(new, conversions.Converted):
                new, note = new.value, new.note
            if new is conversions.SILENT:
                continue
            if new is conversions.DROP:
                self.problems.append((order, f"{head}remove ("
                                      + (note or "it changes nothing here") + ")"))
                continue
            if given is not None:  # the same setting twice: keep the one given
                self.problems.append((order, f"{head}remove ({ours} is given as {given[1]}: "
                                      f"{names.said(given[0])})"))
                continue
            if field is not None:
                self.model_fields[field] = (new, at)
            else:
                translated[ours] = (new, at)
                self.order.setdefault(ours, order)
            note = f" ({note})" if note else ""
            self.problems.append((order, f"{head}{target}: {names.said(new)}{note}"))
        for ours, (_, at) in translated.items():  # where the rules find it
            self.where.setdefault(ours, at)
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

    def check_rules(self, typed: dict) -> None:
        """What the run would refuse next, in this error: the rules that tie settings together
        (training/config.py's `broken`) on the file's values over train's defaults, each named
        by the file's keys, and the report backends it asks for that this machine lacks. A
        rule a flag of the command line takes part in is the flag's to say (TrainConfig, as
        without a file); a setting with a problem of its own is held to none."""
        from types import SimpleNamespace

        from longpack.training.config import broken
        from longpack.training.metrics import unavailable

        fields = dataclasses.fields(TrainConfig)
        values = {f.name: typed.get(f.name, () if f.default is dataclasses.MISSING else f.default)
                  for f in fields}
        mine = {f.name for f in fields if f.name in typed}
        missing = {f.name for f in fields if f.default is dataclasses.MISSING} - mine  # shards
        skip = self.given | self.bad | missing

        def say(name: str, bare: bool = False, fmt: str = "") -> str:
            at = self.where.get(name) if name in mine else None
            if at is None:
                return name if bare else f"{name}: {names.said(values[name])} (train's default)"
            key = at.rsplit(".", 1)[-1].split(" ")[0].replace("-", "_")
            named = at if key == name else f"{at} ({name})"
            return named if bare else f"{named}: {names.said(values[name])}"

        for tied, error in broken(SimpleNamespace(**values), say):
            if set(tied) & mine and not set(tied) & skip:  # "; " is the error's item break
                self.problems.append((min(self.order.get(n, self.count) for n in
                                          set(tied) & mine), str(error).replace("; ", ", ")))
        if "report_to" in mine and "report_to" not in skip:
            for kind, needs in unavailable(values["report_to"]):
                self.problems.append((self.order.get("report_to", self.count),
                                      f"{say('report_to', True)} asks for {kind}, which "
                                      f"{needs}"))

    def finish(self) -> dict:
        translated = self.translate()
        if "model_args" in self.out and (self.model_table or self.model_fields):
            self.problems.append((self.order["model_args"], "the model's fields are set twice "
                                  f"([{self.model_table or 'model'}] and model_args): keep one"))
            self.bad.add("model_args")
        said = len(self.problems) + len(self.unknown)
        self.check_model()
        if len(self.problems) + len(self.unknown) > said:
            self.bad |= {"model", "model_args"}
        typed, problems = values_checked(TrainConfig, {**self.out, **translated},
                                         whole_floats=True)
        for key, problem in problems:
            self.problems.append((self.order.get(key, self.count), problem))
            self.bad.add(key)
        if self.model_fields:
            typed["model_args"] = [f"{k}={json.dumps(v)}" for k, (v, _) in
                                   self.model_fields.items()]
            self.where.setdefault("model_args", self.model_at or "model_args")
            self.order.setdefault("model_args", min(self.order.get(at, self.count) for
                                                    _, at in self.model_fields.values()))
        self.check_rules(typed)
        if self.unknown:
            self.unknown.sort()
            keys = [text for _, text in self.unknown]
            self.problems.append((self.unknown[0][0], f"unknown setting"
                                  f"{'s' if len(keys) > 1 else ''} {', '.join(keys)}"))
        if self.problems:
            items = [text for _, text in sorted(self.problems, key=lambda p: p[0])]
            raise SettingsError(f"{self.path}: " + (items[0] if len(items) == 1 else
                                f"{len(items)} things to change: " + "; ".join(items)))
        for f in dataclasses.fields(TrainConfig):  # a tuple's flag that takes comma-separated text
            if isinstance(typed.get(f.name), tuple) and not f.metadata["multiple"]:
                typed[f.name] = ",".join(typed[f.name])
        return typed
