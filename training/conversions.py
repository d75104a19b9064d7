"""Values in another trainer's unit as ours, for the table of names (training/names.py): each
converter takes their value and the file's settings in our names, and gives our value with a
note that says how in its numbers (`Converted`), DROP (the key sets nothing here) or SILENT (an
implied meaning the file's settings do not determine). Where a value depends on a setting the
file does not give, it is of train's default, and the note says so (`0.1 x lr 0.0003, train's
default`); what a file's one local build says (its train rows, their length) is read from its
manifest, never fetched."""

import math
from dataclasses import dataclass

DROP = object()  # what a key converts to when it is to be removed: it sets nothing here
SILENT = object()  # what an implied entry converts to when the file does not determine it


def _default(name: str):
    import dataclasses

    from longpack.training.config import TrainConfig

    return next(f.default for f in dataclasses.fields(TrainConfig) if f.name == name)


@dataclass(frozen=True)
class Converted:
    """A converted value with the note that says how, in its numbers."""
    value: object
    note: str


def times_lr(ratio, settings):
    lr, whose = _given("lr", settings)
    return Converted(float(f"{ratio * lr:.12g}"),
                     f"a learning rate, not a ratio: {ratio} x lr {lr}{whose}")


def switch(precision):
    return lambda on, _settings: precision if on is True else DROP


def reports_with(kind):
    def convert(on, settings):
        if on is not True:
            return DROP
        given = settings.get("report_to", _default("report_to"))
        given = given.split(",") if isinstance(given, str) else list(given)
        return [*given, kind] if kind not in given else DROP

    return convert


def one_of(table: dict, what: str):
    def convert(value, _settings):
        key = str(value).lower().replace("-", "_")
        if key not in table:
            raise ValueError(f"{value!r} has no equivalent {what} here, choose from "
                             + ", ".join(sorted({v for v in table.values() if v is not DROP})))
        return table[key]

    return convert


PRECISION = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16",
             "no": "fp32", "fp32": "fp32", "float32": "fp32"}
SCHEDULES = {"cosine": "cosine", "cosine_with_min_lr": "cosine", "cos": "cosine",
             "constant": "constant", "constant_with_warmup": "constant",
             "cosine_with_restarts": "cosine-restarts", "warmup_stable_decay": "wsd",
             "wsd": "wsd", "onecycle": "onecycle", "onecyclelr": "onecycle",
             "cosineannealinglr": "cosine", "cosineannealingwarmrestarts": "cosine-restarts"}
OPTIMIZERS = {"adamw": "adamw", "adamw_torch": "adamw", "adamw_torch_fused": "adamw",
              "adamw_hf": "adamw", "adam": "adamw", "muon": "muon"}


def betas(index):
    def convert(betas, _settings):
        if not isinstance(betas, list | tuple) or len(betas) != 2:
            raise ValueError(f"{betas!r} is not two numbers, beta1 and beta2")
        return betas[index]

    return convert


def _given(name: str, settings: dict) -> tuple[object, str]:
    """The file's value of one of our settings, or train's default, said as such."""
    if name in settings:
        return settings[name], ""
    return _default(name), ", train's default"


def _train_split(shards) -> tuple[int, int] | None:
    """(rows, tokens a row) of the train split of the one local build `shards` names, from its
    manifest, or None: a URL is not fetched to read a config file, and a mixture has no one
    count."""
    from longpack.core import LongpackError, is_url
    from longpack.pipeline import parse_mixture, read_manifest

    try:
        sources = parse_mixture([shards] if isinstance(shards, str) else shards, None, (), ())[0]
        if len(sources) != 1 or is_url(sources[0][1]):
            return None
        manifest = read_manifest(sources[0][1])
        return int(manifest["splits"]["train"]["rows"]), int(manifest["seq"])
    except (LongpackError, OSError, KeyError, TypeError, ValueError):
        return None


