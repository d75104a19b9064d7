"""The settings of one `pack build`, validated once, recorded in the manifest."""

import os
from dataclasses import dataclass

from longpack.core import SettingsError, check, is_url, refuse_unwritable, setting, settings_of
from longpack.pipeline.formats import FORMATS
from longpack.pipeline.read.catalog import DATASETS

SHARD_BYTES = 1 << 26  # a shard holds as many rows as fit in 64 MiB of tokens (MDS's default size)
WORK_DIR = ".longpack-build"  # OUT/WORK_DIR exists only while a build is unfinished
SPLITS = ("train", "val")  # OUT/train, OUT/val
TOKENIZER_ENGINES = ("auto", "fast", "reference")  # pipeline/tokenize/engines.py
LAST_ROW_POLICIES = ("pad", "drop")
PACKINGS = ("concat", "best-fit")  # pipeline/pack/packer.py, pipeline/pack/best_fit.py
# what a record of a build's settings without `packing` means: builds made before --packing, and
# concat builds since (BuildConfig.settings_of leaves concat out), not the default
PACKING_UNSET = "concat"
ON_ERROR = ("skip", "fail")
# Upper bounds no real build reaches, so that a typo is one line rather than an OverflowError
# (--tasks 10**30 sizes a list per task) or a number other readers cannot take.
MAX_COUNT = 2**62  # tokens, documents: past any corpus; the manifest's readers take int64
MAX_TASKS = 2**20  # the plan lists every task's share; far past any cluster's job array
MAX_THREADS = 2**16  # far past any machine's cores (the default is this one's)
MAX_SHARD_BYTES = 2**40  # 1 TiB of tokens in one file: far past any useful shard


