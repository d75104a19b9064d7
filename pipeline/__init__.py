"""longpack's data stage: documents in, packed fixed-length token rows out.

    --input / hub   catalog.py, hub.py        which files, in which order
      |  read_parquet.py, read_jsonl.py       records: text, or a counted Skip (records.py)
      v
    inputs.py       batches of texts from one file (the unit of work and of resumption)
      |  encode.py (worker threads)           hash + split (split.py), tokens + EOS (tokenizer.py:
      v                                       fastokens or the reference, tokenizer_engines.py)
    pack.py         rows of exactly --seq tokens + per-row document segments (pure)
      |  writers.py (a writer thread)         write-ahead partial files -> whole shards
      v
    formats.py -> format_mds.py (bytes: write_mds.py) / format_memmap.py / format_npy.py
                                              OUT/{train,val}/ shards + index.json, one class
                                              per format (shard_format.py: what each owns)
    manifest.py                               OUT/manifest.json, written last

build.py runs the arrows and checkpoints its BuildState (build_state.py), holding OUT's lock
(output_lock.py: one writer) and touching only files it can prove it wrote (output_dir.py);
cli.py is the `pack` command, launch.py picks where a build runs.

A build split into tasks (`--tasks N`, tasks.py; docs/SCALE.md) runs the same arrows per task
over its share of the inputs (task_plan.py), stopping before pack.py: task_build.py writes the
task's documents (task_stream.py). Then task_layout.py + task_merge.py cut the same rows with the
same packer once the tasks before are counted, and the merge makes OUT the single build's bytes.
engine_ray.py and engine_slurm.py (slurm_wait.py) run the tasks on a cluster.

An --out URL (s3://, gs://, ...): remote_build.py stages the build in a local folder and
uploader.py sends each finished shard up in the background, the manifest last; every URL of
longpack (inputs, outputs, the trainer's checkpoints) goes through storage.py (fsspec).
`pack import` (import_tokens.py; its readers import_readers.py, its splits import_splits.py)
writes others' token rows as a build through the same format classes. `pack stats` reads builds
back through them: shards.py, stats.py, stats_report.py, stats_files.py, recommend.py (several
builds: stats_mix.py).
docs/FORMAT.md is the single source of truth for the on-disk format.

What the rest of longpack (the trainer) uses of the data stage is the names below, and only
those: `from pipeline import DataError, get_format, ...`. They load on first use, so that
`import pipeline` stays cheap (`pack --help`, the trainer's start) and pulls in neither torch
nor mosaicml-streaming.
"""

import importlib

_API = {  # name -> the module that defines it
    "LongpackError": "errors", "SettingsError": "errors", "DataError": "errors",
    "TrainingError": "errors", "LoaderError": "errors",
    "setting": "settings", "click_options": "settings",  # settings declared once, both CLIs
    "write_bytes": "atomic", "sha256_file": "atomic",  # atomic writes, file checksums
    "PAD_HASH": "split",  # a segment's hash that marks padding
    "get_format": "formats", "MdsFormat": "format_mds",  # shard formats
    "SplitReader": "shards",  # the rows and segments of a split, any format
    "import_streaming": "streaming_compat",  # the one way to import mosaicml-streaming
    "clear_stale_locks": "streaming_compat",  # mosaicml-streaming's lock files of gone datasets
    "StorageError": "errors", "Store": "storage", "is_url": "storage",  # object stores
    "staging_folder": "storage", "redact": "storage", "refuse_unwritable": "storage",
    "load_tokenizer": "tokenizer",  # the build's tokenizer (zoo: export, generate)
    "same_tokenizer": "manifest", "tokenizer_label": "manifest",  # do two builds' ids agree
    "parse_mixture": "mixture", "natural_weights": "mixture",  # train on several builds
    "source_name": "mixture", "good_name": "mixture",  # a source's name: given or its folder's
    "REPEAT_WARNING_EPOCHS": "mixture",  # repeats worth less past it
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.{_API[name]}"), name)

