"""The settings of one `pack build`, validated once, recorded in the manifest."""

import os
from dataclasses import asdict, dataclass, field

from pipeline.errors import SettingsError

SHARD_BYTES = 1 << 26  # a shard holds as many rows as fit in 64 MiB of tokens (MDS's default size)
WORK_DIR = ".longpack-build"  # OUT/WORK_DIR exists only while a build is unfinished
SPLITS = ("train", "val")  # OUT/train, OUT/val
FORMATS = ("mds", "memmap")
TOKENIZER_ENGINES = ("auto", "fast", "reference")  # pipeline/tokenizer_engines.py
LAST_ROW_POLICIES = ("pad", "drop")


@dataclass(frozen=True)
class BuildConfig:
    out: str
    """Output directory: OUT/train, OUT/val, OUT/manifest.json."""
    dataset: str = "fineweb-edu"
    """Named dataset: sets the text field, file patterns and hub location."""
    inputs: tuple[str, ...] = ()
    """Files, directories or globs; empty means fetch the named dataset from the hub."""
    subset: str | None = None
    """Hub subset when fetching (FineWeb-Edu: sample-10BT, sample-100BT, CC-MAIN-2024-10, ...)."""
    text_field: str | None = None
    """Field/column holding the document text; None takes the dataset's."""
    tokenizer: str = "gpt2"
    """tiktoken name, .tiktoken ranks file, or Hugging Face tokenizer.json."""
    tokenizer_engine: str = "auto"
    """fast (fastokens), reference (tiktoken / tokenizers) or auto (fast where it loads and agrees
    with the reference); the output bytes are the same whichever."""
    seq: int = 32768
    """Tokens per row. MDS: at most what keeps one row below 4 GiB even when every token is a
    document (about 268 million); memmap: at most 2**32 (document starts are uint32)."""
    format: str = "mds"
    """mds (mosaicml-streaming shards) or memmap (.npy arrays)."""
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Tokenizer threads; output does not depend on it."""
    val_fraction: float = 0.0005
    """Expected fraction of documents in the validation split."""
    seed: int = 0
    """Seed of the train/validation split."""
    max_tokens: int | None = None
    """Stop after the document at which the total token count reaches this."""
    limit_docs: int | None = None
    """Stop after this many documents are packed."""
    compression: str | None = None
    """zstd, zstd:LEVEL (1-22) or none; None takes the format's default (MDS: zstd, memmap: none)."""
    on_error: str = "skip"
    """skip: count and log bad input; fail: stop at the first bad document."""
    bos: bool = False
    """Start each document with the tokenizer's BOS token (EOS always ends it)."""
    last_row: str = "pad"
    """Final partial row of each split: pad (with EOS, marked as padding) or drop."""
    shard_bytes: int = SHARD_BYTES
    """Token bytes per shard (rows per shard = shard_bytes // row bytes, at least 1). MDS: at
    most what keeps a shard below 4 GiB even when every token is a document (~610 MB)."""
    overwrite: bool = False
    """Replace an existing build in `out` instead of refusing."""

    def __post_init__(self):
        if self.seq < 2:
            raise SettingsError(f"--seq must be at least 2 (got {self.seq})")
        if self.format not in FORMATS:
            raise SettingsError(f"--format must be one of {', '.join(FORMATS)}")
        if self.tokenizer_engine not in TOKENIZER_ENGINES:
            raise SettingsError(f"--tokenizer-engine must be one of {', '.join(TOKENIZER_ENGINES)}")
        if self.workers < 1:
            raise SettingsError(f"--workers must be at least 1 (got {self.workers})")
        if not 0.0 <= self.val_fraction < 1.0:
            raise SettingsError(f"--val-fraction must be in [0, 1) (got {self.val_fraction})")
        for flag, value in (("--max-tokens", self.max_tokens), ("--limit-docs", self.limit_docs)):
            if value is not None and value < 1:
                raise SettingsError(f"{flag} must be positive (got {value})")
        if self.shard_bytes < 1:
            raise SettingsError(f"--shard-bytes must be positive (got {self.shard_bytes})")
        if self.on_error not in ("skip", "fail"):
            raise SettingsError("--on-error must be skip or fail")
        if self.last_row not in LAST_ROW_POLICIES:
            raise SettingsError(f"--last-row must be one of {', '.join(LAST_ROW_POLICIES)}")
        if self.compression is None:
            object.__setattr__(self, "compression", "zstd" if self.format == "mds" else "none")
        algo, _, level = self.compression.partition(":")
        if not (self.compression == "none" or algo == "zstd" and (
                not level or level.isdigit() and 1 <= int(level) <= 22)):
            raise SettingsError(f"--compression {self.compression}: use zstd, zstd:LEVEL "
                                "(1-22) or none")
        if self.format == "memmap" and self.compression != "none":
            raise SettingsError("memmap shards are uncompressed .npy files: drop --compression "
                                "(or use --format mds)")
        self._check_offsets()

    def _check_offsets(self):
        """Refuse up front a --seq or --shard-bytes whose shards no reader could open. MDS
        stores sample positions as u32 (write_mds.MAX_SHARD_BYTES), and a row of one-token
        documents carries a segment per token (12 bytes more per token): a shard must fit
        even then. The tokenizer, which picks 2- or 4-byte tokens, is not loaded yet, so both
        are checked. Memmap shards have no offsets; only doc_starts (uint32) bound --seq."""
        if self.format == "memmap":
            if self.seq > 1 << 32:
                raise SettingsError(f"--seq {self.seq:,} is too long: document starts are uint32, "
                                    f"so the largest --seq is {1 << 32:,}")
            return
        from pipeline import write_mds  # numpy: loaded by a build anyway, not by `pack --help`

        compression = None if self.compression == "none" else self.compression
        limit = write_mds.MAX_SHARD_BYTES

        def largest(seq: int, itemsize: int, rows: int, size_limit: int) -> int:
            config = write_mds.shard_config(seq, f"uint{8 * itemsize}", compression, size_limit)
            return write_mds.max_raw_shard_bytes(seq, itemsize, rows, config)

        if largest(self.seq, 4, 1, self.shard_bytes) > limit:
            lo, hi = 2, self.seq  # the longest row that fits a shard alone, by bisection
            while lo < hi:
                mid = (lo + hi + 1) // 2
                fits = largest(mid, 4, 1, self.shard_bytes) <= limit
                lo, hi = (mid, hi) if fits else (lo, mid - 1)
            raise SettingsError(f"--seq {self.seq:,} is too long for MDS: a shard's sample "
                                "offsets are 32-bit and one such row may take "
                                f"{largest(self.seq, 4, 1, self.shard_bytes):,} bytes; the "
                                f"largest --seq is {lo:,} (or use --format memmap)")
        if any(largest(self.seq, i, self.shard_rows(i), self.shard_bytes) > limit for i in (2, 4)):
            def most_bytes(itemsize: int, size_limit: int) -> int:
                head = largest(self.seq, itemsize, 0, size_limit)
                rows = (limit - head) // (write_mds.max_sample_bytes(self.seq, itemsize) + 4)
                return (rows + 1) * self.seq * itemsize - 1

            most = self.shard_bytes  # the config records the value itself: settle its length
            for _ in range(3):
                most = min(most_bytes(i, most) for i in (2, 4))
            raise SettingsError(f"--shard-bytes {self.shard_bytes:,} is too large for MDS with "
                                f"--seq {self.seq:,}: a shard's sample offsets are 32-bit; the "
                                f"largest --shard-bytes is {most:,}")

    def shard_rows(self, itemsize: int) -> int:
        return max(1, self.shard_bytes // (self.seq * itemsize))

    def output_settings(self) -> dict:
        """The settings that determine the output bytes (inputs are fingerprinted separately)."""
        d = asdict(self)
        for k in ("out", "workers", "on_error", "overwrite", "inputs", "tokenizer_engine"):
            d.pop(k)
        return d