def steps_of_share(share, settings):
    """A share of the run's steps, as steps: of the file's max_steps, or else of train's
    default (as min_lr_ratio is of the default lr); of total_tokens over a step's tokens on
    one process where the file gives total_tokens (the row length: the file's seq, or its
    build's)."""
    if "total_tokens" in settings:
        seq = settings.get("seq") or (_train_split(settings.get("shards")) or (0, None))[1]
        if seq is None:
            raise ValueError(f"give warmup in steps: {share} x the run's steps, which `train "
                             "--dry-run` prints: total_tokens over a step's tokens")
        batch, _ = _given("batch_size", settings)
        accum, _ = _given("grad_accum", settings)
        tokens = int(settings["total_tokens"])
        # a step's tokens as the trainer counts them (training/setup.resolve_steps): each row's
        # predictions, seq - 1
        steps = math.ceil(tokens / ((int(seq) - 1) * batch * accum))
        return Converted(round(share * steps), f"steps, not a share: {share} x {steps:,} steps, "
                         f"total_tokens {tokens:,} over seq {seq} - 1 x batch_size "
                         f"{batch} x grad_accum {accum} tokens a step on one process")
    steps, whose = _given("max_steps", settings)
    return Converted(round(share * steps),
                     f"steps, not a share: {share} x max_steps {steps}{whose}")


def onecycle(strategy, _settings):
    """OneCycleLR's keys: our onecycle schedule, which anneals by cosine (its anneal_strategy
    'cos'; 'linear' has no equivalent)."""
    how = "" if strategy is True or str(strategy).lower() in ("cos", "cosine") else \
        f", not {strategy}"
    return Converted("onecycle", "torch's OneCycleLR: from lr / 25 up to lr over the warmup, "
                     f"then down to min_lr, both by cosine{how}")


def onecycle_end(final_div_factor=10_000):
    """OneCycleLR's last learning rate, lr / 25 / final_div_factor (its div_factor 25)."""
    def convert(value, settings):
        divide = value if final_div_factor is None else final_div_factor
        lr, whose = _given("lr", settings)
        return Converted(float(f"{lr / 25 / divide:.12g}"), f"OneCycleLR's end: lr {lr}{whose} "
                         f"/ 25 / final_div_factor {divide:,}")
    return convert


def onecycle_end_if_named(value, settings):
    """A scheduler named OneCycleLR ends where OneCycleLR does."""
    if SCHEDULES.get(str(value).lower().replace("-", "_")) != "onecycle":
        return SILENT
    return onecycle_end()(value, settings)


def epochs(epochs, settings):
    """N epochs, as max_epochs with what the run's length is: the file's total_tokens or
    max_steps, the build's N epochs (total_tokens, said beside), or else max_steps' default."""
    stops = f"stops the run before a source is repeated past {epochs} epochs"
    if "total_tokens" in settings or "max_steps" in settings:
        length = "total_tokens" if "total_tokens" in settings else "max_steps"
        return Converted(epochs, f"{stops}, while the run's length is the file's {length}")
    if epochs_tokens(epochs, settings) is not SILENT:
        return Converted(epochs, f"{stops}, and total_tokens makes the run {epochs} epochs long")
    return Converted(epochs, f"{stops}, but the run's length stays max_steps, "
                     f"{_default('max_steps')} by default: for {epochs} epochs give total_tokens "
                     f"too, {epochs} x the build's train rows x their tokens, which `pack stats "
                     "BUILD` prints")


def epochs_tokens(epochs, settings):
    """N epochs of the file's one local build as tokens: its train rows x their tokens."""
    split = _train_split(settings.get("shards"))
    if ("total_tokens" in settings or "max_steps" in settings or split is None
            or isinstance(epochs, bool) or not isinstance(epochs, int | float)):
        return SILENT
    rows, seq = split  # a row's tokens as the trainer counts them: its predictions, seq - 1
    return Converted(math.ceil(epochs * rows * (seq - 1)), f"{epochs} x the build's {rows:,} "
                     f"train rows of {seq - 1:,} predicted tokens, its manifest's")