@dataclass(frozen=True)
class BuildConfig:
    """The settings of one build; each field is also a `pack build` flag (longpack/core/settings.py)."""

    out: str = setting(help="Output directory (OUT/train, OUT/val, OUT/manifest.json), or a "
                       "store's URL: s3://BUCKET/PREFIX, gs://... (docs/SCALE.md).",
                       metavar="DIR|URL", role="run", path=True)
    dataset: str = setting("fineweb-edu", "Named dataset: text field, file patterns, hub "
                           "location.", choices=DATASETS, role="output")
    inputs: tuple[str, ...] = setting((), "File, directory or glob (repeatable). Without it the "
                                      "dataset is fetched from the Hugging Face hub (a -sample "
                                      "dataset: its files shipped with longpack).",
                                      flag="--input", multiple=True, metavar="PATH", role="run",
                                      path=True)
    subset: str | None = setting(None, "Hub subset, e.g. sample-10BT (the default), "
                                 "sample-100BT, CC-MAIN-2024-10.", role="output")
    text_field: str | None = setting(None, "Field/column with the text [dataset's: text].",
                                     role="output")
    tokenizer: str = setting("gpt2", "tiktoken name (gpt2, r50k_base, cl100k_base, o200k_base), "
                             "a .tiktoken ranks file, or a Hugging Face tokenizer.json.",
                             role="output", path=True)
    tokenizer_engine: str = setting(
        "auto", "What encodes: fast (fastokens), reference (tiktoken / tokenizers) or auto (fast "
        "where it loads and agrees). The output is the same.", choices=TOKENIZER_ENGINES,
        role="recorded")
    seq: int = setting(32768, "Tokens per row. MDS: at most what keeps one row below 4 GiB even "
                       "when every token is a document (about 268 million); memmap: at most "
                       "2**32 (document starts are uint32).", min=2, role="output")
    format: str = setting("mds", "mds (mosaicml-streaming shards) or memmap (.npy arrays).",
                          choices=FORMATS, role="output")
    workers: int = setting(help="Tokenizer threads (the output does not depend on it).",
                           factory=lambda: min(os.cpu_count() or 1, MAX_THREADS),
                           show_default="all cores", min=1, max=MAX_THREADS, role="recorded")
    val_fraction: float = setting(0.0005, "Fraction of documents (by stable hash) in the "
                                  "validation split.", min=0, max=1, max_open=True,
                                  role="output")
    seed: int = setting(0, "Seed of the train/validation split.", role="output")
    max_tokens: int | None = setting(None, "Stop after the document at which the token count "
                                     "reaches N.", min=1, max=MAX_COUNT, role="output")
    limit_docs: int | None = setting(None, "Stop after N documents.", min=1, max=MAX_COUNT,
                                     role="output")
    compression: str | None = setting(None, "zstd, zstd:LEVEL (1-22) or none [mds: zstd; "
                                      "memmap: none].", role="output")
    on_error: str = setting("skip", "Bad input: count and log it (skip), or stop (fail).",
                            choices=ON_ERROR, role="recorded")
    bos: bool = setting(False, "Start every document with the tokenizer's BOS token (EOS "
                        "always ends it).", role="output")
    last_row: str = setting("pad", "Final partial row of each split: pad it (with EOS, marked "
                            "as padding) or drop it.", choices=LAST_ROW_POLICIES, role="output")
    packing: str = setting("best-fit", "How documents fill rows: best-fit (a document that "
                           "fits a row is never split; rows end in padding) or concat (end to "
                           "end, cut every --seq tokens): docs/FORMAT.md.", choices=PACKINGS,
                           role="output")
    shard_bytes: int = setting(SHARD_BYTES, "Token bytes per shard (rows per shard = "
                               "shard_bytes // row bytes, at least 1). MDS: at most what keeps "
                               "a shard below 4 GiB even when every token is a document "
                               "(~610 MB).", min=1, max=MAX_SHARD_BYTES, role="output")
    overwrite: bool = setting(False, "Replace an existing build in --out.", switch=True,
                              show_default=False, role="once")
    tasks: int | None = setting(None, "Split the build into N tasks (machines, processes), "
                                "merged into the same bytes as one build: docs/SCALE.md "
                                "[LONGPACK_TASK_COUNT, SLURM_ARRAY_TASK_COUNT, or 1].",
                                metavar="N", min=1, max=MAX_TASKS, role="run")
    task_index: int | None = setting(None, "The task this process runs, 0 to N-1 "
                                     "[LONGPACK_TASK_INDEX, SLURM_ARRAY_TASK_ID - "
                                     "SLURM_ARRAY_TASK_MIN, or every task in turn].", metavar="I",
                                     role="once")
    staging: str | None = setting(None, "--out URL: the local folder where shards wait for "
                                  "their upload, a few at a time [~/.cache/longpack/staging].",
                                  metavar="DIR", role="run", path=True)

    def __post_init__(self):
        check(self)  # each field's type, range and choices, as declared above
        if is_url(self.out):
            refuse_unwritable(self.out, "pack build")
        elif self.staging is not None:
            raise SettingsError("--staging is for an --out URL (s3://...): a local --out is "
                                "written in place")
        if self.text_field is not None and not self.text_field.strip():
            raise SettingsError("--text-field must name a field or column (got an empty name)")
        if os.path.isfile(self.out):
            raise SettingsError(f"--out {self.out} is a file; choose a directory (new or empty, "
                                "or a build's)")
        if os.path.islink(self.out) and not os.path.exists(self.out):
            raise SettingsError(f"--out {self.out} is a link to {os.readlink(self.out)}, which "
                                "does not exist; remove the link or create its folder")
        if self.tasks is None:  # not given (the command line reads the environment's: cli.py)
            object.__setattr__(self, "tasks", 1)
        if self.task_index is not None and not 0 <= self.task_index < self.tasks:
            raise SettingsError(f"--task-index {self.task_index} is not a task of --tasks "
                                f"{self.tasks} (0 to {self.tasks - 1})")
        if self.packing == "best-fit" and self.last_row == "drop":
            raise SettingsError("--last-row drop drops the one partial row of --packing concat, "
                                "while under --packing best-fit (the default) any row may end "
                                "in padding: add --packing concat, or leave --last-row at pad")
        if self.tasks > 1 and (self.max_tokens or self.limit_docs):
            raise SettingsError("--max-tokens and --limit-docs cut the document order at one "
                                "point, which tasks cannot see: build that subset without --tasks")
        from longpack.pipeline.formats import (
            get_format,  # numpy: loaded by a build, not by `pack --help`
        )

        fmt = get_format(self.format)
        if self.compression is None:
            object.__setattr__(self, "compression", fmt.default_compression)
        algo, _, level = self.compression.partition(":")
        if not (self.compression == "none" or algo == "zstd" and (
                not level or level.isdigit() and 1 <= int(level) <= 22)):
            raise SettingsError(f"--compression {self.compression}: use zstd, zstd:LEVEL "
                                "(1-22) or none")
        fmt.check_settings(self.seq, self.shard_bytes, self.shard_compression())

    def shard_compression(self) -> str | None:
        """--compression as the shard formats take it: None for none."""
        return None if self.compression == "none" else self.compression

    def shard_rows(self, itemsize: int) -> int:
        from longpack.pipeline.formats.base import rows_per_shard

        return rows_per_shard(self.shard_bytes, self.seq, itemsize)

    def output_settings(self) -> dict:
        """The settings that determine the output bytes (inputs are fingerprinted separately)."""
        return self.settings_of("output")

    def settings_of(self, *roles: str) -> dict:
        """settings_of(self, *roles), without --packing when it is concat: a concat build's
        fingerprint and manifest stay those of the builds made before --packing (all concat),
        which then resume, compare and train as before. A manifest, fingerprint or tasks.json
        without `packing` is therefore concat's, whatever the default (PACKING_UNSET)."""
        found = settings_of(self, *roles)
        if found.get("packing") == "concat":
            del found["packing"]
        return found
