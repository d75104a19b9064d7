"""longpack's data stage: documents in, packed fixed-length token rows out.

    --input / hub   read/ inputs, hub          which files (read/catalog: each dataset's
                                               patterns), in which order
      |  read/ parquet, jsonl                  records: text, or a counted Skip (read/records)
      v
    read/batches     batches of texts from one file (the unit of work and of resumption)
      |  tokenize/encode (worker threads)      hash + split (tokenize/split), tokens + EOS
      v                                        (tokenize/tokenizer: fastokens or the reference)
    pack/output      the build's Output: each split's documents to
      |  pack/packer, pack/best_fit            rows of exactly --seq tokens + segments (pure;
      |                                        --packing best-fit, the default: whole documents;
      |                                        or concat)
      |  pack/writers (a writer thread)        write-ahead partial files -> whole shards
      v
    formats/         one class per shard format (formats/base: what each owns), one registry
                     (formats/__init__): mds (bytes: mds_write), memmap, npy
    manifest.py      OUT/manifest.json, written last

build.py runs the arrows into the Output it is given (pack/output's ShardOutput,
store/remote_build's UploadOutput, a task's TaskOutput in distribute/task_build), which
checkpoints its BuildState (build_state.py); the output holds its folder's lock (store/lock:
one writer) and touches only files it can prove it wrote (store/output_dir). cli.py is the
`pack` command, config.py its settings.

The sub-packages, by role:
    read/        input files and their records          tokenize/   tokenizers, hashing, split,
                                                                    the build's own copy (kept)
    pack/        the packer and the shard writers       formats/    shard formats, read back
    store/       output folder, lock, staging, upload   stats/      `pack stats`
    distribute/  tasks, merge, Ray, Slurm, launch       adopt/      `pack import`
    builds/      a finished build read back at random (the trainer's rows, checked, cached)
A build split into tasks (`--tasks N`; docs/SCALE.md) runs the same arrows per task over its
share of the inputs and writes its documents; the merge cuts the same rows with the same packer
and makes OUT the single build's bytes (distribute/; distribute/work_folder: what the tasks
record, checked). An --out URL stages the build locally and uploads each finished shard
(store/remote_build, store/uploader). The kernel both stages share
(errors, settings, atomic writes, the object store) is `longpack.core`.
docs/FORMAT.md is the single source of truth for the on-disk format.

What the rest of longpack (the trainer) uses of the data stage is the names below, and only
those: `from longpack.pipeline import get_format, SplitReader, ...`. They load on first use,
so that `import longpack.pipeline` stays cheap (`pack --help`, the trainer's start) and pulls
in neither torch nor mosaicml-streaming.
"""

from longpack.core import lazy_names

_API = {  # name -> the module that defines it
    "PAD_HASH": "tokenize.split",  # a segment's hash that marks padding
    "get_format": "formats", "open_format": "formats",  # shard formats: a name's, a split's
    "ShardError": "formats.base",  # a shard or index that cannot be used, naming its file
    "SplitReader": "formats.shards",  # the rows and segments of a split, any format
    "import_streaming": "formats.streaming_compat",  # the one way to import mosaicml-streaming
    "load_tokenizer": "tokenize.tokenizer",  # the build's tokenizer (zoo: export, generate)
    "same_tokenizer": "manifest", "tokenizer_label": "manifest",  # do two builds' ids agree
    "manifest_lacks": "manifest",  # what a manifest.json lacks that its readers rely on
    "parse_mixture": "mixture", "natural_weights": "mixture",  # train on several builds
    "source_name": "mixture", "good_name": "mixture",  # a source's name: given or its folder's
    "REPEAT_WARNING_EPOCHS": "mixture",  # repeats worth less past it
    "open_build": "builds.reader", "Build": "builds.reader",  # a finished build, read back
    "read_manifest": "builds.reader", "dataset_fingerprint": "builds.reader",
    "cache_bytes": "builds.reader",  # --cache-limit's sizes (20gb) in bytes
    "other_tokenizer": "builds.identity",  # a build of another tokenizer than recorded: why
    "copy_problem": "builds.identity", "copy_fix": "builds.identity",  # its copy, damaged
    "fetch_kept": "tokenize.kept", "load_build_tokenizer": "tokenize.kept",  # the build's copy
    "DATASETS": "read.catalog",  # the datasets --dataset names
    "at_vocab": "stats.recommend", "preset_table": "stats.recommend",  # presets.json's sizes
    # the commands' settings and work, for longpack's Python API (longpack/api.py)
    "BuildConfig": "config", "LaunchConfig": "distribute.launch", "launch": "distribute.launch",
    "Destination": "store.destination", "merge_tasks": "distribute.tasks:merge",
    "ImportConfig": "adopt.config", "import_tokens": "adopt.import_tokens",
    "StatsConfig": "stats.config", "collect_stats": "stats.report:collect",
}
__all__ = sorted(_API)
__getattr__ = lazy_names(__name__, _API)
