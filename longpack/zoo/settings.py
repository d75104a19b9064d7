"""The settings of the `zoo` commands (list, export, eval, generate), validated once; their
flags are these fields (longpack/core/settings.py). Loads no torch: `zoo --help` reads it."""

import re
from dataclasses import dataclass

from longpack.core import SettingsError, check, setting

EXPORTS = ("hf", "safetensors")  # zoo export --to
DTYPES = ("fp32", "bf16", "fp16")  # zoo export --dtype
SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*(kb|mb|gb|tb)?", re.IGNORECASE)
UNITS = {None: 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}  # the hub's (decimal)


def parse_size(value) -> int:
    """Bytes, from a number or a number with KB, MB, GB or TB as the hub writes them;
    SettingsError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        found = SIZE.fullmatch(str(value).strip())
        size = int(float(found[1]) * UNITS[found[2] and found[2].lower()]) if found else 0
    if size < 1:
        raise SettingsError(f"--max-shard-size {value!r}: give a size such as 5GB, 500MB or a "
                            "number of bytes")
    return size


def _size_flag(ctx, param, value: str | None) -> int | None:
    """--max-shard-size's text: a usage error (exit 2) when it is no size."""
    import click

    if value is None:
        return None
    try:
        return parse_size(value)
    except SettingsError:
        raise click.BadParameter(f"{value!r}: give a size such as 5GB, 500MB or a number of "
                                 "bytes") from None


@dataclass(frozen=True, kw_only=True)
class ListConfig:
    vocab: int | None = setting(None, "Sizes at this vocabulary (a build's tokenizer "
                                "vocab_size) [each preset's own].", min=1, metavar="V")
    as_json: bool = setting(False, "Print JSON (what archs/presets.json holds).", flag="--json",
                            switch=True, show_default=False)

    def __post_init__(self):
        check(self)


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    run: str = setting(argument=True, path=True)
    step: int | None = setting(None, "The checkpoint of this step [the newest].")
    to: str = setting(help="hf: a folder transformers loads and the hub takes (every family; "
                      "GPT-NeoX as GPTNeoXForCausalLM, the others with their own code: "
                      "trust_remote_code=True); safetensors: config.json + model.safetensors "
                      "that archs.load reads.", choices=EXPORTS)
    out: str = setting(help="Directory to write (new or empty).", path=True)
    license: str | None = setting(None, "--to hf: the model card's license, as the hub names "
                                  "them (apache-2.0, mit, cc-by-4.0, ...) [other: the weights' "
                                  "terms follow the data's, yours to state].", metavar="ID")
    max_shard_size: int | None = setting(None, "--to hf: largest safetensors file; past it the "
                                         "weights are sharded with an index (e.g. 500MB) "
                                         "[5GB].", metavar="SIZE", callback=_size_flag)
    dtype: str = setting("fp32", "--to hf: the weights' type: bf16 or fp16 store them in half the "
                         "bytes, rounded (transformers loads them as config.json's torch_dtype "
                         "says).", choices=DTYPES)
    # named for what it turns on: every bool flag also has its --no- form (longpack/core/settings.py)
    tokenizer: bool = setting(True, "--to hf: the build's tokenizer goes with the model (held "
                              "to the one the run trained with); --no-tokenizer writes the "
                              "folder without it, for a tokenizer that cannot be loaded here "
                              "(otherwise that is an error).", show_default=False)
    shards: str | None = setting(None, "The run's build where it is now (its --out or URL), "
                                 "when it was moved: its tokenizer goes with the model, held to "
                                 "the one the run trained with [where the run read it].",
                                 metavar="BUILD", path=True)

    def __post_init__(self):
        check(self)
        if (not self.tokenizer or self.shards is not None) and self.to != "hf":
            raise SettingsError("--no-tokenizer and --shards are --to hf's: --to safetensors "
                                "writes no tokenizer")
        if self.max_shard_size is not None:
            object.__setattr__(self, "max_shard_size", parse_size(self.max_shard_size))
        if self.to == "safetensors" and (self.license or self.max_shard_size
                                         or self.dtype != "fp32"):
            raise SettingsError("--license, --max-shard-size and --dtype are --to hf's (a "
                                "model card, sharded or half-precision weights); --to "
                                "safetensors writes one fp32 file for archs.load")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    run: str = setting(argument=True, path=True)
    shards: str = setting(help="A build (its --out, or URL) with the run's tokenizer.",
                          path=True)
    split: str = setting("val", choices=["val", "train"])
    step: int | None = setting(None, "The checkpoint of this step [the newest].")
    batch_size: int = setting(8, min=1)
    seq: int | None = setting(None, "Score samples of this many tokens, each row cut into "
                              "windows as train --seq cuts them (a divisor of the build's "
                              "rows) [the run's own --seq: the windows it trained on].", min=2)
    limit: int | None = setting(None, "Only the first N samples of the split [all].", min=1)
    cache: str | None = setting(None, "Shard cache for a build at a URL [a temporary folder].",
                                path=True)
    as_json: bool = setting(False, "Print the figures as JSON.", flag="--json", switch=True,
                            show_default=False)

    def __post_init__(self):
        check(self)


@dataclass(frozen=True, kw_only=True)
class GenerateConfig:
    run: str = setting(argument=True, path=True)
    prompt: str = setting(help="Text to continue (encoded with the build's tokenizer).")
    max_new_tokens: int = setting(50, min=1)
    temperature: float = setting(0.0, "0: greedy.", min=0)
    top_k: int | None = setting(None, min=1)
    top_p: float | None = setting(None, min=0, max=1, min_open=True)
    seed: int = setting(0, min=0, max=2**63, max_open=True,
                        why="torch.Generator takes 64 bits")
    step: int | None = setting(None, "The checkpoint of this step [the newest].")
    shards: str | None = setting(None, "The run's build where it is now (its --out or URL), "
                                 "when it was moved: the prompt is encoded with its tokenizer, "
                                 "held to the one the run trained with [where the run read it].",
                                 metavar="BUILD", path=True)

    def __post_init__(self):
        check(self)
