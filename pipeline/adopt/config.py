"""The settings of one `pack import`, validated once; its flags are these fields
(longpack/core/settings.py). Loads no numpy: `pack --help` reads it."""

from dataclasses import dataclass

from longpack.core import check, setting
from longpack.pipeline.formats import FORMATS, get_format

# the element types a nanoGPT-style .bin may hold (little-endian)
BIN_DTYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")


@dataclass(frozen=True)
class ImportConfig:
    """The settings of one `pack import`; each field is also its flag (longpack/core/settings.py)."""

    src: str = setting(argument=True, role="output", path=True)
    out: str = setting(help="Output directory.", role="run", path=True)
    seq: int | None = setting(None, "Tokens per row (.bin and a .npz's 1-D streams: required; "
                              ".npy/.pt/.npz arrays: their width) "
                              "[the files'].", min=2, role="output")
    dtype: str | None = setting(None, ".bin: the token type, uint8 to uint64 or int8 to int64 "
                                "(nanoGPT's GPT-2: uint16).", choices=BIN_DTYPES, role="output")
    eos_id: int | None = setting(None, "Documents end at this id (their starts are recorded) "
                                 "[rows are documents].", min=0, role="output")
    tokenizer: str | None = setting(None, "The tokenizer the ids are of, recorded (and its "
                                    "vocabulary checked) [the largest id + 1].", role="output",
                                    path=True)
    format: str = setting("mds", choices=FORMATS, role="output")
    shard_bytes: int = setting(64 << 20, min=1, role="output")
    overwrite: bool = setting(False, "Replace an existing build in --out.", switch=True,
                              show_default=False, role="once")
    val_fraction: float = setting(0.0, "A source without a val split (no val.bin, val/): this "
                                  "fraction of its documents (rows, without --eos-id) to val, "
                                  "by stable hash, as pack build does.", min=0, max=1,
                                  max_open=True, role="output")
    seed: int = setting(0, "Seed of --val-fraction's split.", role="output")

    def __post_init__(self):
        check(self)  # each field's type, range and choices, as declared above
        get_format(self.format)  # unknown: one line listing the formats
